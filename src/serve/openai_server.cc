#include "serve/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "base/clock.h"
#include "serve/plain_response.h"
#include "serve/request_builder.h"
#include "serve/request_parser.h"
#include "serve/request_stream.h"
#include "serve/response_json.h"
#include "serve/sse_response.h"

namespace tessera::serve {
namespace {

// How long Stop() waits for a Serve() that was called to reach its accept loop.
constexpr int64_t kStartListeningNs = 5'000'000'000;

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

struct OpenAiServer::Impl {
  engine::Scheduler& scheduler;
  const model::Tokenizer& tokenizer;
  const ChatTemplate* chat;
  std::string chat_error;
  Metrics& metrics;
  ServerOptions options;
  httplib::Server http;
  std::atomic<bool> serving{false};  // Serve() is between its start and its return
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> next_id{0};
  // The listening socket, seen by set_socket_options before bind: Bind raises
  // its backlog past the 5 that Debian's compiled cpp-httplib passes to listen().
  std::atomic<int> listen_fd{-1};
  // Streams whose provider has not finished (the last chunk and [DONE] not yet
  // written): shutdown lets them flush before it stops the HTTP server.
  std::atomic<int> open_streams{0};
  std::mutex seed_mutex;
  std::mt19937_64 seed_rng{std::random_device{}()};

  Impl(engine::Scheduler& s, const model::Tokenizer& t, const ChatTemplate* c, std::string ce,
       Metrics& m, ServerOptions o)
      : scheduler(s),
        tokenizer(t),
        chat(c),
        chat_error(std::move(ce)),
        metrics(m),
        options(std::move(o)) {}

  void SetUp();
  void RaiseListenBacklog();
  void SendError(httplib::Response& res, const ApiError& error);
  ApiResult<ParsedRequest> Parse(Endpoint endpoint, std::string_view body);
  ResponseJson ResponseFor(const ParsedRequest& request);  // takes the next response id
  // POST /v1/completions and /v1/chat/completions: parse, build, submit, respond.
  void HandleGeneration(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  uint64_t RandomSeed() {
    std::lock_guard<std::mutex> lock(seed_mutex);
    return seed_rng();
  }
};

void OpenAiServer::Impl::SendError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  res.set_content(error.ToJson(), "application/json");
}

void OpenAiServer::Impl::SetUp() {
  const int threads = std::max(1, options.http_threads);
  // httplib owns the queue it is given (its API takes a raw pointer).
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_read_timeout(options.read_timeout_s, 0);
  http.set_write_timeout(options.write_timeout_s, 0);
  http.set_keep_alive_timeout(options.keep_alive_timeout_s);
  http.set_keep_alive_max_count(static_cast<size_t>(std::max(1, options.keep_alive_max_count)));
  http.set_payload_max_length(options.max_body_bytes);
  http.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd.store(sock);
  });

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.path.rfind("/v1/", 0) != 0) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string auth = req.get_header_value("Authorization");
    if (ConstantTimeEquals(auth, "Bearer " + options.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    ApiError error;
    error.http_status = 401;
    error.message =
        auth.empty() ? "missing 'Authorization: Bearer <key>' header" : "incorrect API key";
    error.code = "invalid_api_key";
    SendError(res, error);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib produces itself (404 route, 413 body too large, 400 bad
  // request line) get an OpenAI error object too.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError error;
        error.http_status = res.status;
        if (res.status == 404) {
          error.message = "no route " + req.method + " " + req.path;
          error.code = "not_found";
        } else if (res.status == 413) {
          error.message =
              "the request body exceeds " + std::to_string(options.max_body_bytes) + " bytes";
        } else {
          error.message = "HTTP error " + std::to_string(res.status);
        }
        SendError(res, error);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        ApiError error;
        error.http_status = 500;
        error.type = "internal_error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          error.message = std::string("internal error: ") + e.what();
        } catch (...) {
          error.message = "internal error";
        }
        SendError(res, error);
      });
  http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    if (res.status >= 400) metrics.CountHttpError(res.status);
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping.load()) {
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
  if (stopping.load()) {
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

Result<int> OpenAiServer::Bind() {
  const ServerOptions& o = impl_->options;
  if (o.port == 0) {
    const int port = impl_->http.bind_to_any_port(o.host);
    if (port <= 0) return UnavailableError("cannot bind " + o.host + " to any port");
    impl_->RaiseListenBacklog();
    return port;
  }
  if (!impl_->http.bind_to_port(o.host, o.port)) {
    return UnavailableError("cannot bind " + o.host + ":" + std::to_string(o.port) +
                            " (in use, or not an address of this host)");
  }
  impl_->RaiseListenBacklog();
  return o.port;
}

// A burst of connects (hundreds of clients at once) overflows a backlog of 5:
// the kernel drops the handshakes and clients see resets. Listening again on the
// bound socket only raises the backlog.
void OpenAiServer::Impl::RaiseListenBacklog() {
  if (const int fd = listen_fd.load(); fd >= 0) ::listen(fd, SOMAXCONN);
}

Status OpenAiServer::Serve() {
  // httplib's stop() does nothing until the accept loop runs: a Stop() that came
  // first must not leave this thread in accept() for good (see Stop()).
  impl_->serving.store(true);
  if (impl_->stopping.load()) {
    impl_->serving.store(false);
    return Status::Ok();
  }
  const bool listened = impl_->http.listen_after_bind();
  impl_->serving.store(false);  // nothing left for Stop() to wait for
  if (!listened && !impl_->stopping.load()) {
    return InternalError("the HTTP server's listening socket failed");
  }
  return Status::Ok();
}

int OpenAiServer::open_streams() const { return impl_->open_streams.load(); }

void OpenAiServer::Stop() {
  impl_->stopping.store(true);
  if (impl_->serving.load()) {
    // Serve() is entering its accept loop (or is in it): wait for it to run, or
    // stop() would be a no-op and accept() would block for ever.
    const int64_t deadline = NowNs() + kStartListeningNs;
    while (impl_->serving.load() && !impl_->http.is_running() && NowNs() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  impl_->http.stop();
}

}  // namespace tessera::serve
