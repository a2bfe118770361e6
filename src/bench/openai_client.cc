#include "bench/openai_client.h"

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "bench/sse_parser.h"

namespace tessera::bench {
namespace {

constexpr size_t kMaxErrorBodyBytes = 300;

double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

void ApplyTimeouts(httplib::Client& client, double timeout_s) {
  const auto whole = static_cast<time_t>(std::floor(timeout_s));
  const auto usec = static_cast<time_t>((timeout_s - static_cast<double>(whole)) * 1e6);
  client.set_connection_timeout(whole, usec);
  client.set_read_timeout(whole, usec);
  client.set_write_timeout(whole, usec);
}

httplib::Headers MakeHeaders(const EndpointOptions& options) {
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  return headers;
}

std::string Truncated(std::string text) {
  if (text.size() > kMaxErrorBodyBytes) {
    text.resize(kMaxErrorBodyBytes);
    text += "…";
  }
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

// httplib's error names ("Connection", "Read") as a sentence a user can act on.
std::string DescribeError(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return "could not connect (connection refused or host unreachable)";
    case httplib::Error::ConnectionTimeout:
      return "connect timed out (--timeout)";
    case httplib::Error::Read:
      return "reading the response failed (server closed the connection, or no data within "
             "--timeout)";
    case httplib::Error::Write:
      return "sending the request failed (server closed the connection)";
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification:
      return "TLS failed (" + httplib::to_string(error) + ")";
    default:
      return "HTTP client error " + httplib::to_string(error);
  }
}

}  // namespace

bool IsChatEndpoint(std::string_view endpoint) {
  return endpoint.ends_with("/chat/completions") || endpoint.ends_with("/chat/completions/");
}

std::string BuildRequestBody(const EndpointOptions& options, const BenchRequest& request) {
  nlohmann::json body;
  body["model"] = options.model;
  if (IsChatEndpoint(options.endpoint)) {
    body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", request.prompt}}});
    body["max_completion_tokens"] = request.max_output_tokens;
  } else {
    body["prompt"] = request.prompt;
  }
  body["max_tokens"] = request.max_output_tokens;
  body["temperature"] = 0.0;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  return body.dump();
}

Result<BaseUrl> ParseBaseUrl(std::string_view base_url) {
  const size_t scheme_end = base_url.find("://");
  if (scheme_end == std::string_view::npos ||
      (base_url.substr(0, scheme_end) != "http" && base_url.substr(0, scheme_end) != "https")) {
    return InvalidArgumentError("--base-url must start with http:// or https://, not '" +
                                std::string(base_url) + "'");
  }
  const size_t path_start = base_url.find('/', scheme_end + 3);
  BaseUrl url;
  url.scheme_host_port = std::string(base_url.substr(0, path_start));
  if (url.scheme_host_port.size() == scheme_end + 3) {
    return InvalidArgumentError("--base-url '" + std::string(base_url) + "' has no host");
  }
  if (path_start != std::string_view::npos) {
    url.path_prefix = std::string(base_url.substr(path_start));
    while (!url.path_prefix.empty() && url.path_prefix.back() == '/') url.path_prefix.pop_back();
  }
  return url;
}

RequestOutcome SendStreamingRequest(const EndpointOptions& options, const BenchRequest& request) {
  RequestOutcome out;
  try {
    Result<BaseUrl> url = ParseBaseUrl(options.base_url);
    if (!url.ok()) {
      out.error = url.status().message();
      return out;
    }
    httplib::Client client(url->scheme_host_port);
    if (!client.is_valid()) {
      out.error = "cannot make an HTTP client for " + url->scheme_host_port;
      return out;
    }
    ApplyTimeouts(client, options.timeout_s);

    httplib::Request http;
    http.method = "POST";
    http.path = url->path_prefix + options.endpoint;
    http.headers = MakeHeaders(options);
    http.headers.emplace("Accept", "text/event-stream");
    http.set_header("Content-Type", "application/json");
    http.body = BuildRequestBody(options, request);

    int status = 0;
    std::string error_body;  // a non-200 response's body
    std::string stream_error;
    bool timed_out = false;
    bool saw_text = false;
    SseParser parser;
    const Clock::time_point start = Clock::now();
    Clock::time_point last_text = start;
    Clock::time_point now = start;
    const SseParser::DataCallback on_data = [&](std::string_view data) {
      Result<StreamChunk> chunk = ParseStreamChunk(data);
      if (!chunk.ok()) {
        if (stream_error.empty()) stream_error = chunk.status().message();
        return;
      }
      if (!chunk->error.empty() && stream_error.empty()) stream_error = chunk->error;
      if (chunk->prompt_tokens) out.prompt_tokens = *chunk->prompt_tokens;
      if (chunk->cached_tokens) out.cached_tokens = *chunk->cached_tokens;
      if (chunk->completion_tokens) {
        out.output_tokens = *chunk->completion_tokens;
        out.output_tokens_from_usage = true;
      }
      if (chunk->text.empty()) return;
      if (!saw_text) {
        out.ttft_s = SecondsBetween(start, now);
        saw_text = true;
      } else {
        out.itl_s.push_back(SecondsBetween(last_text, now));
      }
      last_text = now;
      ++out.num_text_chunks;
      out.text += chunk->text;
    };
    http.response_handler = [&](const httplib::Response& response) {
      status = response.status;
      return true;
    };
    http.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      now = Clock::now();
      if (status != 200) {
        if (error_body.size() < kMaxErrorBodyBytes) error_body.append(data, size);
        return true;
      }
      parser.Feed(std::string_view(data, size), on_data);
      if (SecondsBetween(start, now) > options.timeout_s) {
        timed_out = true;
        return false;
      }
      return stream_error.empty();
    };

    httplib::Result result = client.send(http);
    now = Clock::now();
    if (status == 200) parser.Finish(on_data);
    out.e2e_s = SecondsBetween(start, now);
    out.http_status = result ? result->status : status;
    if (timed_out) {
      out.error = "timed out after " + std::to_string(options.timeout_s) + " s (--timeout)";
    } else if (!stream_error.empty()) {
      out.error = "stream error: " + Truncated(stream_error);
    } else if (!result) {
      if (status != 0 && status != 200) {
        out.error = "HTTP " + std::to_string(status) + ": " + Truncated(error_body);
      } else {
        out.error =
            "POST " + url->scheme_host_port + http.path + ": " + DescribeError(result.error());
      }
    } else if (result->status != 200) {
      if (error_body.empty()) error_body = result->body;
      out.error = "HTTP " + std::to_string(result->status) + ": " + Truncated(error_body);
    } else if (!saw_text) {
      out.error = "the stream ended without any generated text";
    } else {
      out.ok = true;
      if (!out.output_tokens_from_usage) out.output_tokens = out.num_text_chunks;
    }
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = std::string("exception: ") + e.what();
  }
  return out;
}

Result<std::string> FetchFirstModelId(const EndpointOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(BaseUrl url, ParseBaseUrl(options.base_url));
  httplib::Client client(url.scheme_host_port);
  if (!client.is_valid()) return InvalidArgumentError("cannot connect to " + options.base_url);
  ApplyTimeouts(client, std::min(options.timeout_s, 30.0));
  const std::string path = url.path_prefix + "/v1/models";
  httplib::Result result = client.Get(path, MakeHeaders(options));
  if (!result) {
    return UnavailableError("GET " + options.base_url + "/v1/models failed: " +
                            DescribeError(result.error()) + " (is the server up? or pass --model)");
  }
  if (result->status != 200) {
    return UnavailableError("GET " + path + " answered HTTP " + std::to_string(result->status) +
                            ": " + Truncated(result->body) + " (pass --model)");
  }
  nlohmann::json j = nlohmann::json::parse(result->body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_array() ||
      j["data"].empty() || !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return InvalidArgumentError(
        "GET " + path + " did not list a model id: " + Truncated(result->body) + " (pass --model)");
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace tessera::bench
