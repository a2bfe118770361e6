// RequestStream: the hand-off between the scheduler thread and the HTTP thread
// answering one accepted request. The scheduler's callbacks (StreamCallbacks) queue
// each token event and then the result, and record the request's latency in
// Metrics; the response writers (sse_response, plain_response) take them. Layer:
// serve. Thread-safe: the callbacks run on the scheduler thread, the rest on the
// request's HTTP thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "serve/metrics.h"
#include "serve/response_json.h"

namespace tessera::serve {

// How often a response writer wakes while it waits on the scheduler, and the
// silence after which it writes something (an SSE comment, a space) so that a
// client that went away fails the write and its request is cancelled.
inline constexpr auto kStreamPollInterval = std::chrono::milliseconds(200);
inline constexpr int64_t kStreamPingNs = 1'000'000'000;

class RequestStream {
 public:
  // Scheduler thread. The event's logits row is valid during the callback only, so
  // the queued copy drops it.
  void Push(const engine::TokenEvent& event);
  void Finish(const engine::RequestResult& result);

  // HTTP thread. Waits up to `timeout` for the result; when it came, copies every
  // event and the result and returns true.
  bool WaitResult(std::chrono::milliseconds timeout, std::vector<engine::TokenEvent>* events,
                  engine::RequestResult* result);
  // Waits up to `timeout` for an event or the result; moves out the events queued
  // so far and copies the result if there is one.
  void TakeEvents(std::chrono::milliseconds timeout, std::vector<engine::TokenEvent>* events,
                  std::optional<engine::RequestResult>* result);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<engine::TokenEvent> events_;
  std::optional<engine::RequestResult> result_;
};

// The scheduler callbacks of one HTTP request: events and the result go to
// `stream`. When the request finishes (before its result is handed over) its
// latencies go to `metrics` — time to first token and end to end from
// `arrival_ns` (when the HTTP handler started), time per output token between
// the first and last token, all on this host's clock as the callbacks see the
// tokens — and so does the scheduler's RequestTiming (queue, prefill, decode, comm).
engine::RequestCallbacks StreamCallbacks(std::shared_ptr<RequestStream> stream, Metrics& metrics,
                                         std::string endpoint_name, int64_t arrival_ns);

// An accepted request, as the response writers see it.
struct AcceptedRequest {
  std::shared_ptr<RequestStream> stream;
  std::shared_ptr<engine::RequestHandle> handle;  // cancelled when the client goes away
  ResponseJson json;
  std::string echo;            // completions with echo: the prompt text, sent before the tokens'
  bool include_usage = false;  // streams: stream_options.include_usage
};

}  // namespace tessera::serve
