#include "serve/dp_front.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "serve/http_frame.h"
#include "serve/metrics.h"
#include "serve/replica_state.h"
#include "serve/request_builder.h"
#include "serve/request_parser.h"

namespace tessera::serve {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

// How long a prompt the front just sent counts as cached there before the
// replica's own events confirm it (they arrive within a poll of its prefill).
constexpr int64_t kPendingTtlNs = 10'000'000'000;
// Polls that fail (time out) in a row before a replica that still accepts
// connections is taken for down (frozen).
constexpr int kPollFailuresDown = 3;
// A non-streamed answer is sent whole if it is done within this; after it, 200
// and a space every second while it runs (as a replica does).
constexpr int64_t kPlainAnswerMs = 1000;

std::string Address(const std::string& host, int port) { return host + ":" + std::to_string(port); }

std::string ErrorEvent(const std::string& message) {
  ApiError error{
      .http_status = 500, .message = message, .type = "server_error", .code = "replica_failed"};
  return "data: " + error.ToJson() + "\n\ndata: [DONE]\n\n";
}

}  // namespace

struct DpFront::Impl {
  struct Replica {
    std::string host;
    int port = 0;
    bool up = false;
    bool recovering = false;  // its own ranks are being restarted: routed around
    int poll_failures = 0;
    int64_t in_flight = 0;
    int64_t reported_requests = 0;
    double kv_usage = 0;
    std::string instance;
    uint64_t cursor = UINT64_MAX;
    int64_t block_size = 0;
    kv::BlockHash root;
    int64_t down_since_ns = 0;
    double last_outage_s = 0;
    int64_t requests_total = 0, down_total = 0, restarts_total = 0, failed_calls_total = 0;
    std::set<UpstreamCall*> calls;
  };
  struct Target {
    int replica = -1;
    std::string host;
    int port = 0;
  };
  class Job;

  const model::Tokenizer* tokenizer;
  const ChatTemplate* chat;
  FrontOptions options;
  HttpFrame frame;
  mutable std::mutex mu;
  std::condition_variable up_cv;  // a replica came up
  std::vector<Replica> replicas;
  PrefixIndex index;
  Router router;
  int64_t requests_total = 0, reruns_total = 0, broken_streams_total = 0, unavailable_total = 0;
  int64_t prompt_blocks_total = 0, matched_blocks_total = 0;
  std::atomic<int> open_streams{0};
  std::atomic<bool> stopping{false};
  std::vector<std::thread> pollers;

  Impl(int n, const model::Tokenizer* t, const ChatTemplate* c, FrontOptions o)
      : tokenizer(t),
        chat(c),
        options(std::move(o)),
        frame(options.server, [](int) {}),
        replicas(static_cast<size_t>(n)),
        index(n),
        router(options.policy, options.load_margin) {}

  void SetUp();
  void Poll(int i);
  void MarkDownLocked(int i, const std::string& reason);
  std::vector<int32_t> PromptTokens(Endpoint endpoint, std::string_view body) const;
  // A replica for a request (blocks until one is up, at most unavailable_after_ms),
  // counted in flight; replica -1 when none came up or the front is stopping.
  Target Route(const std::vector<int32_t>& prompt, int avoid);
  std::shared_ptr<UpstreamCall> Call(const Target& target, const std::string& path,
                                     const std::string& body, const Headers& headers);
  // A call to `replica` failed: marked down unless it still answers /health.
  void CallFailed(const Target& target, const std::string& error);
  void HandleGeneration(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  std::string RenderMetrics() const;
  // The /metrics of every replica that is up and answers within a second.
  std::vector<std::pair<int, std::string>> ScrapeReplicas() const;
};

// One request through the front: its runs on replicas until one answers.
class DpFront::Impl::Job {
 public:
  Job(Impl& front, std::string path, std::string body, Headers headers, std::vector<int32_t> prompt)
      : front_(front),
        path_(std::move(path)),
        body_(std::move(body)),
        headers_(std::move(headers)),
        prompt_(std::move(prompt)) {}
  ~Job() { Drop(); }

