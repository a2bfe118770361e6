// Cluster-token authentication of a fresh connection: a mutual HMAC-SHA256
// challenge/response (OpenSSL), run by the store and by the TCP transport before
// any other byte is trusted. The token itself never crosses the wire. Layer: comm.
// Stateless; thread-safe.
#pragma once

#include <string_view>

#include "base/clock.h"
#include "base/status.h"

namespace tessera::comm {

// Server side (the accepting end). PermissionDenied when the client does not
// know the token; the connection should then be closed.
Status AuthenticateAsServer(int fd, std::string_view token, Deadline deadline);
// Client side (the connecting end). PermissionDenied when the server rejects us
// or cannot prove that it knows the token itself.
Status AuthenticateAsClient(int fd, std::string_view token, Deadline deadline);

}  // namespace tessera::comm
