#include "serve/plain_response.h"

#include <httplib.h>

#include <memory>
#include <utility>
#include <vector>

#include "base/clock.h"

namespace tessera::serve {
namespace {

// A long request answered early (its connection's thread only).
struct LateBody {
  AcceptedRequest request;
  int64_t last_write_ns = 0;
};

// One call of the provider: the body once the request is done, else a space
// after a second of silence. False ends the response (the client is gone).
bool WriteLateBody(LateBody& b, httplib::DataSink& sink) {
  std::vector<engine::TokenEvent> events;
  engine::RequestResult result;
  if (b.request.stream->WaitResult(kStreamPollInterval, &events, &result)) {
    const std::string body = b.request.json.FinishedBody(b.request.echo, events, result).json;
    if (!sink.write(body.data(), body.size())) return false;
    sink.done();
    return true;
  }
  if (NowNs() - b.last_write_ns > kStreamPingNs) {
    b.last_write_ns = NowNs();
    if (!sink.write(" ", 1)) {
      b.request.handle->Cancel();
      return false;
    }
  }
  return true;
}

}  // namespace

void RespondWithBody(httplib::Response& res, AcceptedRequest request,
                     std::atomic<int>& open_streams) {
  std::vector<engine::TokenEvent> events;
  engine::RequestResult result;
  if (request.stream->WaitResult(kPlainBodyWait, &events, &result)) {
    HttpBody body = request.json.FinishedBody(request.echo, events, result);
    res.status = body.status;
    res.set_content(body.json, "application/json");
    return;
  }
  std::shared_ptr<engine::RequestHandle> handle = request.handle;
  auto late =
      std::make_shared<LateBody>(LateBody{.request = std::move(request), .last_write_ns = NowNs()});
  ++open_streams;
  res.set_chunked_content_provider(
      "application/json",
      [late](size_t, httplib::DataSink& sink) { return WriteLateBody(*late, sink); },
      [handle, &open_streams](bool success) {
        if (!success) handle->Cancel();  // the client disconnected
        --open_streams;
      });
}

}  // namespace tessera::serve
