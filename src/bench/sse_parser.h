// Server-sent events as OpenAI-compatible servers stream them: an incremental
// parser that turns arbitrarily split bytes into `data:` payloads, and the parse
// of one completion/chat chunk (text delta, usage, error). Layer: bench; used by
// the streaming client. Not thread-safe: one SseParser per response.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace tessera::bench {

// Feed() bytes as they arrive, in pieces of any size; every complete event's data
// (its `data:` lines joined by '\n') goes to `on_data`. Lines end in "\n" or
// "\r\n"; an event ends at a blank line. Comments (":…") and other fields
// (event:, id:, retry:) are skipped.
class SseParser {
 public:
  using DataCallback = std::function<void(std::string_view data)>;

  void Feed(std::string_view bytes, const DataCallback& on_data);
  // End of stream: dispatches an event whose closing blank line never came.
  void Finish(const DataCallback& on_data);

 private:
  void HandleLine(std::string_view line, const DataCallback& on_data);

  std::string partial_line_;  // bytes after the last '\n'
  std::string event_data_;    // data of the event being assembled
  bool has_data_ = false;
};

// One streamed chunk of /v1/completions (choices[0].text) or /v1/chat/completions
// (choices[0].delta.content, or .reasoning_content).
struct StreamChunk {
  bool done = false;                         // the "[DONE]" sentinel
  std::string text;                          // generated text in this chunk; may be empty
  std::optional<int64_t> prompt_tokens;      // usage.prompt_tokens, when sent
  std::optional<int64_t> completion_tokens;  // usage.completion_tokens, when sent
  std::optional<int64_t> cached_tokens;      // usage.prompt_tokens_details.cached_tokens
  std::string error;                         // the server's {"error": …} message, if it sent one
};

// InvalidArgument when the payload is not JSON.
Result<StreamChunk> ParseStreamChunk(std::string_view payload);

}  // namespace tessera::bench
