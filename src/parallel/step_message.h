// StepMessage: the description of one model step that the driver sends to the
// first pipeline stage and every stage forwards to the next — which sequences,
// their new tokens, positions and KV block tables — so that every rank runs the
// same step on its shard. Wire format: a fixed 32-byte header, then the payload
// (per sequence: start position i64, new tokens i32, blocks i32, flags u32 (bit 0:
// logits of all its new tokens); then all tokens;
// then all block ids; a kPlacement message: its placement's ints alone, counted as
// block ids; a kKvRead/kKvWrite message: its block ids alone), little-endian. Decoding validates
// every count against the header and the limits, so a confused or lying peer is a clear error.
// Layer: parallel. Plain values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::parallel {

enum class StepKind : uint32_t {
  kStep = 1,    // run the step
  kStop = 2,    // no more steps: forward and shut down
  kReport = 3,  // forward, send this rank's report to the driver, go on serving
  // forward, hold the experts `placement` gives this rank from now on (expert
  // parallelism, live re-placement), then send the report as for kReport
  kPlacement = 4,
  // Prefill/decode disaggregation with a sharded instance (docs/pd.md): forward,
  // then send the driver this rank's part of the KV blocks `kv_blocks` (kKvRead),
  // or receive it from the driver into them (kKvWrite)
  kKvRead = 5,
  kKvWrite = 6,
  // forward, then map the pages of KV blocks `kv_blocks` in the background (a KV
  // transfer will write them)
  kKvPrepare = 7,
  // the next kStep sends the driver this rank's share of each layer of KV blocks
  // `kv_blocks` as soon as the layer's attention has written it (KV streaming)
  kKvStream = 8,
};

struct StepSequence {
  int64_t start_position = 0;
  int32_t num_tokens = 0;
  std::vector<int32_t> blocks;  // KV blocks covering [0, start_position + num_tokens)
  bool all_logits = false;      // logits of every new token (speculative verification)
};

struct StepMessage {
  StepKind kind = StepKind::kStep;
  uint64_t step_id = 0;  // consecutive from 0: every rank checks the order
  bool all_logits = false;
  bool sequence_parallel = false;  // the stages split its rows over their tp ranks (--sp)
  std::vector<int32_t> tokens;     // sequence after sequence
  std::vector<StepSequence> sequences;
  // kPlacement: parallel::ExpertPlacement::ToInts (carried where a step's block ids go).
  std::vector<int32_t> placement;
  // kKvRead, kKvWrite, kKvPrepare, kKvStream: the KV blocks (carried where a step's
  // block ids go).
  std::vector<int32_t> kv_blocks;
};

inline constexpr size_t kStepHeaderBytes = 32;

// Header then payload (two messages on the wire, so the receiver can size the second).
struct EncodedStep {
  std::vector<uint8_t> header;   // kStepHeaderBytes
  std::vector<uint8_t> payload;  // may be empty
};
EncodedStep EncodeStep(const StepMessage& message);

// Limits a receiver enforces before allocating.
struct StepLimits {
  int64_t max_tokens = 0;     // new tokens in one step
  int64_t max_sequences = 0;  // sequences in one step
  int64_t num_blocks = 0;     // KV blocks (ids must be below)
  int64_t vocab_size = 0;     // token ids must be below
};

// The payload size a header announces, after checking the header against the
// limits. `from` names the sender in messages ("rank 2").
Result<size_t> StepPayloadBytes(std::span<const uint8_t> header, const StepLimits& limits,
                                const std::string& from);
Result<StepMessage> DecodeStep(std::span<const uint8_t> header, std::span<const uint8_t> payload,
                               const StepLimits& limits, const std::string& from);

}  // namespace tessera::parallel