  // Until a run has its response's headers: re-runs on another replica when a
  // call fails first. False (error()) when no replica took it.
  bool Begin() {
    while (true) {
      if (!call_) {
        if (runs_ >= front_.options.max_runs) {
          error_ = {.http_status = 502,
                    .message = "the request failed on " + std::to_string(runs_) +
                               " replicas in turn (" + last_error_ + ")",
                    .type = "server_error",
                    .code = "replica_failed"};
          return false;
        }
        target_ = front_.Route(prompt_, target_.replica);
        if (target_.replica < 0) {
          error_ = {.http_status = 503,
                    .message =
                        front_.stopping.load() ? "the server is shutting down" : "no replica is up",
                    .type = "server_error"};
          return false;
        }
        if (runs_ > 0) {
          std::lock_guard<std::mutex> lock(front_.mu);
          ++front_.reruns_total;
        }
        ++runs_;
        call_ = front_.Call(target_, path_, body_, headers_);
      }
      if (call_->WaitHeaders(500)) return true;
      std::string none;  // no body before the headers
      if (call_->WaitDone(0) || call_->Take(&none, 0) == UpstreamCall::Next::kFailed) {
        Failed();
      }
    }
  }

  // Non-streamed: waits up to timeout_ms for the whole answer, re-running a
  // failed run. True once done (status(), body()), or when it failed for good
  // (failed(): error()).
  bool Finish(int64_t timeout_ms) {
    const int64_t deadline = NowNs() + timeout_ms * 1'000'000;
    while (true) {
      if (failed_) return true;
      if (!call_ && !Begin()) {
        failed_ = true;
        return true;
      }
      const int64_t left_ms = std::max<int64_t>(0, (deadline - NowNs()) / 1'000'000);
      const bool done = call_->WaitDone(left_ms);
      if (call_->Take(&answer_, 0) == UpstreamCall::Next::kFailed) {
        answer_.clear();  // a part of a failed run's answer
        Failed();
        continue;
      }
      if (done) return true;
      if (NowNs() >= deadline) return false;
    }
  }

  // The current run failed: the replica is checked, the run dropped.
  void Failed() {
    last_error_ = call_->error();
    front_.CallFailed(target_, last_error_);
    Drop();
  }
  void Drop() {
    std::shared_ptr<UpstreamCall> call = std::move(call_);
    if (call) call->Cancel();  // joined here, without the front's lock
  }

  UpstreamCall* call() { return call_.get(); }
  int replica() const { return target_.replica; }
  bool failed() const { return failed_; }
  const ApiError& error() const { return error_; }
  const std::string& answer() const { return answer_; }

