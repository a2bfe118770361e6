// TcpStore: the TCP rendezvous. TcpStoreServer holds the keys (run by rank 0, by
// `tessera launch` on node 0, or standalone); TcpStore is a client. Every
// connection first passes the cluster-token challenge (auth.h): a process without
// the token can neither read nor write keys. Requests are bounded (key 4 KiB,
// value 64 MiB) and values are read incrementally, so a malicious length cannot
// make the server allocate. Layer: comm. Both classes are thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/unique_fd.h"
#include "comm/net_util.h"
#include "comm/rendezvous/hash_store.h"
#include "comm/rendezvous/store.h"
#include "comm/rendezvous/store_protocol.h"

namespace tessera::comm {

class TcpStoreServer {
 public:
  // Listens on bind_host:port (port 0 = ephemeral) and serves until destroyed.
  static Result<std::unique_ptr<TcpStoreServer>> Start(const std::string& bind_host, int port,
                                                       std::string token);
  ~TcpStoreServer();
  int port() const { return port_; }

 private:
  TcpStoreServer() = default;
  void AcceptLoop();
  void ServeClient(int fd);
  Status HandleRequest(int fd);

  UniqueFd listen_fd_;
  int port_ = 0;
  std::string token_;
  HashStore values_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex clients_mutex_;
  std::vector<std::thread> client_threads_;
  std::vector<int> client_fds_;
};

class TcpStore : public Store {
 public:
  // Connects (retrying until `deadline`) and authenticates with `token`.
  static Result<std::unique_ptr<TcpStore>> Connect(const HostPort& address, std::string token,
                                                   Deadline deadline);

  Status Set(std::string_view key, std::span<const uint8_t> value) override;
  Result<std::vector<uint8_t>> Get(std::string_view key, Deadline deadline) override;
  Result<int64_t> Add(std::string_view key, int64_t delta) override;

  // This host's address as seen on the store connection: a routable address for
  // peers to reach (used by the TCP transport to pick its listen address).
  const std::string& local_host() const { return local_host_; }
  const HostPort& address() const { return address_; }

 private:
  TcpStore() = default;
  Result<std::vector<uint8_t>> Roundtrip(store_protocol::Request request, Deadline deadline);

  std::mutex mutex_;
  UniqueFd fd_;
  HostPort address_;
  std::string local_host_;
};

}  // namespace tessera::comm
