// HttpFrame: the cpp-httplib server both HTTP fronts of tessera serve stand on —
// OpenAiServer (one engine) and DpFront (data-parallel replicas): its worker pool,
// timeouts and body limit from ServerOptions, bearer-token auth on /v1/*, OpenAI
// error objects for the errors httplib produces itself and for exceptions, a
// listen backlog that survives a burst of connects, and the Bind/Serve/Stop
// handshake (a Stop that comes before Serve's accept loop still stops it). The
// routes are the owner's (http()). Layer: serve; internal to src/serve (.cc files).
// Thread-safety: Bind then Serve on one thread; Stop and stopping from any thread.
#pragma once

#include <httplib.h>

#include <atomic>
#include <functional>

#include "base/status.h"
#include "serve/openai_server.h"
#include "serve/request_parser.h"

namespace tessera::serve {

// res := the error's status and its OpenAI error object.
void SendApiError(httplib::Response& res, const ApiError& error);

class HttpFrame {
 public:
  // count_error(status) is called for every response >= 400 (metrics).
  HttpFrame(const ServerOptions& options, std::function<void(int status)> count_error);

  httplib::Server& http() { return http_; }
  // Binds options.host:options.port (0: any port); returns the bound port.
  Result<int> Bind();
  // Serves until Stop(); Internal if the listening socket fails.
  Status Serve();
  // Stops listening and returns once the open handlers finished.
  void Stop();
  bool stopping() const { return stopping_.load(); }

 private:
  const ServerOptions options_;
  httplib::Server http_;
  std::atomic<bool> serving_{false};  // Serve() is between its start and its return
  std::atomic<bool> stopping_{false};
  // The listening socket, seen by set_socket_options before bind: Bind raises
  // its backlog past the 5 that Debian's compiled cpp-httplib passes to listen().
  std::atomic<int> listen_fd_{-1};
};

}  // namespace tessera::serve
