#include "serve/http_frame.h"

#include <sys/socket.h>

#include <chrono>
#include <exception>
#include <string_view>
#include <thread>
#include <utility>

#include "base/clock.h"

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

void SendApiError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  res.set_content(error.ToJson(), "application/json");
}

HttpFrame::HttpFrame(const ServerOptions& options, std::function<void(int status)> count_error)
    : options_(options) {
  const int threads = std::max(1, options_.http_threads);
  // httplib owns the queue it is given (its API takes a raw pointer).
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_.set_read_timeout(options_.read_timeout_s, 0);
  http_.set_write_timeout(options_.write_timeout_s, 0);
  http_.set_keep_alive_timeout(options_.keep_alive_timeout_s);
  http_.set_keep_alive_max_count(static_cast<size_t>(std::max(1, options_.keep_alive_max_count)));
  http_.set_payload_max_length(options_.max_body_bytes);
  http_.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_.store(sock);
  });

  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string auth = req.get_header_value("Authorization");
    if (ConstantTimeEquals(auth, "Bearer " + options_.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    ApiError error;
    error.http_status = 401;
    error.message =
        auth.empty() ? "missing 'Authorization: Bearer <key>' header" : "incorrect API key";
    error.code = "invalid_api_key";
    SendApiError(res, error);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib produces itself (404 route, 413 body too large, 400 bad
  // request line) get an OpenAI error object too.
  http_.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError error;
        error.http_status = res.status;
        if (res.status == 404) {
          error.message = "no route " + req.method + " " + req.path;
          error.code = "not_found";
        } else if (res.status == 413) {
          error.message =
              "the request body exceeds " + std::to_string(options_.max_body_bytes) + " bytes";
        } else {
          error.message = "HTTP error " + std::to_string(res.status);
        }
        SendApiError(res, error);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http_.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
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
        SendApiError(res, error);
      });
  http_.set_logger(
      [count = std::move(count_error)](const httplib::Request&, const httplib::Response& res) {
        if (res.status >= 400) count(res.status);
      });
}

Result<int> HttpFrame::Bind() {
  const ServerOptions& o = options_;
  int port = o.port;
  if (o.port == 0) {
    port = http_.bind_to_any_port(o.host);
    if (port <= 0) return UnavailableError("cannot bind " + o.host + " to any port");
  } else if (!http_.bind_to_port(o.host, o.port)) {
    return UnavailableError("cannot bind " + o.host + ":" + std::to_string(o.port) +
                            " (in use, or not an address of this host)");
  }
  // A burst of connects (hundreds of clients at once) overflows a backlog of 5:
  // the kernel drops the handshakes and clients see resets. Listening again on the
  // bound socket only raises the backlog.
  if (const int fd = listen_fd_.load(); fd >= 0) ::listen(fd, SOMAXCONN);
  return port;
}

Status HttpFrame::Serve() {
  // httplib's stop() does nothing until the accept loop runs: a Stop() that came
  // first must not leave this thread in accept() for good (see Stop()).
  serving_.store(true);
  if (stopping_.load()) {
    serving_.store(false);
    return Status::Ok();
  }
  const bool listened = http_.listen_after_bind();
  serving_.store(false);  // nothing left for Stop() to wait for
  if (!listened && !stopping_.load()) {
    return InternalError("the HTTP server's listening socket failed");
  }
  return Status::Ok();
}

void HttpFrame::Stop() {
  stopping_.store(true);
  if (serving_.load()) {
    // Serve() is entering its accept loop (or is in it): wait for it to run, or
    // stop() would be a no-op and accept() would block for ever.
    const int64_t deadline = NowNs() + kStartListeningNs;
    while (serving_.load() && !http_.is_running() && NowNs() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  http_.stop();
}

}  // namespace tessera::serve
