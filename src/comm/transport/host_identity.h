// Host identity: two ranks share memory only when they run on the same host in
// the same mount/IPC/network namespaces. Layer: comm. Thread-safe.
#pragma once

#include <string>

namespace tessera::comm {

// hostname + boot id + namespace inodes; TESSERA_HOST_ID overrides it (tests use
// it to force TCP between local ranks).
std::string LocalHostIdentity();

}  // namespace tessera::comm
