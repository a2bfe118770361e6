#include "serve/sse_response.h"

#include <httplib.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"

namespace tessera::serve {
namespace {

// One stream's state between calls of its content provider (its connection's
// thread only).
struct EventStream {
  AcceptedRequest request;
  bool sent_role = false;
  int64_t text_offset = 0;  // completions' logprobs.text_offset (the echo not counted)
  int64_t last_write_ns = 0;
};

// One call of the provider: waits a little for tokens, writes what came. False
// ends the response (the client is gone); true with sink.done() when finished.
bool WriteEvents(EventStream& s, httplib::DataSink& sink) {
  const ResponseJson& json = s.request.json;
  std::vector<engine::TokenEvent> events;
  std::optional<engine::RequestResult> result;
  s.request.stream->TakeEvents(kStreamPollInterval, &events, &result);
  auto write = [&](const std::string& out) {
    s.last_write_ns = NowNs();
    return sink.write(out.data(), out.size());
  };
  std::string out;
  if (json.format().endpoint == Endpoint::kChatCompletions && !s.sent_role) {
    out += json.RoleChunk();
    s.sent_role = true;
  }
  if (!events.empty() || !s.request.echo.empty()) {
    std::string text = std::move(s.request.echo);
    s.request.echo.clear();
    for (const engine::TokenEvent& e : events) text += e.text;
    out += json.TextChunk(std::move(text), events, &s.text_offset);
  }
  if (result) {
    out += json.FinishChunk(*result);
    if (s.request.include_usage) out += json.UsageChunk(*result);
    out += ResponseJson::kDoneEvent;
    if (!write(out)) return false;
    sink.done();
    return true;
  }
  // Silence: a comment line finds a client that went away (its write fails).
  if (out.empty() && NowNs() - s.last_write_ns > kStreamPingNs) out = ": ping\n\n";
  if (!out.empty() && !write(out)) {
    s.request.handle->Cancel();
    return false;
  }
  return true;
}

}  // namespace

void RespondWithEventStream(httplib::Response& res, AcceptedRequest request,
                            std::atomic<int>& open_streams) {
  std::shared_ptr<engine::RequestHandle> handle = request.handle;
  auto stream = std::make_shared<EventStream>(
      EventStream{.request = std::move(request), .last_write_ns = NowNs()});
  res.set_header("Cache-Control", "no-cache");
  ++open_streams;
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream](size_t, httplib::DataSink& sink) { return WriteEvents(*stream, sink); },
      [handle, &open_streams](bool success) {
        if (!success) handle->Cancel();  // the client disconnected mid-stream
        --open_streams;
      });
}

}  // namespace tessera::serve
