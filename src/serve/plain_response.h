// The non-streamed answer to a generation request. Done within kPlainBodyWait: an
// ordinary response with its own status. Longer: 200 at once and the JSON body
// when the request is done, a space (leading JSON whitespace) after each second of
// silence, so that a client that went away fails a write and its request is
// cancelled as a stream's would be; an error from then on is an error object in
// the 200 body. Layer: serve; OpenAiServer calls it once Submit accepted a request.
#pragma once

#include <atomic>
#include <chrono>

#include "serve/request_stream.h"

namespace httplib {
struct Response;
}  // namespace httplib

namespace tessera::serve {

inline constexpr auto kPlainBodyWait = std::chrono::milliseconds(1000);

// Blocks up to kPlainBodyWait for the result; then answers, or sets `res` up to
// answer later (the provider runs after the handler returns, counted in
// `open_streams` until it is done; `open_streams` must outlive it).
void RespondWithBody(httplib::Response& res, AcceptedRequest request,
                     std::atomic<int>& open_streams);

}  // namespace tessera::serve
