#include "comm/net_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

namespace tessera::comm {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

std::string AddressToString(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

Status WaitFd(int fd, short events, Deadline deadline, const char* what) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.RemainingMsForPoll());
    if (rc > 0) return Status::Ok();
    if (rc == 0) return DeadlineExceededError(std::string("timed out waiting to ") + what);
    if (errno != EINTR) return InternalError(std::string("poll: ") + ErrnoText(errno));
  }
}

}  // namespace

Result<HostPort> ParseHostPort(const std::string& text) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 >= text.size()) {
    return InvalidArgumentError("expected HOST:PORT, got '" + text + "'");
  }
  HostPort hp;
  hp.host = text.substr(0, colon);
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']') {
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  }
  const char* begin = text.data() + colon + 1;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, hp.port);
  if (ec != std::errc() || ptr != end || hp.port < 0 || hp.port > 65535) {
    return InvalidArgumentError("bad port in '" + text + "'");
  }
  if (hp.host.empty()) hp.host = "127.0.0.1";
  return hp;
}

void SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Result<UniqueFd> ListenTcp(const std::string& bind_host, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_text = std::to_string(port);
  const char* host = (bind_host.empty() || bind_host == "*") ? nullptr : bind_host.c_str();
  if (host == nullptr) hints.ai_family = AF_INET;
  int rc = ::getaddrinfo(host, port_text.c_str(), &hints, &res);
  if (rc != 0) {
    return InvalidArgumentError("cannot resolve '" + bind_host + "': " + gai_strerror(rc));
  }
  Status last = InternalError("no address to listen on for '" + bind_host + "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 1024) != 0) {
      last = UnavailableError("cannot listen on " + bind_host + ":" + port_text + ": " +
                              ErrnoText(errno));
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    if (bound_port != nullptr) {
      *bound_port = addr.ss_family == AF_INET
                        ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                        : ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    }
    SetNonBlocking(fd.get());
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

Result<UniqueFd> ConnectTcp(const HostPort& address, Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string port_text = std::to_string(address.port);
  int backoff_ms = 1;
  Status last = UnavailableError("cannot connect to " + address.ToString());
  while (true) {
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(address.host.c_str(), port_text.c_str(), &hints, &res);
    if (rc != 0) {
      last = UnavailableError("cannot resolve '" + address.host + "': " + gai_strerror(rc));
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (!fd.valid()) continue;
        SetNonBlocking(fd.get());
        int crc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
        if (crc != 0 && errno == EINPROGRESS) {
          Status waited = WaitFd(fd.get(), POLLOUT, deadline, "connect");
          if (!waited.ok()) {
            ::freeaddrinfo(res);
            return DeadlineExceededError("timed out connecting to " + address.ToString());
          }
          int err = 0;
          socklen_t len = sizeof(err);
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          crc = err == 0 ? 0 : -1;
          errno = err;
        }
        if (crc == 0) {
          SetNoDelay(fd.get());
          ::freeaddrinfo(res);
          return fd;
        }
        last =
            UnavailableError("cannot connect to " + address.ToString() + ": " + ErrnoText(errno));
      }
      ::freeaddrinfo(res);
    }
    if (deadline.Expired()) return last.WithContext("gave up at the deadline");
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 100);
  }
}

Result<UniqueFd> AcceptTcp(int listen_fd, Deadline deadline) {
  while (true) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      SetNoDelay(fd);
      return UniqueFd(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return InternalError(std::string("accept: ") + ErrnoText(errno));
    }
    TESSERA_RETURN_IF_ERROR(WaitFd(listen_fd, POLLIN, deadline, "accept a connection"));
  }
}

Status WriteFull(int fd, const void* data, size_t size, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      TESSERA_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "send"));
      continue;
    }
    return UnavailableError("connection to " + SocketPeerAddress(fd) +
                            " failed while sending: " + ErrnoText(errno));
  }
  return Status::Ok();
}

Status ReadFull(int fd, void* data, size_t size, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return UnavailableError("connection closed by " + SocketPeerAddress(fd));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      TESSERA_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "receive"));
      continue;
    }
    return UnavailableError("connection to " + SocketPeerAddress(fd) +
                            " failed while receiving: " + ErrnoText(errno));
  }
  return Status::Ok();
}

std::string SocketPeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return AddressToString(addr);
}

std::string SocketLocalHost(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "127.0.0.1";
  std::string text = AddressToString(addr);
  return text.substr(0, text.rfind(':'));
}

std::vector<std::string> LocalIpv4Addresses() {
  std::vector<std::string> addresses, loopback;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {"127.0.0.1"};
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) continue;
    if ((ifa->ifa_flags & IFF_UP) == 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
    ((ifa->ifa_flags & IFF_LOOPBACK) != 0 ? loopback : addresses).push_back(text);
  }
  ::freeifaddrs(list);
  addresses.insert(addresses.end(), loopback.begin(), loopback.end());
  if (addresses.empty()) addresses.push_back("127.0.0.1");
  return addresses;
}

}  // namespace tessera::comm
