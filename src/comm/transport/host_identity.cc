#include "comm/transport/host_identity.h"

#include <unistd.h>

#include <array>
#include <fstream>

#include "base/env.h"

namespace tessera::comm {
namespace {

std::string ReadLink(const char* path) {
  std::array<char, 256> buf{};
  ssize_t n = ::readlink(path, buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string("?");
}

}  // namespace

std::string LocalHostIdentity() {
  if (auto forced = EnvString("TESSERA_HOST_ID")) return *forced;
  std::array<char, 256> host{};
  ::gethostname(host.data(), host.size() - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  return std::string(host.data()) + "|" + boot_id + "|" + ReadLink("/proc/self/ns/mnt") + "|" +
         ReadLink("/proc/self/ns/ipc") + "|" + ReadLink("/proc/self/ns/net");
}

}  // namespace tessera::comm
