// OpenAiServer: the OpenAI-compatible HTTP API over one engine::Scheduler —
// POST /v1/completions and /v1/chat/completions (JSON or SSE streaming), GET
// /v1/models, /health and /metrics — with bearer-token auth on /v1/*, OpenAI-style
// error objects, 429 + Retry-After when the scheduler's queue is full, and
// cancellation of a streaming request whose client went away. cpp-httplib does
// the HTTP; its thread pool, timeouts and body limit come from ServerOptions (see
// docs/serve.md). The request limits (context length, token ids, sampling values)
// are the scheduler's; its refusals become OpenAI errors (request_builder). Layer:
// serve; `tessera serve` and tests/serve construct it.
// Thread-safety: Bind then Serve on one thread; Stop from any thread (a signal
// watcher), once the scheduler has been stopped or is stopping.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "engine/scheduler.h"
#include "model/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/metrics.h"

namespace tessera::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                     // 0: an ephemeral port (Bind returns it)
  std::string api_key;                 // non-empty: /v1/* needs "Authorization: Bearer <api_key>"
  std::string model_name = "tessera";  // what /v1/models lists and requests must name
  size_t max_body_bytes = 1 << 20;
  // HTTP worker threads: each open connection (idle keep-alive included) holds one
  // while it is served; streams hold theirs until the last token.
  int http_threads = 256;
  int read_timeout_s = 10;       // a client that sends nothing for this long is dropped
  int write_timeout_s = 10;      // a client that reads nothing for this long is dropped
  int keep_alive_timeout_s = 2;  // idle keep-alive connections are closed after this
  int keep_alive_max_count = 100;
  // The live view: GET / (the page), /ui/app.js, /ui/style.css and /ui/state (its
  // JSON, ui_state.h); false (--no-ui): those routes answer 404.
  bool ui = true;
  std::string plan;  // the parallel plan the view shows ("" for one rank)
};

class OpenAiServer {
 public:
  // `chat` may be null: chat requests then get 400 with `chat_error` as message.
  // scheduler, tokenizer, chat and metrics must outlive the server.
  OpenAiServer(engine::Scheduler& scheduler, const model::Tokenizer& tokenizer,
               const ChatTemplate* chat, std::string chat_error, Metrics& metrics,
               ServerOptions options);
  ~OpenAiServer();

  // Binds host:port; returns the bound port. Unavailable when it is taken.
  Result<int> Bind();
  // Serves until Stop(); Internal if the listening socket fails.
  Status Serve();
  // Refuses new requests (503), stops listening and returns once the open
  // handlers finished (streams end when the scheduler finishes their requests).
  void Stop();
  // Streaming responses not yet finished (their last chunk and [DONE] unwritten), and
  // non-streaming ones answered early to watch for a vanished client (not yet sent).
  int open_streams() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::serve
