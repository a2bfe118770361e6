#include "parallel/step_message.h"

#include <cstring>

namespace tessera::parallel {
namespace {

constexpr uint32_t kMagic = 0x50455453;  // "STEP"

// Header: magic u32, kind u32, step_id u64, flags u32, sequences u32, tokens u32, blocks u32.
struct Header {
  uint32_t magic;
  uint32_t kind;
  uint64_t step_id;
  uint32_t flags;
  uint32_t num_sequences;
  uint32_t num_tokens;
  uint32_t num_blocks;
};
static_assert(sizeof(Header) == kStepHeaderBytes);

constexpr size_t kPerSequenceBytes = 20;  // start i64, tokens i32, blocks i32, flags u32

constexpr uint32_t kAllLogitsFlag = 1u;
constexpr uint32_t kSequenceParallelFlag = 2u;
constexpr uint32_t kKnownFlags = kAllLogitsFlag | kSequenceParallelFlag;

size_t PayloadBytes(const Header& h) {
  return h.num_sequences * kPerSequenceBytes +
         (static_cast<size_t>(h.num_tokens) + h.num_blocks) * 4;
}

std::string S(int64_t v) { return std::to_string(v); }

bool IsKvKind(uint32_t kind) {
  return kind == static_cast<uint32_t>(StepKind::kKvRead) ||
         kind == static_cast<uint32_t>(StepKind::kKvWrite) ||
         kind == static_cast<uint32_t>(StepKind::kKvPrepare) ||
         kind == static_cast<uint32_t>(StepKind::kKvStream);
}

template <typename T>
void Put(std::vector<uint8_t>& out, size_t& pos, T value) {
  std::memcpy(out.data() + pos, &value, sizeof(T));
  pos += sizeof(T);
}

template <typename T>
T Get(std::span<const uint8_t> in, size_t& pos) {
  T value;
  std::memcpy(&value, in.data() + pos, sizeof(T));
  pos += sizeof(T);
  return value;
}

Result<Header> ParseHeader(std::span<const uint8_t> bytes, const StepLimits& limits,
                           const std::string& from) {
  if (bytes.size() != kStepHeaderBytes) {
    return InvalidArgumentError("step message from " + from + " has a " + S(bytes.size()) +
                                "-byte header, expected " + S(kStepHeaderBytes));
  }
  Header h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kMagic) {
    return InvalidArgumentError("step message from " + from + " has a bad magic number");
  }
  if (h.kind != static_cast<uint32_t>(StepKind::kStep) &&
      h.kind != static_cast<uint32_t>(StepKind::kStop) &&
      h.kind != static_cast<uint32_t>(StepKind::kReport) &&
      h.kind != static_cast<uint32_t>(StepKind::kPlacement) &&
      h.kind != static_cast<uint32_t>(StepKind::kKvRead) &&
      h.kind != static_cast<uint32_t>(StepKind::kKvWrite) &&
      h.kind != static_cast<uint32_t>(StepKind::kKvPrepare) &&
      h.kind != static_cast<uint32_t>(StepKind::kKvStream)) {
    return InvalidArgumentError("step message from " + from + " has unknown kind " + S(h.kind));
  }
  if ((h.flags & ~kKnownFlags) != 0) {
    return InvalidArgumentError("step message from " + from + " has unknown flags " + S(h.flags));
  }
  if (h.kind == static_cast<uint32_t>(StepKind::kPlacement)) {
    // Its ints ride where block ids go, but a per-layer placement of a large MoE is
    // not bounded by the KV pool: at most 1M values (256 experts with 8 holders in
    // each of 128 layers is 295k), 4 MiB a lying peer can make a rank allocate.
    if (h.num_sequences != 0 || h.num_tokens != 0 || h.num_blocks > (uint32_t{1} << 20)) {
      return InvalidArgumentError("step message from " + from + " is a placement of " +
                                  S(h.num_blocks) + " values with " + S(h.num_sequences) +
                                  " sequences and " + S(h.num_tokens) + " tokens");
    }
    return h;
  }
  if (IsKvKind(h.kind)) {
    if (h.num_sequences != 0 || h.num_tokens != 0 ||
        static_cast<int64_t>(h.num_blocks) > limits.num_blocks) {
      return InvalidArgumentError("step message from " + from + " moves " + S(h.num_blocks) +
                                  " KV blocks (of " + S(limits.num_blocks) + ") with " +
                                  S(h.num_sequences) + " sequences and " + S(h.num_tokens) +
                                  " tokens");
    }
    return h;
  }
  if (h.num_tokens > limits.max_tokens || h.num_sequences > limits.max_sequences ||
      h.num_sequences > h.num_tokens ||
      static_cast<int64_t>(h.num_blocks) > limits.num_blocks * limits.max_sequences) {
    return InvalidArgumentError("step message from " + from + " announces " + S(h.num_sequences) +
                                " sequences, " + S(h.num_tokens) + " tokens and " +
                                S(h.num_blocks) + " block ids, beyond the limits (" +
                                S(limits.max_sequences) + " sequences, " + S(limits.max_tokens) +
                                " tokens, " + S(limits.num_blocks) + " blocks)");
  }
  return h;
}

}  // namespace

