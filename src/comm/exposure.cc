#include "comm/exposure.h"

#include <netdb.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cstring>

#include "base/log.h"

namespace tessera::comm {
namespace {

bool IsLoopbackAddress(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    return IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr);
  }
  return false;
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  if (host.empty() || host == "*") return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return false;
  bool all_loopback = list != nullptr;
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    all_loopback = all_loopback && IsLoopbackAddress(ai->ai_addr);
  }
  ::freeaddrinfo(list);
  return all_loopback;
}

std::string StoreBindHost(const std::string& rdzv_host) {
  return IsLoopbackHost(rdzv_host) ? rdzv_host : "0.0.0.0";
}

Result<std::string> GenerateClusterToken() {
  std::array<unsigned char, 16> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return InternalError("OpenSSL RAND_bytes failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

Status CheckListeningNeedsToken(std::string_view what, const std::string& listen_host,
                                const std::string& cluster_token, bool insecure_no_token) {
  if (!cluster_token.empty() || IsLoopbackHost(listen_host)) return Status::Ok();
  const std::string where = std::string(what) + " would listen on " +
                            (listen_host.empty() ? std::string("every interface") : listen_host);
  if (insecure_no_token) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      TLOG_WARN("comm",
                "INSECURE: %s without a cluster token (--insecure-no-token): any process that "
                "can reach the port can join this job",
                where.c_str());
    }
    return Status::Ok();
  }
  Result<std::string> example = GenerateClusterToken();
  return PermissionDeniedError(
      where +
      ", reachable from other hosts, without a cluster token: any process that reaches the "
      "port could join the job, read its activations and inject its own. Give every rank the "
      "same secret, e.g. TESSERA_CLUSTER_TOKEN=" +
      (example.ok() ? *example : std::string("<random hex>")) +
      " (or --token) on every node, or pass --insecure-no-token (TESSERA_INSECURE_NO_TOKEN=1) "
      "to run without one");
}

}  // namespace tessera::comm
