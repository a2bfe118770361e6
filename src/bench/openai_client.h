// A streaming client for one OpenAI-compatible completion request (tessera serve,
// llama-server, vLLM, …): sends the request with `stream: true` and timestamps
// every streamed text chunk. Layer: bench; used by the serve benchmark runner.
// Thread-safe: each call opens its own connection.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "bench/dataset.h"

namespace tessera::bench {

struct EndpointOptions {
  std::string base_url = "http://127.0.0.1:8000";  // scheme://host:port[/path prefix]
  std::string endpoint = "/v1/completions";        // or /v1/chat/completions
  std::string model;
  std::string api_key;      // sent as "Authorization: Bearer …" when set
  bool ignore_eos = false;  // "ignore_eos": true (llama-server, vLLM)
  double timeout_s = 600;   // whole-request limit
};

// What one request measured. Times in seconds from the moment it was sent.
struct RequestOutcome {
  bool ok = false;
  std::string error;          // why it failed, when !ok
  int http_status = 0;        // the response's status (0: none arrived)
  double send_offset_s = 0;   // when it was sent, from the benchmark's start
  double ttft_s = 0;          // first non-empty text chunk
  double e2e_s = 0;           // last byte of the response
  std::vector<double> itl_s;  // gaps between successive non-empty text chunks
  int64_t num_text_chunks = 0;
  int64_t output_tokens = 0;  // usage.completion_tokens, else num_text_chunks
  bool output_tokens_from_usage = false;
  int64_t prompt_tokens = -1;  // usage.prompt_tokens; -1 when the server sent no usage
  // usage.prompt_tokens_details.cached_tokens (prompt tokens served from the
  // server's prefix cache); -1 when not sent.
  int64_t cached_tokens = -1;
  std::string text;  // the generated text (a multi-turn conversation resends it)
};

// True for endpoints that take `messages` (…/chat/completions).
bool IsChatEndpoint(std::string_view endpoint);

// The JSON request body.
std::string BuildRequestBody(const EndpointOptions& options, const BenchRequest& request);

// Splits "http://host:8000/prefix" into "http://host:8000" and "/prefix".
// InvalidArgument when there is no http:// or https:// scheme.
struct BaseUrl {
  std::string scheme_host_port;
  std::string path_prefix;  // without a trailing '/'; may be empty
};
Result<BaseUrl> ParseBaseUrl(std::string_view base_url);

// Sends `request` and reads the stream to its end. Never throws: a failed
// request comes back with ok = false and its error.
RequestOutcome SendStreamingRequest(const EndpointOptions& options, const BenchRequest& request);

// GET {base_url}/v1/models and return the first model's id (how vLLM's
// benchmark picks a default). Unavailable when the server cannot be reached.
Result<std::string> FetchFirstModelId(const EndpointOptions& options);

}  // namespace tessera::bench
