// Socket helpers with deadlines for the store and the TCP transport: listen,
// connect (retrying while the peer is not up yet), accept, and full reads/writes
// that never block past a Deadline. Layer: comm. Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace tessera::comm {

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// Parses "host:port" or "[v6addr]:port".
Result<HostPort> ParseHostPort(const std::string& text);

// A nonblocking listening TCP socket on `bind_host` ("" or "0.0.0.0" = any) and
// `port` (0 = ephemeral). `*bound_port` receives the actual port.
Result<UniqueFd> ListenTcp(const std::string& bind_host, int port, int* bound_port);

// Connects to host:port, retrying refused connections until `deadline` (the peer
// may not listen yet). Returns a nonblocking socket with TCP_NODELAY set.
Result<UniqueFd> ConnectTcp(const HostPort& address, Deadline deadline);

// Accepts one connection (nonblocking, TCP_NODELAY) or fails at the deadline.
Result<UniqueFd> AcceptTcp(int listen_fd, Deadline deadline);

// Writes/reads exactly `size` bytes on a nonblocking socket, polling until the
// deadline. A closed peer is Unavailable; the deadline is DeadlineExceeded.
Status WriteFull(int fd, const void* data, size_t size, Deadline deadline);
Status ReadFull(int fd, void* data, size_t size, Deadline deadline);

void SetNonBlocking(int fd);
void SetNoDelay(int fd);
// "10.0.0.7:29500" for the remote (peer) or local end of a connected socket.
std::string SocketPeerAddress(int fd);
std::string SocketLocalHost(int fd);
// This host's IPv4 addresses, those of interfaces that are up, loopback last.
std::vector<std::string> LocalIpv4Addresses();

}  // namespace tessera::comm