 private:
  Impl& front_;
  const std::string path_, body_;
  const Headers headers_;
  const std::vector<int32_t> prompt_;
  Target target_;
  std::shared_ptr<UpstreamCall> call_;
  int runs_ = 0;
  bool failed_ = false;
  ApiError error_;
  std::string answer_, last_error_;
};

std::vector<int32_t> DpFront::Impl::PromptTokens(Endpoint endpoint, std::string_view body) const {
  if (tokenizer == nullptr || options.policy != RouterPolicy::kPrefixAffinity) return {};
  ApiResult<ParsedRequest> parsed = ParseRequest(endpoint, body, ParserLimits{});
  const ParsedRequest* r = std::get_if<ParsedRequest>(&parsed);
  if (r == nullptr) return {};  // the replica answers it with the error
  const BuildContext context{.tokenizer = *tokenizer,
                             .chat = chat,
                             .chat_error = "",
                             .max_model_len = int64_t{1} << 40,
                             .seed_if_unset = 0};
  ApiResult<engine::RequestParams> built = BuildRequestParams(*r, context);
  engine::RequestParams* params = std::get_if<engine::RequestParams>(&built);
  return params != nullptr ? std::move(params->prompt) : std::vector<int32_t>();
}

DpFront::Impl::Target DpFront::Impl::Route(const std::vector<int32_t>& prompt, int avoid) {
  const int64_t deadline = NowNs() + options.unavailable_after_ms * 1'000'000;
  std::unique_lock<std::mutex> lock(mu);
  // The prompt's block hashes under each replica's root and block size (one
  // chain for replicas of one model).
  struct Chain {
    kv::BlockHash root;
    int64_t block_size;
    std::vector<kv::BlockHash> hashes;
  };
  std::vector<Chain> chains;
  chains.reserve(replicas.size());  // blocks[] points into it
  while (!stopping.load()) {
    std::vector<ReplicaView> views(replicas.size());
    std::vector<const std::vector<kv::BlockHash>*> blocks(replicas.size(), nullptr);
    int num_up = 0;
    for (size_t i = 0; i < replicas.size(); ++i) {
      const Replica& r = replicas[i];
      ReplicaView& v = views[i];
      v.up = r.up && !r.recovering && r.port > 0 && static_cast<int>(i) >= options.first_routable;
      num_up += v.up ? 1 : 0;
      v.in_flight = r.in_flight;
      v.reported_requests = r.reported_requests;
      v.kv_usage = r.kv_usage;
      if (v.up && !prompt.empty() && r.block_size > 0) {  // (no cache: nothing matches)
        std::vector<kv::BlockHash>* chain = nullptr;
        for (Chain& c : chains) {
          if (c.root == r.root && c.block_size == r.block_size) chain = &c.hashes;
        }
        if (chain == nullptr) {
          chains.push_back({r.root, r.block_size, PromptBlockHashes(r.root, r.block_size, prompt)});
          chain = &chains.back().hashes;
        }
        blocks[i] = chain;
        v.matched_blocks = index.MatchedBlocks(static_cast<int>(i), *chain, NowNs());
      }
    }
    if (avoid >= 0 && num_up > 1) views[static_cast<size_t>(avoid)].up = false;
    const int pick = router.Pick(views);
    if (pick >= 0) {
      Replica& r = replicas[static_cast<size_t>(pick)];
      ++r.in_flight;
      ++r.requests_total;
      if (const std::vector<kv::BlockHash>* chain = blocks[static_cast<size_t>(pick)]) {
        prompt_blocks_total += static_cast<int64_t>(chain->size());
        matched_blocks_total += views[static_cast<size_t>(pick)].matched_blocks;
        index.AddPending(pick, *chain, NowNs(), kPendingTtlNs);
      }
      return {pick, r.host, r.port};
    }
    if (NowNs() >= deadline) break;
    up_cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  ++unavailable_total;
  return {};
}

std::shared_ptr<UpstreamCall> DpFront::Impl::Call(const Target& target, const std::string& path,
                                                  const std::string& body, const Headers& headers) {
  std::lock_guard<std::mutex> lock(mu);
  auto slot = std::make_shared<UpstreamCall*>(nullptr);
  auto call = std::make_shared<UpstreamCall>(
      target.host, target.port, path, body, headers, options.upstream,
      [this, slot, i = static_cast<size_t>(target.replica)] {
        std::lock_guard<std::mutex> lock(mu);  // after Call returned: *slot is set
        --replicas[i].in_flight;
        replicas[i].calls.erase(*slot);
      });
  *slot = call.get();
  replicas[static_cast<size_t>(target.replica)].calls.insert(call.get());
  return call;
}

void DpFront::Impl::CallFailed(const Target& target, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu);
    Replica& r = replicas[static_cast<size_t>(target.replica)];
    ++r.failed_calls_total;
    if (!r.up || r.host != target.host || r.port != target.port) return;  // known already
  }
  httplib::Client probe(target.host, target.port);
  probe.set_connection_timeout(1, 0);
  probe.set_read_timeout(2, 0);
  httplib::Result res = probe.Get("/health");
  if (res) return;  // it answers: this call alone failed
  std::lock_guard<std::mutex> lock(mu);
  Replica& r = replicas[static_cast<size_t>(target.replica)];
  if (r.host == target.host && r.port == target.port) {
    MarkDownLocked(target.replica, "a request to it failed (" + error +
                                       ") and /health: " + httplib::to_string(res.error()));
  }
}

