#include "comm/rendezvous/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "base/log.h"
#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/store_protocol.h"

namespace tessera::comm {
namespace {

using store_protocol::EncodeReply;
using store_protocol::EncodeRequest;
using store_protocol::kAdd;
using store_protocol::kGet;
using store_protocol::kReplyDeadline;
using store_protocol::kReplyInvalid;
using store_protocol::kReplyOk;
using store_protocol::kSet;
using store_protocol::ReadReply;
using store_protocol::ReadRequest;
using store_protocol::ReplyCode;

constexpr int64_t kAuthTimeoutMs = 10000;
constexpr int64_t kIoTimeoutMs = 60000;

store_protocol::ReadExactly FromSocket(int fd, Deadline deadline) {
  return [fd, deadline](void* dst, size_t size) { return ReadFull(fd, dst, size, deadline); };
}

Status SendReply(int fd, ReplyCode code, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out =
      EncodeReply({.code = code, .payload = std::vector<uint8_t>(payload.begin(), payload.end())});
  return WriteFull(fd, out.data(), out.size(), Deadline::AfterMs(kIoTimeoutMs));
}

Status SendReplyText(int fd, ReplyCode code, const std::string& text) {
  return SendReply(
      fd, code,
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& bind_host,
                                                              int port, std::string token) {
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  TESSERA_ASSIGN_OR_RETURN(server->listen_fd_, ListenTcp(bind_host, port, &server->port_));
  server->token_ = std::move(token);
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  stopping_.store(true);
  ::shutdown(listen_fd_.get(), SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(clients_mutex_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(client_threads_);
  }
  for (auto& t : threads) t.join();
  std::lock_guard<std::mutex> lock(clients_mutex_);
  for (int fd : client_fds_) ::close(fd);
  client_fds_.clear();
}

void TcpStoreServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, 100);
    if (rc <= 0) continue;
    auto accepted = AcceptTcp(listen_fd_.get(), Deadline::AfterMs(0));
    if (!accepted.ok()) continue;
    int fd = accepted->Release();
    std::lock_guard<std::mutex> lock(clients_mutex_);
    if (stopping_.load()) {
      ::close(fd);
      break;
    }
    client_fds_.push_back(fd);
    client_threads_.emplace_back([this, fd] { ServeClient(fd); });
  }
}

void TcpStoreServer::ServeClient(int fd) {
  Status auth = AuthenticateAsServer(fd, token_, Deadline::AfterMs(kAuthTimeoutMs));
  if (!auth.ok()) {
    TLOG_WARN("store", "refused a client: %s", auth.ToString().c_str());
  } else {
    while (!stopping_.load()) {
      Status s = HandleRequest(fd);
      if (!s.ok()) break;
    }
  }
  std::lock_guard<std::mutex> lock(clients_mutex_);
  ::shutdown(fd, SHUT_RDWR);
  // The fd stays open (and listed) until the destructor so shutdown() never hits a
  // reused descriptor number.
}

Status TcpStoreServer::HandleRequest(int fd) {
  // Wait for a request without a deadline, but wake regularly to notice shutdown.
  while (true) {
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, 200);
    if (stopping_.load()) return AbortedError("store shutting down");
    if (rc > 0) break;
  }
  auto request = ReadRequest(FromSocket(fd, Deadline::AfterMs(kIoTimeoutMs)));
  if (!request.ok()) {
    if (request.status().code() == StatusCode::kInvalidArgument) {
      (void)SendReplyText(fd, kReplyInvalid, request.status().message());
      return request.status().WithContext("store client sent a bad request");
    }
    return request.status();
  }
  const std::string& key = request->key;
  switch (request->command) {
    case kSet:
      TESSERA_RETURN_IF_ERROR(values_.Set(key, request->value));
      return SendReply(fd, kReplyOk, {});
    case kGet: {
      const int64_t timeout_ms = request->number;
      Deadline until = timeout_ms < 0 ? Deadline::Never() : Deadline::AfterMs(timeout_ms);
      while (true) {
        Deadline slice = Deadline::AfterMs(200);
        if (!until.never() && until.when() < slice.when()) slice = until;
        auto value = values_.Get(key, slice);
        if (value.ok()) return SendReply(fd, kReplyOk, *value);
        if (stopping_.load()) return AbortedError("store shutting down");
        if (until.Expired()) return SendReplyText(fd, kReplyDeadline, "key never set");
      }
    }
    case kAdd: {
      auto sum = values_.Add(key, request->number);
      if (!sum.ok()) return SendReplyText(fd, kReplyInvalid, sum.status().message());
      int64_t v = *sum;
      return SendReply(fd, kReplyOk, std::span<const uint8_t>(reinterpret_cast<uint8_t*>(&v), 8));
    }
  }
  return InternalError("unreachable store command");
}

