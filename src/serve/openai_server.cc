#include "serve/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "base/clock.h"
#include "model/sampler.h"
#include "serve/request_parser.h"

namespace tessera::serve {
namespace {

using nlohmann::json;

constexpr auto kStreamPollInterval = std::chrono::milliseconds(200);
constexpr int64_t kStreamPingNs = 1'000'000'000;  // an SSE comment after 1 s of silence
// A non-streaming request done within this gets a plain response (any status); a
// longer one is answered 200 with keep-alive whitespace that finds a vanished client.
constexpr auto kPlainBodyWait = std::chrono::milliseconds(1000);
// How long Stop() waits for a Serve() that was called to reach its accept loop.
constexpr int64_t kStartListeningNs = 5'000'000'000;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// What the scheduler's callbacks hand to the HTTP thread of one request.
struct RequestStream {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<engine::TokenEvent> events;
  std::optional<engine::RequestResult> result;
};

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

json BytesOf(std::string_view s) {
  json bytes = json::array();
  for (char c : s) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
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
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.Render(scheduler.Stats()), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", options.model_name},
                  {"object", "model"},
                  {"created", static_cast<int64_t>(std::time(nullptr))},
                  {"owned_by", "tessera"},
                  {"max_model_len", options.max_model_len}};
    res.set_content(Dump(json{{"object", "list"}, {"data", json::array({model})}}),
                    "application/json");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(Endpoint::kCompletions, req, res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(Endpoint::kChatCompletions, req, res);
  });
}

