#include "serve/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "base/clock.h"
#include "serve/http_frame.h"
#include "serve/plain_response.h"
#include "serve/replica_state.h"
#include "serve/request_builder.h"
#include "serve/request_parser.h"
#include "serve/request_stream.h"
#include "serve/response_json.h"
#include "serve/sse_response.h"
#include "serve/ui_assets.h"
#include "serve/ui_state.h"

namespace tessera::serve {
namespace {

// Cache events per /internal/state answer (a front polling every 100 ms catches up
// with 160k blocks a second).
constexpr size_t kMaxCacheEventsPerRead = 16384;

}  // namespace

struct OpenAiServer::Impl {
  engine::Scheduler& scheduler;
  const model::Tokenizer& tokenizer;
  const ChatTemplate* chat;
  std::string chat_error;
  Metrics& metrics;
  ServerOptions options;
  HttpFrame frame;
  httplib::Server& http = frame.http();
  std::atomic<int64_t> next_id{0};
  // Streams whose provider has not finished (the last chunk and [DONE] not yet
  // written): shutdown lets them flush before it stops the HTTP server.
  std::atomic<int> open_streams{0};
  std::mutex seed_mutex;
  std::mt19937_64 seed_rng{std::random_device{}()};
  // This server process's id in /internal/state (a restarted replica is another).
  const std::string instance =
      std::to_string(std::random_device{}()) + "-" + std::to_string(NowNs());
  const int64_t started_ns = NowNs();

  Impl(engine::Scheduler& s, const model::Tokenizer& t, const ChatTemplate* c, std::string ce,
       Metrics& m, ServerOptions o)
      : scheduler(s),
        tokenizer(t),
        chat(c),
        chat_error(std::move(ce)),
        metrics(m),
        options(std::move(o)),
        frame(options, [&m](int status) { m.CountHttpError(status); }) {}

  void SetUp();
  void SetUpUi();  // the live view's routes
  void SendError(httplib::Response& res, const ApiError& error) { SendApiError(res, error); }
  ApiResult<ParsedRequest> Parse(Endpoint endpoint, std::string_view body);
  ResponseJson ResponseFor(const ParsedRequest& request);  // takes the next response id
  // POST /v1/completions and /v1/chat/completions: parse, build, submit, respond.
  void HandleGeneration(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  uint64_t RandomSeed() {
    std::lock_guard<std::mutex> lock(seed_mutex);
    return seed_rng();
  }
};

void OpenAiServer::Impl::SetUp() {
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (frame.stopping()) {
      res.status = 503;
      res.set_content("{\"status\":\"stopping\"}", "application/json");
      return;
    }
    const engine::SchedulerStats stats = scheduler.Stats();
    if (stats.recovering) {  // requests queue, nothing is generated until the ranks are back
      res.status = 503;
      res.set_header("Retry-After", "2");
      res.set_content("{\"status\":\"degraded\",\"engine\":\"restarting\",\"restarts\":" +
                          std::to_string(stats.engine_restarts_total) + "}",
                      "application/json");
      return;
    }
    res.set_content(
        "{\"status\":\"ok\",\"restarts\":" + std::to_string(stats.engine_restarts_total) + "}",
        "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.Render(scheduler.Stats()), "text/plain; version=0.0.4");
  });
  // For a data-parallel front (docs/serve.md, "Data parallelism"): load and the
  // prefix cache's events after the front's cursor. Open like /metrics (hashes only).
  http.Get("/internal/state", [this](const httplib::Request& req, httplib::Response& res) {
    const engine::SchedulerStats stats = scheduler.Stats();
    ReplicaState state{.instance = instance,
                       .waiting = stats.waiting,
                       .running = stats.running,
                       .kv_blocks_used = stats.kv_blocks_used,
                       .kv_blocks_total = stats.kv_blocks_total,
                       .recovering = stats.recovering,
                       .prefix_cache = stats.prefix_cache_enabled,
                       .block_size = scheduler.kv_block_size(),
                       .root = scheduler.prefix_cache_root()};
    uint64_t after = UINT64_MAX;  // not a cursor of this instance: a snapshot
    if (req.get_param_value("instance") == instance) {
      const std::string text = req.get_param_value("after");
      char* end = nullptr;
      const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
      if (!text.empty() && end != nullptr && *end == '\0') after = value;
    }
    state.cache = scheduler.cache_events().Read(after, kMaxCacheEventsPerRead);
    res.set_content(ReplicaStateToJson(state), "application/json");
  });
  if (options.ui) SetUpUi();
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelListJson(options.model_name, static_cast<int64_t>(std::time(nullptr)),
                                  scheduler.max_model_len()),
                    "application/json");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(Endpoint::kCompletions, req, res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(Endpoint::kChatCompletions, req, res);
  });
}

void OpenAiServer::Impl::SetUpUi() {
  for (const UiAsset& asset : UiAssets()) {
    std::string pattern;  // the path as a regular expression (cpp-httplib matches them)
    for (char c : asset.path) {
      if (c == '.') pattern += '\\';
      pattern += c;
    }
    http.Get(pattern, [&asset](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(asset.body.data(), asset.body.size(), std::string(asset.content_type));
    });
  }
  // Open like /metrics: counts and timings, no request contents.
  http.Get("/ui/state", [this](const httplib::Request&, httplib::Response& res) {
    const int64_t now = NowNs();
    const UiDeployment deployment{.model_name = options.model_name,
                                  .plan = options.plan,
                                  .max_model_len = scheduler.max_model_len(),
                                  .kv_block_size = scheduler.kv_block_size(),
                                  .started_ns = started_ns};
    res.set_header("Cache-Control", "no-store");
    res.set_content(UiStateJson(deployment, scheduler.Stats(), metrics.Live(now), now),
                    "application/json");
  });
}

