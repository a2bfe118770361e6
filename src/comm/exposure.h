// Exposure: whether a job's listening sockets can be reached from other hosts, and
// the rule that such a job must carry a cluster token. Without one every rank
// would accept any process that reaches its port (the HMAC handshake on an empty
// key admits anyone), so a job that listens beyond loopback without a token is
// refused before it opens a socket, unless the operator opts out out loud
// (`--insecure-no-token`, TESSERA_INSECURE_NO_TOKEN=1). Layer: comm. Thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace tessera::comm {

// True when every address `host` resolves to is a loopback address (127.0.0.0/8,
// ::1, "localhost"). "", "0.0.0.0", "::" and unresolvable names are not loopback.
bool IsLoopbackHost(const std::string& host);

// Where a rendezvous store for `rdzv_host` listens: the loopback address itself
// when the rendezvous is on loopback (nothing else can reach it anyway), else every
// interface.
std::string StoreBindHost(const std::string& rdzv_host);

// A fresh cluster token: 32 hex digits from the OS's random source.
Result<std::string> GenerateClusterToken();

// OK when `listen_host` is loopback, a token is set, or `insecure_no_token`
// (then a warning is logged once per process). Otherwise PermissionDenied naming
// `what` ("the rendezvous store", "rank 3's TCP transport") and the address, with
// a freshly generated token to pass to every rank.
Status CheckListeningNeedsToken(std::string_view what, const std::string& listen_host,
                                const std::string& cluster_token, bool insecure_no_token);

}  // namespace tessera::comm