EncodedStep EncodeStep(const StepMessage& m) {
  Header h{.magic = kMagic,
           .kind = static_cast<uint32_t>(m.kind),
           .step_id = m.step_id,
           .flags = (m.all_logits ? kAllLogitsFlag : 0u) |
                    (m.sequence_parallel ? kSequenceParallelFlag : 0u),
           .num_sequences = static_cast<uint32_t>(m.sequences.size()),
           .num_tokens = static_cast<uint32_t>(m.tokens.size()),
           .num_blocks = 0};
  for (const StepSequence& s : m.sequences) h.num_blocks += static_cast<uint32_t>(s.blocks.size());
  h.num_blocks += static_cast<uint32_t>(m.placement.size() + m.kv_blocks.size());
  EncodedStep out;
  out.header.resize(kStepHeaderBytes);
  std::memcpy(out.header.data(), &h, sizeof(h));
  out.payload.resize(PayloadBytes(h));
  size_t pos = 0;
  for (const StepSequence& s : m.sequences) {
    Put<int64_t>(out.payload, pos, s.start_position);
    Put<int32_t>(out.payload, pos, s.num_tokens);
    Put<int32_t>(out.payload, pos, static_cast<int32_t>(s.blocks.size()));
    Put<uint32_t>(out.payload, pos, s.all_logits ? 1u : 0u);
  }
  for (int32_t t : m.tokens) Put<int32_t>(out.payload, pos, t);
  for (const StepSequence& s : m.sequences) {
    for (int32_t b : s.blocks) Put<int32_t>(out.payload, pos, b);
  }
  for (int32_t v : m.placement) Put<int32_t>(out.payload, pos, v);
  for (int32_t b : m.kv_blocks) Put<int32_t>(out.payload, pos, b);
  return out;
}

Result<size_t> StepPayloadBytes(std::span<const uint8_t> header, const StepLimits& limits,
                                const std::string& from) {
  TESSERA_ASSIGN_OR_RETURN(Header h, ParseHeader(header, limits, from));
  return PayloadBytes(h);
}

Result<StepMessage> DecodeStep(std::span<const uint8_t> header, std::span<const uint8_t> payload,
                               const StepLimits& limits, const std::string& from) {
  TESSERA_ASSIGN_OR_RETURN(Header h, ParseHeader(header, limits, from));
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError("step message " + S(static_cast<int64_t>(h.step_id)) + " from " +
                                from + ": " + what);
  };
  if (payload.size() != PayloadBytes(h)) {
    return bad("payload of " + S(payload.size()) + " bytes, its header says " + S(PayloadBytes(h)));
  }
  StepMessage m;
  m.kind = static_cast<StepKind>(h.kind);
  m.step_id = h.step_id;
  m.all_logits = (h.flags & kAllLogitsFlag) != 0;
  m.sequence_parallel = (h.flags & kSequenceParallelFlag) != 0;
  size_t pos = 0;
  if (m.kind == StepKind::kPlacement) {
    if (h.flags != 0) return bad("a placement message with flags");
    m.placement.resize(h.num_blocks);
    for (int32_t& v : m.placement) v = Get<int32_t>(payload, pos);
    return m;
  }
  if (IsKvKind(h.kind)) {
    if (h.flags != 0) return bad("a KV block message with flags");
    m.kv_blocks.resize(h.num_blocks);
    for (int32_t& b : m.kv_blocks) {
      b = Get<int32_t>(payload, pos);
      if (b < 0 || b >= limits.num_blocks) return bad("KV block " + S(b) + " out of range");
    }
    return m;
  }
  int64_t tokens = 0, blocks = 0;
  m.sequences.resize(h.num_sequences);
  for (StepSequence& s : m.sequences) {
    s.start_position = Get<int64_t>(payload, pos);
    s.num_tokens = Get<int32_t>(payload, pos);
    const int32_t num_blocks = Get<int32_t>(payload, pos);
    const uint32_t flags = Get<uint32_t>(payload, pos);
    s.all_logits = (flags & 1u) != 0;
    if (s.num_tokens < 1 || s.start_position < 0 || num_blocks < 0 ||
        num_blocks > limits.num_blocks || flags > 1u) {
      return bad("a sequence with " + S(s.num_tokens) + " tokens at position " +
                 S(s.start_position) + " and " + S(num_blocks) + " blocks");
    }
    s.blocks.resize(static_cast<size_t>(num_blocks));
    tokens += s.num_tokens;
    blocks += num_blocks;
  }
  if (tokens != h.num_tokens || blocks != h.num_blocks) {
    return bad("its sequences hold " + S(tokens) + " tokens and " + S(blocks) +
               " blocks, its header says " + S(h.num_tokens) + " and " + S(h.num_blocks));
  }
  m.tokens.resize(h.num_tokens);
  for (int32_t& t : m.tokens) {
    t = Get<int32_t>(payload, pos);
    if (t < 0 || t >= limits.vocab_size) return bad("token id " + S(t) + " outside the vocabulary");
  }
  for (StepSequence& s : m.sequences) {
    for (int32_t& b : s.blocks) {
      b = Get<int32_t>(payload, pos);
      if (b < 0 || b >= limits.num_blocks) return bad("KV block " + S(b) + " out of range");
    }
  }
  return m;
}

}  // namespace tessera::parallel
