#include "comm/rendezvous/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "base/log.h"
#include "comm/rendezvous/auth.h"

namespace tessera::comm {
namespace {

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum Reply : uint8_t { kReplyOk = 0, kReplyDeadline = 1, kReplyInvalid = 2 };

constexpr int64_t kAuthTimeoutMs = 10000;
constexpr int64_t kIoTimeoutMs = 60000;

// Reads `size` bytes into `out`, growing it as the bytes arrive (never by the
// announced size up front).
Status ReadIncrementally(int fd, size_t size, std::vector<uint8_t>* out, Deadline deadline) {
  out->clear();
  uint8_t buf[65536];
  while (out->size() < size) {
    size_t n = std::min(sizeof(buf), size - out->size());
    TESSERA_RETURN_IF_ERROR(ReadFull(fd, buf, n, deadline));
    out->insert(out->end(), buf, buf + n);
  }
  return Status::Ok();
}

void AppendU64(std::vector<uint8_t>* out, uint64_t v) {
  uint8_t b[8];
  std::memcpy(b, &v, 8);
  out->insert(out->end(), b, b + 8);
}

Status SendReply(int fd, Reply code, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out;
  out.push_back(code);
  AppendU64(&out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  return WriteFull(fd, out.data(), out.size(), Deadline::AfterMs(kIoTimeoutMs));
}

Status SendReplyText(int fd, Reply code, const std::string& text) {
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
  Deadline io = Deadline::AfterMs(kIoTimeoutMs);
  uint8_t head[5];
  TESSERA_RETURN_IF_ERROR(ReadFull(fd, head, sizeof(head), io));
  uint32_t key_len = 0;
  std::memcpy(&key_len, head + 1, 4);
  if (key_len > kMaxStoreKeyBytes) {
    (void)SendReplyText(fd, kReplyInvalid, "key too long");
    return InvalidArgumentError("store client sent an oversized key");
  }
  std::string key(key_len, '\0');
  TESSERA_RETURN_IF_ERROR(ReadFull(fd, key.data(), key_len, io));
  switch (head[0]) {
    case kSet: {
      uint64_t len = 0;
      TESSERA_RETURN_IF_ERROR(ReadFull(fd, &len, 8, io));
      if (len > kMaxStoreValueBytes) {
        (void)SendReplyText(fd, kReplyInvalid, "value too large");
        return InvalidArgumentError("store client sent an oversized value");
      }
      std::vector<uint8_t> value;
      TESSERA_RETURN_IF_ERROR(ReadIncrementally(fd, len, &value, io));
      TESSERA_RETURN_IF_ERROR(values_.Set(key, value));
      return SendReply(fd, kReplyOk, {});
    }
    case kGet: {
      int64_t timeout_ms = 0;
      TESSERA_RETURN_IF_ERROR(ReadFull(fd, &timeout_ms, 8, io));
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
      int64_t delta = 0;
      TESSERA_RETURN_IF_ERROR(ReadFull(fd, &delta, 8, io));
      auto sum = values_.Add(key, delta);
      if (!sum.ok()) return SendReplyText(fd, kReplyInvalid, sum.status().message());
      int64_t v = *sum;
      return SendReply(fd, kReplyOk, std::span<const uint8_t>(reinterpret_cast<uint8_t*>(&v), 8));
    }
    default:
      (void)SendReplyText(fd, kReplyInvalid, "unknown command");
      return InvalidArgumentError("store client sent an unknown command");
  }
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

Result<std::vector<uint8_t>> TcpStore::Roundtrip(uint8_t command, std::string_view key,
                                                 std::span<const uint8_t> body, Deadline deadline) {
  if (key.size() > kMaxStoreKeyBytes) return InvalidArgumentError("store key too long");
  std::vector<uint8_t> request;
  request.push_back(command);
  uint32_t key_len = static_cast<uint32_t>(key.size());
  uint8_t b[4];
  std::memcpy(b, &key_len, 4);
  request.insert(request.end(), b, b + 4);
  request.insert(request.end(), key.begin(), key.end());
  request.insert(request.end(), body.begin(), body.end());
  std::lock_guard<std::mutex> lock(mutex_);
  Status sent = WriteFull(fd_.get(), request.data(), request.size(), deadline);
  if (!sent.ok()) return sent.WithContext("rendezvous store " + address_.ToString());
  uint8_t head[9];
  Status got = ReadFull(fd_.get(), head, sizeof(head), deadline);
  if (!got.ok()) return got.WithContext("rendezvous store " + address_.ToString());
  uint64_t len = 0;
  std::memcpy(&len, head + 1, 8);
  if (len > kMaxStoreValueBytes) {
    return InvalidArgumentError("rendezvous store sent an oversized reply");
  }
  std::vector<uint8_t> payload;
  TESSERA_RETURN_IF_ERROR(ReadIncrementally(fd_.get(), len, &payload, deadline));
  if (head[0] == kReplyOk) return payload;
  std::string text(payload.begin(), payload.end());
  if (head[0] == kReplyDeadline) {
    return DeadlineExceededError("store key '" + std::string(key) + "': " + text);
  }
  return InvalidArgumentError("rendezvous store: " + text);
}

Status TcpStore::Set(std::string_view key, std::span<const uint8_t> value) {
  if (value.size() > kMaxStoreValueBytes) return InvalidArgumentError("store value too large");
  std::vector<uint8_t> body;
  AppendU64(&body, value.size());
  body.insert(body.end(), value.begin(), value.end());
  auto reply = Roundtrip(kSet, key, body, Deadline::AfterMs(kIoTimeoutMs));
  return reply.status();
}

Result<std::vector<uint8_t>> TcpStore::Get(std::string_view key, Deadline deadline) {
  int64_t timeout_ms = -1;
  if (!deadline.never()) {
    timeout_ms = std::max<int64_t>(deadline.RemainingMsForPoll(), 0);
  }
  std::vector<uint8_t> body;
  AppendU64(&body, static_cast<uint64_t>(timeout_ms));
  // The reply may take until the deadline; allow a little more for the network.
  Deadline io =
      deadline.never() ? Deadline::Never() : Deadline(deadline.when() + std::chrono::seconds(10));
  return Roundtrip(kGet, key, body, io);
}

Result<int64_t> TcpStore::Add(std::string_view key, int64_t delta) {
  std::vector<uint8_t> body;
  AppendU64(&body, static_cast<uint64_t>(delta));
  TESSERA_ASSIGN_OR_RETURN(auto reply, Roundtrip(kAdd, key, body, Deadline::AfterMs(kIoTimeoutMs)));
  if (reply.size() != 8) return InvalidArgumentError("rendezvous store: malformed add reply");
  int64_t sum = 0;
  std::memcpy(&sum, reply.data(), 8);
  return sum;
}

}  // namespace tessera::comm
