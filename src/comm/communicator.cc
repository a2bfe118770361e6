// Communicator (communicator.h): creation, Split and the small accessors. Joining
// the group (rendezvous, shared memory, the TCP mesh) is in communicator_connect.cc,
// point to point in communicator_point_to_point.cc, the collectives in
// communicator_collectives.cc, AllocateShared in communicator_shared_buffer.cc.
#include "comm/communicator.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/transport/mpi_channel.h"

namespace tessera::comm {

Result<std::unique_ptr<Communicator>> Communicator::Create(std::shared_ptr<Store> store, int rank,
                                                           int size, CommOptions options,
                                                           std::string comm_id) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("bad rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  if (store == nullptr) return InvalidArgumentError("Communicator::Create needs a store");
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->store_ = std::move(store);
  comm->rank_ = rank;
  comm->size_ = size;
  comm->id_ = std::move(comm_id);
  comm->options_ = std::move(options);
  comm->prefix_store_ = std::make_unique<PrefixStore>(
      *comm->store_, "comm/" + comm->options_.job_id + "/" + comm->id_);
  Status connected = comm->Connect(*comm->prefix_store_);
  if (!connected.ok()) {
    return connected.WithContext("rank " + std::to_string(rank) + " joining communicator '" +
                                 comm->id_ + "' of " + std::to_string(size));
  }
  return comm;
}

Communicator::~Communicator() = default;

bool Communicator::UsesMpi(MpiCollective which) const {
  return mpi_group_ != nullptr && (options_.mpi_collectives & which) != 0;
}

Status Communicator::RunOnMpi(const std::function<Status()>& start, uint64_t bytes_sent,
                              uint64_t bytes_received) {
  Status started = start();
  if (!started.ok()) return Fail(std::move(started));
  TESSERA_RETURN_IF_ERROR(messenger_->WaitExternal([this] { return mpi_group_->Test(); }));
  LedgerEntry& entry = messenger_->ledger().mutable_entry(messenger_->current_primitive());
  entry.bytes_sent += bytes_sent;
  entry.bytes_received += bytes_received;
  return Status::Ok();
}

void Communicator::set_timeout_ms(int64_t timeout_ms) {
  options_.timeout_ms = timeout_ms;
  messenger_->set_timeout_ms(timeout_ms);
}

std::string Communicator::TransportTo(int peer) const {
  if (peer < 0 || peer >= size_) return "?";
  return transport_names_[peer];
}

int32_t Communicator::NextTag() {
  return -1 - static_cast<int32_t>(collective_seq_++ & 0x3fffffff);
}

Status Communicator::CheckPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_) {
    return InvalidArgumentError(std::string(what) + ": rank " + std::to_string(peer) +
                                " is outside a communicator of " + std::to_string(size_));
  }
  return Status::Ok();
}

Result<std::unique_ptr<Communicator>> Communicator::Split(int color, int key) {
  const uint32_t seq = split_seq_++;
  const Deadline deadline =
      options_.timeout_ms <= 0 ? Deadline::Never() : Deadline::AfterMs(options_.timeout_ms);
  const std::string base = "split/" + std::to_string(seq) + "/";
  TESSERA_RETURN_IF_ERROR(prefix_store_->SetString(
      base + std::to_string(rank_), std::to_string(color) + " " + std::to_string(key)));
  struct Member {
    int key;
    int rank;
  };
  std::vector<Member> members;
  for (int p = 0; p < size_; ++p) {
    TESSERA_ASSIGN_OR_RETURN(std::string value,
                             prefix_store_->GetString(base + std::to_string(p), deadline));
    int c = 0, k = 0;
    if (std::sscanf(value.c_str(), "%d %d", &c, &k) != 2) {
      return InvalidArgumentError("malformed split record from rank " + std::to_string(p));
    }
    if (c == color && color >= 0) members.push_back(Member{k, p});
  }
  if (color < 0) return std::unique_ptr<Communicator>();
  std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].rank == rank_) new_rank = static_cast<int>(i);
  }
  std::string child = id_ + ".s" + std::to_string(seq) + "c" + std::to_string(color);
  return Create(store_, new_rank, static_cast<int>(members.size()), options_, child);
}

void Communicator::Abort(const std::string& reason) { messenger_->Abort(reason); }

}  // namespace tessera::comm
