#include "serve/upstream_call.h"

#include <httplib.h>

#include <chrono>

namespace tessera::serve {

UpstreamCall::UpstreamCall(std::string host, int port, std::string path, std::string body,
                           std::vector<std::pair<std::string, std::string>> headers,
                           UpstreamTimeouts timeouts, std::function<void()> on_finish)
    : on_finish_(std::move(on_finish)) {
  thread_ = std::thread([this, host = std::move(host), port, path = std::move(path),
                         body = std::move(body), headers = std::move(headers), timeouts]() mutable {
    Run(std::move(host), port, std::move(path), std::move(body), std::move(headers), timeouts);
  });
}

UpstreamCall::~UpstreamCall() {
  Cancel();
  thread_.join();
}

void UpstreamCall::Run(std::string host, int port, std::string path, std::string body,
                       std::vector<std::pair<std::string, std::string>> headers,
                       UpstreamTimeouts timeouts) {
  httplib::Client client(host, port);
  client.set_connection_timeout(timeouts.connect_s, 0);
  client.set_read_timeout(timeouts.read_s, 0);
  client.set_write_timeout(timeouts.write_s, 0);
  client.set_keep_alive(false);
  httplib::Request req;
  req.method = "POST";
  req.path = std::move(path);
  req.body = std::move(body);
  for (auto& [name, value] : headers) req.headers.emplace(std::move(name), std::move(value));
  req.response_handler = [this](const httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    have_headers_ = true;
    status_ = res.status;
    content_type_ = res.get_header_value("Content-Type");
    cv_.notify_all();
    return !cancelled_;
  };
  req.content_receiver = [this](const char* data, size_t n, uint64_t, uint64_t) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.append(data, n);
    cv_.notify_all();
    return !cancelled_;
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) {
      done_ = true;
      error_ = "cancelled";
      cv_.notify_all();
    } else {
      client_ = &client;
    }
  }
  if (client_ != nullptr) {
    httplib::Result result = client.send(req);
    std::lock_guard<std::mutex> lock(mu_);
    client_ = nullptr;
    done_ = true;
    ok_ = static_cast<bool>(result) && !cancelled_;
    if (!ok_) error_ = cancelled_ ? "cancelled" : httplib::to_string(result.error());
    cv_.notify_all();
  }
  if (on_finish_) on_finish_();
}

bool UpstreamCall::WaitHeaders(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return have_headers_ || done_; });
  return have_headers_ && !(done_ && !ok_);
}

UpstreamCall::Next UpstreamCall::Take(std::string* data, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
               [&] { return !pending_.empty() || done_; });
  if (!pending_.empty()) {
    data->append(pending_);
    pending_.clear();
    return Next::kData;
  }
  if (!done_) return Next::kTimeout;
  return ok_ ? Next::kEnd : Next::kFailed;
}

bool UpstreamCall::WaitDone(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_; });
  return done_ && ok_;
}

void UpstreamCall::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_ || done_) return;
  cancelled_ = true;
  if (client_ != nullptr) client_->stop();
  cv_.notify_all();
}

int UpstreamCall::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

std::string UpstreamCall::content_type() const {
  std::lock_guard<std::mutex> lock(mu_);
  return content_type_;
}

std::string UpstreamCall::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace tessera::serve
