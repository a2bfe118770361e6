// UpstreamCall: one request the data-parallel front forwards to a replica, run
// on its own thread (cpp-httplib's client blocks) so that the front's handler can
// wait for the status line, relay the body piece by piece as it arrives (an SSE
// stream), and give up on it — Cancel() shuts the socket, from any thread (the
// front does when it marks the replica down). Layer: serve; DpFront uses it.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace httplib {
class Client;
}

namespace tessera::serve {

struct UpstreamTimeouts {
  int connect_s = 2;
  int read_s = 30;  // replicas write something every second (tokens, pings, spaces)
  int write_s = 10;
};

class UpstreamCall {
 public:
  // Starts POST path with `body` and `headers` to host:port; on_finish runs on
  // the call's thread once the call is over (answered, failed or cancelled).
  UpstreamCall(std::string host, int port, std::string path, std::string body,
               std::vector<std::pair<std::string, std::string>> headers, UpstreamTimeouts timeouts,
               std::function<void()> on_finish);
  ~UpstreamCall();  // cancels and joins
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;

  enum class Next { kData, kTimeout, kEnd, kFailed };
  // Waits up to timeout_ms for the response's headers: true once they are there
  // (status(), content_type()), false when the call failed first or time ran out.
  bool WaitHeaders(int64_t timeout_ms);
  // The body that arrived since the last call (appended to *data): kData; nothing
  // within timeout_ms: kTimeout; the body ended: kEnd; the call failed (the
  // replica closed the connection or timed out, or Cancel): kFailed.
  Next Take(std::string* data, int64_t timeout_ms);
  // Waits until the call is over; true when it was answered in full.
  bool WaitDone(int64_t timeout_ms);
  void Cancel();

  int status() const;
  std::string content_type() const;
  std::string error() const;  // why it failed

 private:
  void Run(std::string host, int port, std::string path, std::string body,
           std::vector<std::pair<std::string, std::string>> headers, UpstreamTimeouts timeouts);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  httplib::Client* client_ = nullptr;  // while the call runs (Cancel stops it)
  bool cancelled_ = false;
  bool have_headers_ = false;
  bool done_ = false;
  bool ok_ = false;
  int status_ = 0;
  std::string content_type_;
  std::string pending_;  // body not taken yet
  std::string error_;
  std::function<void()> on_finish_;
  std::thread thread_;
};

}  // namespace tessera::serve
