// DpFront: the HTTP front of `tessera serve --dp N` (and of --replica URL): one
// OpenAI endpoint over N replicas, each an ordinary serving group (its own
// scheduler, KV cache and rank supervision) listening elsewhere. It routes each
// generation request (Router: round-robin, least-outstanding or prefix-affinity,
// the latter from the replicas' own prefix-cache events, which it polls from
// /internal/state with their load) and proxies it, streamed or not. Failover: a
// replica whose process exits or whose connection fails (then no longer answers)
// is marked down at once and its requests re-run on another replica from their
// prompt — a non-streamed one completes, a stream that had sent nothing goes on
// transparently, one that had sent tokens ends with an error event; when it
// answers again (restarted by its supervisor) it rejoins. /health says
// "degraded" while a replica is down; /metrics has the front's series and each
// replica's own (scraped at each request, labelled replica="i"). Layer: serve; `tessera serve --dp`
// (apps/) constructs it. Thread-safety: Bind then Serve on one thread; every other method on any
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/openai_server.h"
#include "serve/router.h"
#include "serve/upstream_call.h"

namespace tessera::serve {

struct FrontOptions {
  ServerOptions server;  // the front's own HTTP server (host, port, API key, threads…)
  RouterPolicy policy = RouterPolicy::kLeastOutstanding;
  double load_margin = 8;         // prefix-affinity: requests above the least-loaded replica
  int64_t poll_interval_ms = 50;  // /internal/state of each replica
  int64_t unavailable_after_ms = 30'000;  // no replica up for this long: 503
  int max_runs = 3;                       // runs of one request over failing replicas
  UpstreamTimeouts upstream;
  // Replicas below this index take no requests from the front (prefill/decode
  // disaggregation: the prefill instances, reached by the decode ones).
  int first_routable = 0;
};

class DpFront {
 public:
  // tokenizer and chat (both may be null: prefix-affinity then has no prompt to
  // match) must outlive the front.
  DpFront(int num_replicas, const model::Tokenizer* tokenizer, const ChatTemplate* chat,
          FrontOptions options);
  ~DpFront();

  // Where replica i listens (a local replica after each start); port 0: nowhere
  // now (its process is being restarted). The front polls it and routes to it
  // once it answers.
  void SetReplicaAddress(int replica, const std::string& host, int port);
  // Replica i is gone (its process exited, or a call to it failed and it does
  // not answer): down now; its requests in flight are re-run elsewhere.
  void MarkDown(int replica, const std::string& reason);
  void CountRestart(int replica);
  int num_replicas() const;
  int num_up() const;
  bool replica_up(int replica) const;

  Result<int> Bind();
  Status Serve();
  void Stop();
  int open_streams() const;  // responses being relayed

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::serve
