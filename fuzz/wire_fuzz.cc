// libFuzzer target for the decoders of what ranks send each other: step messages
// (parallel/step_message.h: a 32-byte header and a payload, checked against the
// receiver's limits) and rank reports (engine/rank_report.h: int64 words). The
// first byte picks the decoder and how the rest is used:
//   0: raw bytes as a step header + payload;
//   1: raw bytes as report words;
//   2: a step message built from the bytes, encoded, one byte flipped, decoded;
//   3: a report built from the bytes, encoded, one word changed, decoded.
// A decoder must return a message or an error — never crash, hang or allocate
// beyond the limits — and whatever it accepts must encode and decode to itself.
// Corpus: fuzz/corpus/wire (one seed per mode).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "engine/rank_report.h"
#include "parallel/step_message.h"

namespace {

using tessera::engine::DecodeRankReport;
using tessera::engine::EncodeRankReport;
using tessera::engine::RankReport;
using tessera::parallel::DecodeStep;
using tessera::parallel::EncodeStep;
using tessera::parallel::StepLimits;
using tessera::parallel::StepMessage;

constexpr StepLimits kLimits{
    .max_tokens = 4096, .max_sequences = 64, .num_blocks = 1024, .vocab_size = 32000};

void Require(bool ok) {
  if (!ok) std::abort();
}

bool SameStep(const StepMessage& a, const StepMessage& b) {
  if (a.kind != b.kind || a.step_id != b.step_id || a.all_logits != b.all_logits ||
      a.tokens != b.tokens || a.sequences.size() != b.sequences.size()) {
    return false;
  }
  for (size_t i = 0; i < a.sequences.size(); ++i) {
    if (a.sequences[i].start_position != b.sequences[i].start_position ||
        a.sequences[i].num_tokens != b.sequences[i].num_tokens ||
        a.sequences[i].blocks != b.sequences[i].blocks) {
      return false;
    }
  }
  return true;
}

// Decodes header + payload; what is accepted must survive a round trip.
void DecodeStepBytes(std::span<const uint8_t> header, std::span<const uint8_t> payload) {
  auto announced = tessera::parallel::StepPayloadBytes(header, kLimits, "rank 1");
  if (!announced.ok()) return;
  auto message = DecodeStep(header, payload, kLimits, "rank 1");
  if (!message.ok()) return;
  const auto again = EncodeStep(*message);
  auto decoded = DecodeStep(again.header, again.payload, kLimits, "rank 1");
  Require(decoded.ok() && SameStep(*decoded, *message));
}

void DecodeReportWords(std::span<const int64_t> words) {
  auto report = DecodeRankReport(words);
  if (!report.ok()) return;
  const std::vector<int64_t> again = EncodeRankReport(*report);
  auto decoded = DecodeRankReport(again);
  Require(decoded.ok() && EncodeRankReport(*decoded) == again);
}

StepMessage BuildStep(FuzzedDataProvider& in) {
  StepMessage m;
  m.kind =
      in.ConsumeBool() ? tessera::parallel::StepKind::kStep : tessera::parallel::StepKind::kStop;
  m.step_id = in.ConsumeIntegral<uint64_t>();
  m.all_logits = in.ConsumeBool();
  const int sequences = in.ConsumeIntegralInRange(0, 8);
  for (int s = 0; s < sequences; ++s) {
    tessera::parallel::StepSequence seq;
    seq.num_tokens = in.ConsumeIntegralInRange<int32_t>(1, 16);
    seq.start_position = in.ConsumeIntegralInRange<int64_t>(0, 200);
    const int64_t blocks = (seq.start_position + seq.num_tokens + 15) / 16;
    for (int64_t b = 0; b < blocks; ++b) seq.blocks.push_back(in.ConsumeIntegralInRange(0, 1023));
    for (int32_t t = 0; t < seq.num_tokens; ++t) {
      m.tokens.push_back(in.ConsumeIntegralInRange(0, 31999));
    }
    m.sequences.push_back(std::move(seq));
  }
  return m;
}

RankReport BuildReport(FuzzedDataProvider& in) {
  RankReport r;
  r.rank = in.ConsumeIntegralInRange(0, 63);
  r.stage = in.ConsumeIntegralInRange(0, 7);
  r.tp_rank = in.ConsumeIntegralInRange(0, 7);
  r.weight_bytes = in.ConsumeIntegral<int64_t>();
  r.kv_bytes = in.ConsumeIntegral<int64_t>();
  r.peak_rss_bytes = in.ConsumeIntegral<int64_t>();
  r.links = in.ConsumeRandomLengthString(64);
  r.decode.steps = in.ConsumeIntegral<int64_t>();
  r.prefill.comm_ns = in.ConsumeIntegral<int64_t>();
  const int steps = in.ConsumeIntegralInRange(0, 4);
  for (int s = 0; s < steps; ++s) {
    tessera::engine::StepTraffic t;
    t.step_id = in.ConsumeIntegral<uint64_t>();
    t.decode = in.ConsumeBool();
    t.tokens = in.ConsumeIntegral<int64_t>();
    const int entries = in.ConsumeIntegralInRange(0, 3);
    for (int e = 0; e < entries; ++e) {
      t.bytes[in.ConsumeRandomLengthString(24)].bytes_sent = in.ConsumeIntegral<uint64_t>();
    }
    r.traffic.push_back(std::move(t));
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] & 3;
  std::span<const uint8_t> rest(data + 1, size - 1);
  if (mode == 0) {
    const size_t header = std::min(rest.size(), tessera::parallel::kStepHeaderBytes);
    DecodeStepBytes(rest.first(header), rest.subspan(header));
  } else if (mode == 1) {
    std::vector<int64_t> words(rest.size() / 8);
    if (!words.empty()) std::memcpy(words.data(), rest.data(), words.size() * 8);
    DecodeReportWords(words);
  } else if (mode == 2) {
    FuzzedDataProvider in(rest.data(), rest.size());
    const StepMessage built = BuildStep(in);
    auto encoded = EncodeStep(built);
    auto decoded = DecodeStep(encoded.header, encoded.payload, kLimits, "rank 1");
    Require(decoded.ok() && SameStep(*decoded, built));
    std::vector<uint8_t> wire = encoded.header;
    wire.insert(wire.end(), encoded.payload.begin(), encoded.payload.end());
    const size_t at = in.ConsumeIntegralInRange<size_t>(0, wire.size() - 1);
    wire[at] ^= in.ConsumeIntegralInRange<uint8_t>(1, 255);
    const std::span<const uint8_t> flipped(wire);
    DecodeStepBytes(flipped.first(encoded.header.size()), flipped.subspan(encoded.header.size()));
  } else {
    FuzzedDataProvider in(rest.data(), rest.size());
    std::vector<int64_t> words = EncodeRankReport(BuildReport(in));
    Require(DecodeRankReport(words).ok());
    const size_t at = in.ConsumeIntegralInRange<size_t>(0, words.size() - 1);
    words[at] = in.ConsumeIntegral<int64_t>();
    DecodeReportWords(words);
  }
  return 0;
}
