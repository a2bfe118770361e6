// The streamed answer to a generation request: Server-Sent Events written by
// cpp-httplib's chunked content provider on the connection's thread — a chunk per
// batch of tokens it picks up (a chat stream's role first), the finish chunk, the
// usage chunk when asked for, then [DONE]; ": ping" after a second of silence. A
// client that went away (a failed write) gets its request cancelled. Layer: serve;
// OpenAiServer calls it once Submit accepted a request with "stream": true.
#pragma once

#include <atomic>

#include "serve/request_stream.h"

namespace httplib {
struct Response;
}  // namespace httplib

namespace tessera::serve {

// Sets `res` up to stream `request`; returns at once (the provider runs after the
// handler returns). `open_streams` counts the stream until its provider is done,
// and must outlive it.
void RespondWithEventStream(httplib::Response& res, AcceptedRequest request,
                            std::atomic<int>& open_streams);

}  // namespace tessera::serve