Result<std::unique_ptr<TcpStore>> TcpStore::Connect(const HostPort& address, std::string token,
                                                    Deadline deadline) {
  std::unique_ptr<TcpStore> store(new TcpStore());
  store->address_ = address;
  TESSERA_ASSIGN_OR_RETURN(store->fd_, ConnectTcp(address, deadline));
  Deadline auth_deadline = Deadline::AfterMs(kAuthTimeoutMs);
  Status auth = AuthenticateAsClient(store->fd_.get(), token, auth_deadline);
  if (!auth.ok()) return auth.WithContext("rendezvous store " + address.ToString());
  store->local_host_ = SocketLocalHost(store->fd_.get());
  return store;
}

Result<std::vector<uint8_t>> TcpStore::Roundtrip(store_protocol::Request body, Deadline deadline) {
  const std::string& key = body.key;
  if (key.size() > kMaxStoreKeyBytes) return InvalidArgumentError("store key too long");
  std::vector<uint8_t> request = EncodeRequest(body);
  std::lock_guard<std::mutex> lock(mutex_);
  Status sent = WriteFull(fd_.get(), request.data(), request.size(), deadline);
  if (!sent.ok()) return sent.WithContext("rendezvous store " + address_.ToString());
  auto reply = ReadReply(FromSocket(fd_.get(), deadline));
  if (!reply.ok()) return reply.status().WithContext("rendezvous store " + address_.ToString());
  if (reply->code == kReplyOk) return std::move(reply->payload);
  std::string text(reply->payload.begin(), reply->payload.end());
  if (reply->code == kReplyDeadline) {
    return DeadlineExceededError("store key '" + std::string(key) + "': " + text);
  }
  return InvalidArgumentError("rendezvous store: " + text);
}

Status TcpStore::Set(std::string_view key, std::span<const uint8_t> value) {
  if (value.size() > kMaxStoreValueBytes) return InvalidArgumentError("store value too large");
  auto reply = Roundtrip({.command = kSet,
                          .key = std::string(key),
                          .value = std::vector<uint8_t>(value.begin(), value.end())},
                         Deadline::AfterMs(kIoTimeoutMs));
  return reply.status();
}

Result<std::vector<uint8_t>> TcpStore::Get(std::string_view key, Deadline deadline) {
  int64_t timeout_ms = -1;
  if (!deadline.never()) {
    timeout_ms = std::max<int64_t>(deadline.RemainingMsForPoll(), 0);
  }
  // The reply may take until the deadline; allow a little more for the network.
  Deadline io =
      deadline.never() ? Deadline::Never() : Deadline(deadline.when() + std::chrono::seconds(10));
  return Roundtrip({.command = kGet, .key = std::string(key), .number = timeout_ms}, io);
}

Result<int64_t> TcpStore::Add(std::string_view key, int64_t delta) {
  TESSERA_ASSIGN_OR_RETURN(auto reply,
                           Roundtrip({.command = kAdd, .key = std::string(key), .number = delta},
                                     Deadline::AfterMs(kIoTimeoutMs)));
  if (reply.size() != 8) return InvalidArgumentError("rendezvous store: malformed add reply");
  int64_t sum = 0;
  std::memcpy(&sum, reply.data(), 8);
  return sum;
}

}  // namespace tessera::comm