void DpFront::Impl::MarkDownLocked(int i, const std::string& reason) {
  Replica& r = replicas[static_cast<size_t>(i)];
  if (!r.up) return;
  r.up = false;
  r.down_since_ns = NowNs();
  ++r.down_total;
  r.poll_failures = 0;
  index.Clear(i);
  std::fprintf(stderr,
               "tessera serve: replica %d (%s) is down: %s; %zu requests re-run elsewhere\n", i,
               Address(r.host, r.port).c_str(), reason.c_str(), r.calls.size());
  for (UpstreamCall* call : r.calls) call->Cancel();
}

void DpFront::Impl::Poll(int i) {
  std::unique_ptr<httplib::Client> client;
  std::string client_host;
  int client_port = 0;
  while (!stopping.load()) {
    std::string host, path;
    int port = 0;
    {
      std::unique_lock<std::mutex> lock(mu);
      const Replica& r = replicas[static_cast<size_t>(i)];
      host = r.host;
      port = r.port;
      path = "/internal/state?instance=" + r.instance + "&after=" + std::to_string(r.cursor);
    }
    if (port > 0) {
      if (!client || client_host != host || client_port != port) {
        client = std::make_unique<httplib::Client>(host, port);
        client->set_connection_timeout(1, 0);
        client->set_read_timeout(2, 0);
        client_host = host;
        client_port = port;
      }
      httplib::Result res = client->Get(path);
      Result<ReplicaState> state = InvalidArgumentError("no answer");
      if (res && res->status == 200) state = ReplicaStateFromJson(res->body);
      std::lock_guard<std::mutex> lock(mu);
      Replica& r = replicas[static_cast<size_t>(i)];
      if (r.host == host && r.port == port) {
        if (!state.ok()) {
          // Refused: nobody listens (a dead process). Else a few in a row: frozen.
          const bool refused = !res && res.error() == httplib::Error::Connection;
          if (refused || ++r.poll_failures >= kPollFailuresDown) {
            MarkDownLocked(i, res ? "its /internal/state answered " + std::to_string(res->status)
                                  : "its /internal/state: " + httplib::to_string(res.error()));
          }
        } else {
          r.poll_failures = 0;
          if (state->instance != r.instance) index.Clear(i);
          r.instance = state->instance;
          r.cursor = state->cache.next;
          r.block_size = state->block_size;
          r.root = state->root;
          r.reported_requests = state->waiting + state->running;
          r.kv_usage = state->kv_blocks_total > 0 ? static_cast<double>(state->kv_blocks_used) /
                                                        static_cast<double>(state->kv_blocks_total)
                                                  : 0;
          r.recovering = state->recovering;
          index.Apply(i, state->cache);
          if (!r.up) {
            r.up = true;
            if (r.down_since_ns > 0) {
              r.last_outage_s = static_cast<double>(NowNs() - r.down_since_ns) * 1e-9;
              std::fprintf(stderr, "tessera serve: replica %d (%s) is back after %.2f s\n", i,
                           Address(host, port).c_str(), r.last_outage_s);
            }
            up_cv.notify_all();
          }
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(options.poll_interval_ms));
  }
}

void DpFront::Impl::HandleGeneration(Endpoint endpoint, const httplib::Request& req,
                                     httplib::Response& res) {
  if (frame.stopping()) {
    return SendApiError(
        res,
        {.http_status = 503, .message = "the server is shutting down", .type = "server_error"});
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ++requests_total;
  }
  const nlohmann::json peek = nlohmann::json::parse(req.body, nullptr, false);
  const bool stream = peek.is_object() && peek.contains("stream") && peek["stream"].is_boolean() &&
                      peek["stream"].get<bool>();
  Headers headers = {{"Content-Type", "application/json"}};
  if (req.has_header("Authorization")) {
    headers.emplace_back("Authorization", req.get_header_value("Authorization"));
  }
  auto job = std::make_shared<Job>(*this, req.path, req.body, std::move(headers),
                                   PromptTokens(endpoint, req.body));
  if (!job->Begin()) return SendApiError(res, job->error());
  const bool event_stream = stream && job->call()->status() == 200 &&
                            job->call()->content_type().starts_with("text/event-stream");
  if (!event_stream) {
    if (job->Finish(kPlainAnswerMs)) {
      if (job->failed()) return SendApiError(res, job->error());
      res.status = job->call()->status();
      res.set_content(job->answer(), job->call()->content_type());
      return;
    }
    // Still running: 200 now, a space each second (a client that left fails a
    // write and the run is cancelled), the answer or the error object at the end.
    ++open_streams;
    res.set_chunked_content_provider(
        "application/json",
        [job](size_t, httplib::DataSink& sink) {
          if (!job->Finish(kPlainAnswerMs)) return sink.write(" ", 1);
          const std::string out = job->failed() ? job->error().ToJson() : job->answer();
          if (!sink.write(out.data(), out.size())) return false;
          sink.done();
          return true;
        },
        [this, job](bool) {
          job->Drop();
          --open_streams;
        });
    return;
  }
  // A stream: relayed event by event. A run that fails before any data event
  // was relayed is re-run elsewhere; after one, the stream ends with an error.
  struct Relay {
    std::string pending;  // an event not yet complete
    bool sent_data = false;
  };
  auto relay = std::make_shared<Relay>();
  res.set_header("Cache-Control", "no-cache");
  ++open_streams;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job, relay](size_t, httplib::DataSink& sink) {
        auto finish_with = [&](const std::string& out) {
          if (!sink.write(out.data(), out.size())) return false;
          sink.done();
          return true;
        };
        switch (job->call()->Take(&relay->pending, 1000)) {
          case UpstreamCall::Next::kData: {
            const size_t end = relay->pending.rfind("\n\n");
            if (end == std::string::npos) return true;
            const std::string events = relay->pending.substr(0, end + 2);
            relay->pending.erase(0, end + 2);
            relay->sent_data = relay->sent_data || events.find("data: ") != std::string::npos;
            return sink.write(events.data(), events.size());
          }
          case UpstreamCall::Next::kTimeout:
            return sink.is_writable();
          case UpstreamCall::Next::kEnd:
            return finish_with(relay->pending);
          case UpstreamCall::Next::kFailed:
            break;
        }
        const int replica = job->replica();
        job->Failed();
        relay->pending.clear();
        if (relay->sent_data) {
          std::lock_guard<std::mutex> lock(mu);
          ++broken_streams_total;
          return finish_with(ErrorEvent("replica " + std::to_string(replica) +
                                        " failed after this stream had sent tokens; the "
                                        "completion is incomplete (retry the request)"));
        }
        if (!job->Begin()) return finish_with(ErrorEvent(job->error().message));
        if (job->call()->status() != 200) {
          job->Finish(60'000);
          return finish_with(ErrorEvent("the re-run on another replica answered " +
                                        std::to_string(job->call()->status()) + ": " +
                                        job->answer()));
        }
        return true;  // the next call relays the new run
      },
      [this, job](bool) {
        job->Drop();
        --open_streams;
      });
}

std::string DpFront::Impl::RenderMetrics() const {
  std::lock_guard<std::mutex> lock(mu);
  std::string out;
  auto gauge = [&](const char* name, const char* type, const char* help, auto value_of) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (size_t i = 0; i < replicas.size(); ++i) {
      char line[256];
      std::snprintf(line, sizeof(line), "%s{replica=\"%zu\",address=\"%s\"} %.6g\n", name, i,
                    Address(replicas[i].host, replicas[i].port).c_str(),
                    static_cast<double>(value_of(replicas[i])));
      out += line;
    }
  };
  auto scalar = [&](const char* name, const char* type, const char* help, double value) {
    char line[128];
    std::snprintf(line, sizeof(line), "%s %.6g\n", name, value);
    out +=
        std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + line;
  };
  int num_up = 0;
  for (const Replica& r : replicas) num_up += r.up ? 1 : 0;
  scalar("tessera_dp_replicas", "gauge", "Replicas behind this front", replicas.size());
  scalar("tessera_dp_replicas_up", "gauge", "Replicas up (answering, routed to)", num_up);
  scalar("tessera_dp_requests_total", "counter", "Generation requests the front accepted",
         requests_total);
  scalar("tessera_dp_reruns_total", "counter",
         "Runs of a request on another replica after its replica failed", reruns_total);
  scalar("tessera_dp_broken_streams_total", "counter",
         "Streams ended with an error event: their replica failed after tokens were sent",
         broken_streams_total);
  scalar("tessera_dp_unavailable_total", "counter", "Requests refused: no replica was up",
         unavailable_total);
  scalar("tessera_dp_router_prompt_blocks_total", "counter",
         "Full prompt blocks of the requests routed (prefix-affinity)", prompt_blocks_total);
  scalar("tessera_dp_router_matched_blocks_total", "counter",
         "Of those, blocks the chosen replica was known to cache", matched_blocks_total);
  gauge("tessera_dp_replica_up", "gauge", "1 while the replica answers and is routed to",
        [](const Replica& r) { return r.up ? 1 : 0; });
  gauge("tessera_dp_replica_in_flight", "gauge", "The front's requests on the replica now",
        [](const Replica& r) { return r.in_flight; });
  gauge("tessera_dp_replica_reported_requests", "gauge",
        "Waiting + running requests the replica reported at the last poll",
        [](const Replica& r) { return r.reported_requests; });
  gauge("tessera_dp_replica_kv_usage_ratio", "gauge", "KV blocks used / total, last poll",
        [](const Replica& r) { return r.kv_usage; });
  gauge("tessera_dp_replica_cached_blocks", "gauge",
        "Prefix-cache blocks the front knows the replica holds (from its cache events)",
        [this](const Replica& r) {
          return static_cast<double>(index.num_cached(static_cast<int>(&r - replicas.data())));
        });
  gauge("tessera_dp_replica_requests_total", "counter", "Runs of requests sent to the replica",
        [](const Replica& r) { return r.requests_total; });
  gauge("tessera_dp_replica_failed_calls_total", "counter", "Runs on the replica that failed",
        [](const Replica& r) { return r.failed_calls_total; });
  gauge("tessera_dp_replica_down_total", "counter", "Times the replica was marked down",
        [](const Replica& r) { return r.down_total; });
  gauge("tessera_dp_replica_restarts_total", "counter", "Restarts of a local replica's process",
        [](const Replica& r) { return r.restarts_total; });
  gauge("tessera_dp_replica_last_outage_seconds", "gauge",
        "From marked down to answering again, its last outage",
        [](const Replica& r) { return r.last_outage_s; });
  return out;
}

