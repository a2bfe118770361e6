// Communicator (communicator.h): point to point. Isend/Irecv post on the messenger
// (or, to and from this rank itself, match in the loopback queues); Wait, WaitAll
// and Request drive them to completion.
#include <cstring>
#include <vector>

#include "comm/communicator.h"

namespace tessera::comm {

void Request::ForgetSelfReceive() {
  if (comm_ != nullptr && recv_ && !recv_->done && recv_->peer == comm_->rank_) {
    std::erase(comm_->self_recvs_, recv_.get());
  }
}

Status Request::Wait() {
  if (comm_ == nullptr) return InvalidArgumentError("Wait on an empty request");
  return comm_->Wait(*this);
}

Result<bool> Request::Test() {
  if (comm_ == nullptr) return InvalidArgumentError("Test on an empty request");
  Op* op = send_ ? static_cast<Op*>(send_.get()) : static_cast<Op*>(recv_.get());
  Op* ops[] = {op};
  return comm_->messenger_->Test(ops);
}

Result<Request> Communicator::Isend(const void* data, size_t bytes, int peer, int tag) {
  TESSERA_RETURN_IF_ERROR(CheckPeer(peer, "send"));
  if (tag < 0) return InvalidArgumentError("send: tags must be >= 0");
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kSend));
  Request request;
  request.comm_ = this;
  request.send_ = std::make_unique<SendOp>(peer, tag, data, bytes);
  if (peer == rank_) {
    TESSERA_RETURN_IF_ERROR(SendToSelf(request.send_.get()));
    return request;
  }
  messenger_->PostSend(request.send_.get());
  return request;
}

Result<Request> Communicator::Irecv(void* data, size_t bytes, int peer, int tag) {
  TESSERA_RETURN_IF_ERROR(CheckPeer(peer, "recv"));
  if (tag < 0) return InvalidArgumentError("recv: tags must be >= 0");
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kRecv));
  Request request;
  request.comm_ = this;
  request.recv_ = std::make_unique<RecvOp>(peer, tag, data, bytes);
  if (peer == rank_) {
    TESSERA_RETURN_IF_ERROR(ReceiveFromSelf(request.recv_.get()));
    return request;
  }
  messenger_->PostRecv(request.recv_.get());
  return request;
}

Status Communicator::SendToSelf(SendOp* op) {
  op->primitive = Primitive::kSend;
  op->done = true;
  mutable_ledger().mutable_entry(Primitive::kSend).bytes_sent += op->bytes;
  for (auto it = self_recvs_.begin(); it != self_recvs_.end(); ++it) {
    RecvOp* recv = *it;
    if (recv->tag != op->tag) continue;
    self_recvs_.erase(it);
    if (op->bytes > recv->capacity) {
      return Fail(InvalidArgumentError("recv from itself: a " + std::to_string(op->bytes) +
                                       "-byte message for a " + std::to_string(recv->capacity) +
                                       "-byte receive (tag " + std::to_string(op->tag) + ")"));
    }
    if (op->bytes > 0) std::memcpy(recv->data, op->data, op->bytes);
    recv->received = op->bytes;
    recv->done = true;
    mutable_ledger().mutable_entry(Primitive::kRecv).bytes_received += op->bytes;
    return Status::Ok();
  }
  const uint8_t* bytes = static_cast<const uint8_t*>(op->data);
  self_messages_.push_back({op->tag, std::vector<uint8_t>(bytes, bytes + op->bytes)});
  return Status::Ok();
}

Status Communicator::ReceiveFromSelf(RecvOp* op) {
  op->primitive = Primitive::kRecv;
  for (auto it = self_messages_.begin(); it != self_messages_.end(); ++it) {
    if (it->tag != op->tag) continue;
    if (it->bytes.size() > op->capacity) {
      return Fail(InvalidArgumentError("recv from itself: a " + std::to_string(it->bytes.size()) +
                                       "-byte message for a " + std::to_string(op->capacity) +
                                       "-byte receive (tag " + std::to_string(op->tag) + ")"));
    }
    if (!it->bytes.empty()) std::memcpy(op->data, it->bytes.data(), it->bytes.size());
    op->received = it->bytes.size();
    op->done = true;
    mutable_ledger().mutable_entry(Primitive::kRecv).bytes_received += op->received;
    self_messages_.erase(it);
    return Status::Ok();
  }
  self_recvs_.push_back(op);
  return Status::Ok();
}

Status Communicator::Wait(Request& request) {
  if (request.comm_ != this) return InvalidArgumentError("request of another communicator");
  Op* op =
      request.send_ ? static_cast<Op*>(request.send_.get()) : static_cast<Op*>(request.recv_.get());
  if (op->done) return Status::Ok();
  if (request.recv_ && request.recv_->peer == rank_) {
    std::erase(self_recvs_, request.recv_.get());
    return InvalidArgumentError("recv from itself (tag " + std::to_string(request.recv_->tag) +
                                "): no send to itself matches it, so it would wait forever");
  }
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(op->primitive, /*count_call=*/false));
  return messenger_->WaitAll({op});
}

Status Communicator::WaitAll(std::span<Request> requests) {
  std::vector<Op*> ops;
  for (Request& request : requests) {
    if (request.comm_ != this) return InvalidArgumentError("request of another communicator");
    if (request.recv_ && request.recv_->peer == rank_ && !request.recv_->done) {
      return Wait(request);  // an unmatched receive from itself: the error above
    }
    ops.push_back(request.send_ ? static_cast<Op*>(request.send_.get())
                                : static_cast<Op*>(request.recv_.get()));
  }
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kRecv, /*count_call=*/false));
  return messenger_->WaitAll(ops);
}

Status Communicator::Send(const void* data, size_t bytes, int peer, int tag) {
  TESSERA_ASSIGN_OR_RETURN(Request request, Isend(data, bytes, peer, tag));
  return Wait(request);
}

Status Communicator::Recv(void* data, size_t bytes, int peer, int tag, size_t* received_bytes) {
  TESSERA_ASSIGN_OR_RETURN(Request request, Irecv(data, bytes, peer, tag));
  TESSERA_RETURN_IF_ERROR(Wait(request));
  if (received_bytes != nullptr) *received_bytes = request.received_bytes();
  return Status::Ok();
}

}  // namespace tessera::comm