void OpenAiServer::Impl::HandleGeneration(Endpoint endpoint, const httplib::Request& req,
                                          httplib::Response& res) {
  const int64_t arrival_ns = NowNs();
  const bool chat_endpoint = endpoint == Endpoint::kChatCompletions;
  if (stopping.load()) {
    SendError(
        res,
        {.http_status = 503, .message = "the server is shutting down", .type = "server_error"});
    return;
  }
  ParserLimits limits;
  limits.max_body_bytes = options.max_body_bytes;
  limits.max_tokens_limit = options.max_model_len;
  ApiResult<ParsedRequest> parsed = ParseRequest(endpoint, req.body, limits);
  if (auto* error = std::get_if<ApiError>(&parsed)) return SendError(res, *error);
  ParsedRequest& r = std::get<ParsedRequest>(parsed);
  if (!r.model.empty() && r.model != options.model_name) {
    return SendError(res, {.http_status = 404,
                           .message = "the model '" + r.model +
                                      "' does not exist; this server "
                                      "serves '" +
                                      options.model_name + "'",
                           .param = "model",
                           .code = "model_not_found"});
  }

  // The prompt's tokens.
  engine::RequestParams params;
  if (chat_endpoint) {
    if (chat == nullptr) {
      return SendError(
          res, {.message = chat_error, .param = "messages", .code = "chat_template_unavailable"});
    }
    Result<std::string> text = chat->Render(r.messages);
    if (!text.ok()) {
      return SendError(res, {.message = text.status().message(), .param = "messages"});
    }
    params.prompt = tokenizer.Encode(*text, {.add_special = false, .parse_special = true});
  } else if (r.prompt_is_tokens) {
    for (int32_t id : r.prompt_tokens) {
      if (id >= tokenizer.vocab_size()) {
        return SendError(
            res, {.message = "token id " + std::to_string(id) + " is outside the vocabulary (" +
                             std::to_string(tokenizer.vocab_size()) + " tokens)",
                  .param = "prompt"});
      }
    }
    params.prompt = r.prompt_tokens;
  } else {
    params.prompt = tokenizer.Encode(r.prompt);
  }
  const int64_t prompt_len = static_cast<int64_t>(params.prompt.size());
  if (prompt_len == 0) {
    return SendError(res, {.message = "the prompt encodes to no tokens", .param = "prompt"});
  }
  const int64_t room = options.max_model_len - prompt_len;
  if (room < 1) {
    return SendError(res, {.message = "the prompt is " + std::to_string(prompt_len) +
                                      " tokens; this model's context is " +
                                      std::to_string(options.max_model_len) +
                                      " tokens, which leaves no room to generate",
                           .param = chat_endpoint ? "messages" : "prompt",
                           .code = "context_length_exceeded"});
  }
  if (r.max_tokens) {
    if (*r.max_tokens > room) {
      return SendError(
          res, {.message = "prompt (" + std::to_string(prompt_len) + " tokens) + max_tokens (" +
                           std::to_string(*r.max_tokens) + ") exceeds the context of " +
                           std::to_string(options.max_model_len) + " tokens",
                .param = "max_tokens",
                .code = "context_length_exceeded"});
    }
    params.max_tokens = *r.max_tokens;
  } else {
    params.max_tokens = chat_endpoint ? room : std::min<int64_t>(16, room);
  }
  params.sampling.temperature = r.temperature;
  params.sampling.top_p = r.top_p;
  params.sampling.top_k = r.top_k;
  params.sampling.min_p = r.min_p;
  params.sampling.repeat_penalty = r.repetition_penalty;
  params.sampling.seed = r.seed ? *r.seed : RandomSeed();
  if (Status s = model::ValidateSamplingParams(params.sampling); !s.ok()) {
    return SendError(res, {.message = s.message()});
  }
  params.stop = r.stop;
  params.ignore_eos = r.ignore_eos;
  params.top_logprobs = r.logprobs ? std::max(1, r.top_logprobs) : 0;

  // Submit; the callbacks run on the scheduler thread and only queue events.
  auto stream = std::make_shared<RequestStream>();
  auto first_token_ns = std::make_shared<int64_t>(0);
  auto last_token_ns = std::make_shared<int64_t>(0);
  const std::string endpoint_name = chat_endpoint ? "chat_completions" : "completions";
  engine::RequestCallbacks callbacks;
  callbacks.on_token = [stream, first_token_ns, last_token_ns](const engine::TokenEvent& event) {
    const int64_t now = NowNs();
    if (*first_token_ns == 0) *first_token_ns = now;
    *last_token_ns = now;
    std::lock_guard<std::mutex> lock(stream->mutex);
    stream->events.push_back(event);
    stream->cv.notify_all();
  };
  callbacks.on_done = [this, stream, first_token_ns, last_token_ns, arrival_ns,
                       endpoint_name](const engine::RequestResult& result) {
    const int64_t now = NowNs();
    const double ttft = *first_token_ns ? (*first_token_ns - arrival_ns) * 1e-9 : -1.0;
    const double tpot = result.completion_tokens > 1
                            ? (*last_token_ns - *first_token_ns) * 1e-9 /
                                  static_cast<double>(result.completion_tokens - 1)
                            : -1.0;
    metrics.ObserveRequest(endpoint_name, engine::FinishReasonName(result.reason), ttft, tpot,
                           (now - arrival_ns) * 1e-9);
    metrics.ObserveTiming(result.timing);
    std::lock_guard<std::mutex> lock(stream->mutex);
    stream->result = result;
    stream->cv.notify_all();
  };
  Result<std::shared_ptr<engine::RequestHandle>> submitted =
      scheduler.Submit(std::move(params), std::move(callbacks));
  if (!submitted.ok()) {
    const Status& s = submitted.status();
    if (s.code() == StatusCode::kResourceExhausted) {
      res.set_header("Retry-After", "1");
      return SendError(res, {.http_status = 429,
                             .message = "the server is busy: " + s.message(),
                             .type = "rate_limit_error",
                             .code = "queue_full"});
    }
    if (s.code() == StatusCode::kInvalidArgument) {
      return SendError(res, {.message = s.message()});
    }
    return SendError(res, {.http_status = 503, .message = s.message(), .type = "server_error"});
  }
  std::shared_ptr<engine::RequestHandle> handle = *submitted;

  const std::string id = (chat_endpoint ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const std::string object = chat_endpoint ? "chat.completion" : "text_completion";
  const std::string model_name = options.model_name;
  const bool want_logprobs = r.logprobs;
  const int32_t top_n = r.top_logprobs;
  const model::Tokenizer& tok = tokenizer;

  // Log-probabilities of a batch of tokens, in the endpoint's format.
  auto logprobs_json = [&tok, chat_endpoint, top_n](const std::vector<engine::TokenEvent>& events,
                                                    int64_t* text_offset) -> json {
    if (chat_endpoint) {
      json content = json::array();
      for (const engine::TokenEvent& e : events) {
        const std::string piece = tok.TokenPiece(e.token);
        json top = json::array();
        for (size_t i = 0; i < e.top_logprobs.size() && static_cast<int32_t>(i) < top_n; ++i) {
          const std::string p = tok.TokenPiece(e.top_logprobs[i].first);
          top.push_back(
              {{"token", p}, {"logprob", e.top_logprobs[i].second}, {"bytes", BytesOf(p)}});
        }
        content.push_back({{"token", piece},
                           {"logprob", e.logprob},
                           {"bytes", BytesOf(piece)},
                           {"top_logprobs", top}});
      }
      return json{{"content", content}};
    }
    json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
         offsets = json::array();
    for (const engine::TokenEvent& e : events) {
      tokens.push_back(tok.TokenPiece(e.token));
      token_logprobs.push_back(e.logprob);
      json alternatives = json::object();
      for (size_t i = 0; i < e.top_logprobs.size() && static_cast<int32_t>(i) < top_n; ++i) {
        alternatives[tok.TokenPiece(e.top_logprobs[i].first)] = e.top_logprobs[i].second;
      }
      top.push_back(alternatives);
      offsets.push_back(*text_offset);
      *text_offset += static_cast<int64_t>(e.text.size());
    }
    return json{{"tokens", tokens},
                {"token_logprobs", token_logprobs},
                {"top_logprobs", top},
                {"text_offset", offsets}};
  };
  auto usage_json = [return_timing = r.return_timing](const engine::RequestResult& result) {
    json usage = {{"prompt_tokens", result.prompt_tokens},
                  {"completion_tokens", result.completion_tokens},
                  {"total_tokens", result.prompt_tokens + result.completion_tokens}};
    if (return_timing) {
      const engine::RequestTiming& t = result.timing;
      usage["tessera_timing"] = {{"queue_ms", t.queue_s * 1e3},
                                 {"prefill_ms", t.prefill_s * 1e3},
                                 {"decode_ms", t.decode_s * 1e3},
                                 {"comm_ms", t.comm_s * 1e3}};
    }
    return usage;
  };
  const std::string echo = r.echo ? r.prompt : "";

  if (!r.stream) {
    // The whole body once the request is done: (HTTP status, JSON).
    auto finished_body = [=](const std::vector<engine::TokenEvent>& events,
                             const engine::RequestResult& result) -> std::pair<int, std::string> {
      if (result.reason == engine::FinishReason::kError) {
        return {500, ApiError{.http_status = 500,
                              .message = "generation failed: " + result.error.message(),
                              .type = "server_error"}
                         .ToJson()};
      }
      if (result.reason == engine::FinishReason::kCancelled) {
        return {503, ApiError{.http_status = 503,
                              .message = "the request was cancelled (the server is shutting down)",
                              .type = "server_error"}
                         .ToJson()};
      }
      std::string text = echo;
      for (const engine::TokenEvent& e : events) text += e.text;
      int64_t offset = static_cast<int64_t>(echo.size());
      json choice = {{"index", 0}, {"finish_reason", engine::FinishReasonName(result.reason)}};
      json lp = want_logprobs ? logprobs_json(events, &offset) : json(nullptr);
      if (chat_endpoint) {
        choice["message"] = {{"role", "assistant"}, {"content", text}};
      } else {
        choice["text"] = text;
      }
      choice["logprobs"] = lp;
      json body = {{"id", id},
                   {"object", object},
                   {"created", created},
                   {"model", model_name},
                   {"choices", json::array({choice})},
                   {"usage", usage_json(result)}};
      return {200, Dump(body)};
    };
    // Waits up to `timeout` for the result; true with the body when it came.
    auto wait_result = [stream](std::chrono::milliseconds timeout,
                                std::vector<engine::TokenEvent>* events,
                                engine::RequestResult* result) {
      std::unique_lock<std::mutex> lock(stream->mutex);
      if (!stream->cv.wait_for(lock, timeout, [&] { return stream->result.has_value(); })) {
        return false;
      }
      events->assign(stream->events.begin(), stream->events.end());
      *result = *stream->result;
      return true;
    };
    std::vector<engine::TokenEvent> events;
    engine::RequestResult result;
    if (wait_result(kPlainBodyWait, &events, &result)) {
      auto [status, body] = finished_body(events, result);
      res.status = status;
      res.set_content(body, "application/json");
      return;
    }
    // A long request: answer 200 now and send its JSON when done, with a space (valid
    // leading JSON whitespace) after each second of silence, so that a client that
    // went away fails a write and the request is cancelled and its KV blocks freed,
    // as for streams. A failure from here on is an error object in the 200 body.
    auto last_write_ns = std::make_shared<int64_t>(NowNs());
    ++open_streams;
    res.set_chunked_content_provider(
        "application/json",
        [=](size_t, httplib::DataSink& sink) {
          std::vector<engine::TokenEvent> done_events;
          engine::RequestResult done;
          if (wait_result(kStreamPollInterval, &done_events, &done)) {
            const std::string body = finished_body(done_events, done).second;
            if (!sink.write(body.data(), body.size())) return false;
            sink.done();
            return true;
          }
          if (NowNs() - *last_write_ns > kStreamPingNs) {
            *last_write_ns = NowNs();
            if (!sink.write(" ", 1)) {
              handle->Cancel();
              return false;
            }
          }
          return true;
        },
        [this, handle](bool success) {
          if (!success) handle->Cancel();  // the client disconnected
          --open_streams;
        });
    return;
  }

  // Streaming: the provider runs on this connection's thread after the handler returns.
  const bool include_usage = r.include_usage;
  auto sent_role = std::make_shared<bool>(false);
  auto offset = std::make_shared<int64_t>(0);
  auto last_write_ns = std::make_shared<int64_t>(NowNs());
  auto pending_echo = std::make_shared<std::string>(echo);
  auto chunk = [id, created, model_name, chat_endpoint](json delta_or_text, json logprobs,
                                                        json finish_reason) {
    const std::string object = chat_endpoint ? "chat.completion.chunk" : "text_completion";
    json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
    if (chat_endpoint) {
      choice["delta"] = std::move(delta_or_text);
    } else {
      choice["text"] = std::move(delta_or_text);
    }
    json body = {{"id", id},
                 {"object", object},
                 {"created", created},
                 {"model", model_name},
                 {"choices", json::array({choice})}};
    return "data: " + Dump(body) + "\n\n";
  };
  res.set_header("Cache-Control", "no-cache");
  ++open_streams;
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        std::vector<engine::TokenEvent> events;
        std::optional<engine::RequestResult> result;
        {
          std::unique_lock<std::mutex> lock(stream->mutex);
          stream->cv.wait_for(lock, kStreamPollInterval, [&] {
            return !stream->events.empty() || stream->result.has_value();
          });
          events.assign(stream->events.begin(), stream->events.end());
          stream->events.clear();
          result = stream->result;
        }
        auto write = [&](const std::string& s) {
          *last_write_ns = NowNs();
          return sink.write(s.data(), s.size());
        };
        std::string out;
        if (chat_endpoint && !*sent_role) {
          out += chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
          *sent_role = true;
        }
        if (!events.empty() || !pending_echo->empty()) {
          std::string text = *pending_echo;
          pending_echo->clear();
          for (const engine::TokenEvent& e : events) text += e.text;
          json lp = want_logprobs && !events.empty() ? logprobs_json(events, offset.get())
                                                     : json(nullptr);
          out += chunk(chat_endpoint ? json{{"content", text}} : json(text), lp, nullptr);
        }
        if (result) {
          if (result->reason == engine::FinishReason::kError) {
            out += "data: " +
                   ApiError{.http_status = 500,
                            .message = "generation failed: " + result->error.message(),
                            .type = "server_error"}
                       .ToJson() +
                   "\n\n";
          } else {
            out += chunk(chat_endpoint ? json::object() : json(""), nullptr,
                         engine::FinishReasonName(result->reason));
          }
          if (include_usage) {
            json body = {{"id", id},
                         {"object", chat_endpoint ? "chat.completion.chunk" : "text_completion"},
                         {"created", created},
                         {"model", model_name},
                         {"choices", json::array()},
                         {"usage", usage_json(*result)}};
            out += "data: " + Dump(body) + "\n\n";
          }
          out += "data: [DONE]\n\n";
          if (!write(out)) return false;
          sink.done();
          return true;
        }
        // Silence: a comment line finds a client that went away (its write fails).
        if (out.empty() && NowNs() - *last_write_ns > kStreamPingNs) out = ": ping\n\n";
        if (!out.empty() && !write(out)) {
          handle->Cancel();
          return false;
        }
        return true;
      },
      [this, handle](bool success) {
        if (!success) handle->Cancel();  // the client disconnected mid-stream
        --open_streams;
      });
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