std::vector<std::pair<int, std::string>> DpFront::Impl::ScrapeReplicas() const {
  std::vector<std::tuple<int, std::string, int>> up;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < replicas.size(); ++i) {
      if (replicas[i].up) up.emplace_back(static_cast<int>(i), replicas[i].host, replicas[i].port);
    }
  }
  std::vector<std::pair<int, std::string>> out;
  for (const auto& [replica, host, port] : up) {
    httplib::Client client(host, port);
    client.set_connection_timeout(1, 0);
    client.set_read_timeout(1, 0);
    if (httplib::Result answer = client.Get("/metrics"); answer && answer->status == 200) {
      out.emplace_back(replica, std::move(answer->body));
    }
  }
  return out;
}

void DpFront::Impl::SetUp() {
  httplib::Server& http = frame.http();
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    int up = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const Replica& r : replicas) up += r.up && !r.recovering ? 1 : 0;
    }
    const int n = static_cast<int>(replicas.size());
    const char* status = frame.stopping() ? "stopping"
                         : up == n        ? "ok"
                         : up > 0         ? "degraded"
                                          : "unavailable";
    // Degraded still serves (on the replicas that are up): 200; none up: 503.
    res.status = up > 0 && !frame.stopping() ? 200 : 503;
    res.set_content(std::string("{\"status\":\"") + status + "\",\"replicas\":" +
                        std::to_string(n) + ",\"replicas_up\":" + std::to_string(up) + "}",
                    "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics() + MergeReplicaMetrics(ScrapeReplicas()),
                    "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    std::vector<std::pair<std::string, int>> up;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const Replica& r : replicas) {
        if (r.up) up.emplace_back(r.host, r.port);
      }
    }
    for (const auto& [host, port] : up) {
      httplib::Client client(host, port);
      client.set_connection_timeout(1, 0);
      client.set_read_timeout(5, 0);
      httplib::Headers headers;
      if (req.has_header("Authorization")) {
        headers.emplace("Authorization", req.get_header_value("Authorization"));
      }
      if (httplib::Result answer = client.Get("/v1/models", headers)) {
        res.status = answer->status;
        res.set_content(answer->body, answer->get_header_value("Content-Type"));
        return;
      }
    }
    SendApiError(res, {.http_status = 503, .message = "no replica is up", .type = "server_error"});
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(Endpoint::kCompletions, req, res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(Endpoint::kChatCompletions, req, res);
  });
  for (int i = 0; i < static_cast<int>(replicas.size()); ++i) {
    pollers.emplace_back([this, i] { Poll(i); });
  }
}