// Parses the body with this server's limits (max_tokens up to the scheduler's
// max_model_len) and checks that it names the served model, if any.
ApiResult<ParsedRequest> OpenAiServer::Impl::Parse(Endpoint endpoint, std::string_view body) {
  ParserLimits limits;
  limits.max_body_bytes = options.max_body_bytes;
  limits.max_tokens_limit = scheduler.max_model_len();
  ApiResult<ParsedRequest> parsed = ParseRequest(endpoint, body, limits);
  if (ParsedRequest* r = std::get_if<ParsedRequest>(&parsed)) {
    if (!r->model.empty() && r->model != options.model_name) {
      return ApiError{.http_status = 404,
                      .message = "the model '" + r->model +
                                 "' does not exist; this server "
                                 "serves '" +
                                 options.model_name + "'",
                      .param = "model",
                      .code = "model_not_found"};
    }
  }
  return parsed;
}

ResponseJson OpenAiServer::Impl::ResponseFor(const ParsedRequest& r) {
  const bool chat_endpoint = r.endpoint == Endpoint::kChatCompletions;
  ResponseFormat format{
      .endpoint = r.endpoint,
      .id = (chat_endpoint ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++),
      .created = static_cast<int64_t>(std::time(nullptr)),
      .model_name = options.model_name,
      .logprobs = r.logprobs,
      .top_logprobs = r.top_logprobs,
      .return_timing = r.return_timing,
  };
  return ResponseJson(std::move(format), tokenizer);
}

void OpenAiServer::Impl::HandleGeneration(Endpoint endpoint, const httplib::Request& req,
                                          httplib::Response& res) {
  const int64_t arrival_ns = NowNs();
  if (frame.stopping()) {
    SendError(
        res,
        {.http_status = 503, .message = "the server is shutting down", .type = "server_error"});
    return;
  }
  ApiResult<ParsedRequest> parsed = Parse(endpoint, req.body);
  if (auto* error = std::get_if<ApiError>(&parsed)) return SendError(res, *error);
  const ParsedRequest& r = std::get<ParsedRequest>(parsed);
  const BuildContext context{.tokenizer = tokenizer,
                             .chat = chat,
                             .chat_error = chat_error,
                             .max_model_len = scheduler.max_model_len(),
                             .seed_if_unset = RandomSeed()};
  ApiResult<engine::RequestParams> built = BuildRequestParams(r, context);
  if (auto* error = std::get_if<ApiError>(&built)) return SendError(res, *error);
  engine::RequestParams& params = std::get<engine::RequestParams>(built);
  const int64_t num_prompt_tokens = static_cast<int64_t>(params.prompt.size());
  const int64_t max_tokens = params.max_tokens;

  // Submit; the callbacks run on the scheduler thread and only queue events.
  auto stream = std::make_shared<RequestStream>();
  const char* endpoint_name =
      endpoint == Endpoint::kChatCompletions ? "chat_completions" : "completions";
  Result<std::shared_ptr<engine::RequestHandle>> submitted = scheduler.Submit(
      std::move(params), StreamCallbacks(stream, metrics, endpoint_name, arrival_ns));
  if (!submitted.ok()) {
    const Status& s = submitted.status();
    if (s.code() == StatusCode::kResourceExhausted) {  // the queue is full, or stopping
      res.set_header("Retry-After", "1");
      return SendError(res, {.http_status = 429,
                             .message = "the server is busy: " + s.message(),
                             .type = "rate_limit_error",
                             .code = "queue_full"});
    }
    if (s.code() == StatusCode::kInvalidArgument) {
      return SendError(res, RefusedRequestError(s, r, num_prompt_tokens, max_tokens, context));
    }
    if (s.code() == StatusCode::kUnavailable) res.set_header("Retry-After", "5");  // restarting
    return SendError(res, {.http_status = 503, .message = s.message(), .type = "server_error"});
  }

  AcceptedRequest accepted{.stream = std::move(stream),
                           .handle = *submitted,
                           .json = ResponseFor(r),
                           .echo = r.echo ? r.prompt : "",
                           .include_usage = r.include_usage};
  if (r.stream) return RespondWithEventStream(res, std::move(accepted), open_streams);
  RespondWithBody(res, std::move(accepted), open_streams);
}

OpenAiServer::OpenAiServer(engine::Scheduler& scheduler, const model::Tokenizer& tokenizer,
                           const ChatTemplate* chat, std::string chat_error, Metrics& metrics,
                           ServerOptions options)
    : impl_(std::make_unique<Impl>(scheduler, tokenizer, chat, std::move(chat_error), metrics,
                                   std::move(options))) {
  impl_->SetUp();
}

OpenAiServer::~OpenAiServer() = default;

Result<int> OpenAiServer::Bind() { return impl_->frame.Bind(); }

Status OpenAiServer::Serve() { return impl_->frame.Serve(); }

int OpenAiServer::open_streams() const { return impl_->open_streams.load(); }

void OpenAiServer::Stop() { impl_->frame.Stop(); }

}  // namespace tessera::serve
