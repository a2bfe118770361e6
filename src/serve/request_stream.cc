#include "serve/request_stream.h"

#include <utility>

#include "base/clock.h"

namespace tessera::serve {

void RequestStream::Push(const engine::TokenEvent& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(event);
  events_.back().logits = {};
  cv_.notify_all();
}

void RequestStream::Finish(const engine::RequestResult& result) {
  std::lock_guard<std::mutex> lock(mutex_);
  result_ = result;
  cv_.notify_all();
}

bool RequestStream::WaitResult(std::chrono::milliseconds timeout,
                               std::vector<engine::TokenEvent>* events,
                               engine::RequestResult* result) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return result_.has_value(); })) return false;
  events->assign(events_.begin(), events_.end());
  *result = *result_;
  return true;
}

void RequestStream::TakeEvents(std::chrono::milliseconds timeout,
                               std::vector<engine::TokenEvent>* events,
                               std::optional<engine::RequestResult>* result) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty() || result_.has_value(); });
  events->assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  *result = result_;
}

engine::RequestCallbacks StreamCallbacks(std::shared_ptr<RequestStream> stream, Metrics& metrics,
                                         std::string endpoint_name, int64_t arrival_ns) {
  // When the first and the latest token reached the callbacks (scheduler thread only).
  struct TokenTimes {
    int64_t first_ns = 0;
    int64_t last_ns = 0;
  };
  auto times = std::make_shared<TokenTimes>();
  engine::RequestCallbacks callbacks;
  callbacks.on_token = [stream, times](const engine::TokenEvent& event) {
    const int64_t now = NowNs();
    if (times->first_ns == 0) times->first_ns = now;
    times->last_ns = now;
    stream->Push(event);
  };
  callbacks.on_done = [stream, times, &metrics, endpoint_name = std::move(endpoint_name),
                       arrival_ns](const engine::RequestResult& result) {
    const int64_t now = NowNs();
    const double ttft_s = times->first_ns ? (times->first_ns - arrival_ns) * 1e-9 : -1.0;
    const double tpot_s = result.completion_tokens > 1
                              ? (times->last_ns - times->first_ns) * 1e-9 /
                                    static_cast<double>(result.completion_tokens - 1)
                              : -1.0;
    metrics.ObserveRequest(endpoint_name, engine::FinishReasonName(result.reason), ttft_s, tpot_s,
                           (now - arrival_ns) * 1e-9);
    metrics.ObserveTiming(result.timing);
    stream->Finish(result);
  };
  return callbacks;
}

}  // namespace tessera::serve