DpFront::DpFront(int num_replicas, const model::Tokenizer* tokenizer, const ChatTemplate* chat,
                 FrontOptions options)
    : impl_(std::make_unique<Impl>(num_replicas, tokenizer, chat, std::move(options))) {
  impl_->SetUp();
}

DpFront::~DpFront() {
  Stop();
  for (std::thread& t : impl_->pollers) t.join();
}

void DpFront::SetReplicaAddress(int replica, const std::string& host, int port) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Replica& r = impl_->replicas.at(static_cast<size_t>(replica));
  if (r.host == host && r.port == port) return;
  impl_->MarkDownLocked(replica, "it moved to " + Address(host, port));
  r.host = host;
  r.port = port;
  r.poll_failures = 0;
}

void DpFront::MarkDown(int replica, const std::string& reason) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->MarkDownLocked(replica, reason);
}

void DpFront::CountRestart(int replica) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ++impl_->replicas.at(static_cast<size_t>(replica)).restarts_total;
}

int DpFront::num_replicas() const { return static_cast<int>(impl_->replicas.size()); }

int DpFront::num_up() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  int up = 0;
  for (const Impl::Replica& r : impl_->replicas) up += r.up ? 1 : 0;
  return up;
}

bool DpFront::replica_up(int replica) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->replicas.at(static_cast<size_t>(replica)).up;
}

Result<int> DpFront::Bind() { return impl_->frame.Bind(); }

Status DpFront::Serve() { return impl_->frame.Serve(); }

void DpFront::Stop() {
  impl_->stopping.store(true);
  impl_->up_cv.notify_all();
  impl_->frame.Stop();
}

int DpFront::open_streams() const { return impl_->open_streams.load(); }

}  // namespace tessera::serve
