// StepMessage: round trip, and every malformed or oversized message refused with
// an error naming the sender (a confused or lying peer).
#include "parallel/step_message.h"

#include <gtest/gtest.h>

#include <cstring>

namespace tessera::parallel {
namespace {

const StepLimits kLimits{.max_tokens = 64, .max_sequences = 4, .num_blocks = 16, .vocab_size = 100};

StepMessage Sample() {
  StepMessage m;
  m.step_id = 7;
  m.all_logits = true;
  m.tokens = {1, 2, 3, 99};
  m.sequences = {{.start_position = 0, .num_tokens = 3, .blocks = {4}},
                 {.start_position = 40, .num_tokens = 1, .blocks = {0, 1, 15}, .all_logits = true}};
  return m;
}

TEST(StepMessageTest, RoundTrip) {
  const EncodedStep e = EncodeStep(Sample());
  EXPECT_EQ(e.header.size(), kStepHeaderBytes);
  auto size = StepPayloadBytes(e.header, kLimits, "rank 1");
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, e.payload.size());
  auto m = DecodeStep(e.header, e.payload, kLimits, "rank 1");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->step_id, 7u);
  EXPECT_TRUE(m->all_logits);
  EXPECT_EQ(m->tokens, Sample().tokens);
  ASSERT_EQ(m->sequences.size(), 2u);
  EXPECT_EQ(m->sequences[1].start_position, 40);
  EXPECT_EQ(m->sequences[1].blocks, (std::vector<int32_t>{0, 1, 15}));
  EXPECT_FALSE(m->sequences[0].all_logits);
  EXPECT_TRUE(m->sequences[1].all_logits);
}

TEST(StepMessageTest, StopHasNoPayload) {
  StepMessage stop;
  stop.kind = StepKind::kStop;
  const EncodedStep e = EncodeStep(stop);
  EXPECT_TRUE(e.payload.empty());
  auto m = DecodeStep(e.header, e.payload, kLimits, "rank 0");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind, StepKind::kStop);
}

// An expert placement (live re-placement under --ep) rides in the block-id area.
TEST(StepMessageTest, PlacementRoundTripsAndCarriesNothingElse) {
  StepMessage placement;
  placement.kind = StepKind::kPlacement;
  placement.step_id = 3;
  placement.placement = {1, 0, 2, 0, 1, 2, 1, 0, 1, 1};
  const EncodedStep e = EncodeStep(placement);
  auto m = DecodeStep(e.header, e.payload, kLimits, "rank 0");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, StepKind::kPlacement);
  EXPECT_EQ(m->placement, placement.placement);
  EXPECT_TRUE(m->tokens.empty());
  EXPECT_TRUE(m->sequences.empty());
  // A placement message that also names tokens is a lie.
  StepMessage mixed = Sample();
  mixed.kind = StepKind::kPlacement;
  const EncodedStep bad = EncodeStep(mixed);
  auto refused = DecodeStep(bad.header, bad.payload, kLimits, "rank 2");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("is a placement of 4 values with 2 sequences"),
            std::string::npos)
      << refused.status().ToString();
  // A per-layer placement of a large model is not bounded by a small KV pool (16
  // blocks x 4 sequences here): 28 layers of 64 experts with a copy each.
  StepMessage large;
  large.kind = StepKind::kPlacement;
  large.placement.assign(2 + 28 * 64 * 3, 0);
  const EncodedStep e2 = EncodeStep(large);
  auto big = DecodeStep(e2.header, e2.payload, kLimits, "rank 0");
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->placement.size(), large.placement.size());
}

// A KV block read or write (a sharded PD instance) carries its block ids alone,
// each inside the pool, and at most the pool's count.
TEST(StepMessageTest, KvBlockMessagesCarryValidBlockIdsOnly) {
  for (const StepKind kind :
       {StepKind::kKvRead, StepKind::kKvWrite, StepKind::kKvPrepare, StepKind::kKvStream}) {
    StepMessage kv;
    kv.kind = kind;
    kv.step_id = 5;
    kv.kv_blocks = {3, 0, 15};
    const EncodedStep e = EncodeStep(kv);
    auto m = DecodeStep(e.header, e.payload, kLimits, "rank 0");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->kind, kind);
    EXPECT_EQ(m->kv_blocks, kv.kv_blocks);
    EXPECT_TRUE(m->sequences.empty());

    kv.kv_blocks = {3, 16};
    const EncodedStep outside = EncodeStep(kv);
    auto refused = DecodeStep(outside.header, outside.payload, kLimits, "rank 2");
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("KV block 16 out of range"), std::string::npos)
        << refused.status().ToString();

    kv.kv_blocks.assign(17, 0);  // more than the pool holds
    const EncodedStep many = EncodeStep(kv);
    refused = DecodeStep(many.header, many.payload, kLimits, "rank 2");
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("moves 17 KV blocks (of 16)"), std::string::npos)
        << refused.status().ToString();

    StepMessage mixed = Sample();
    mixed.kind = kind;
    const EncodedStep bad = EncodeStep(mixed);
    EXPECT_FALSE(DecodeStep(bad.header, bad.payload, kLimits, "rank 2").ok());
  }
}

void ExpectRefused(const std::vector<uint8_t>& header, const std::vector<uint8_t>& payload,
                   const std::string& needle) {
  auto m = DecodeStep(header, payload, kLimits, "rank 3");
  ASSERT_FALSE(m.ok()) << needle;
  EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("rank 3"), std::string::npos) << m.status().ToString();
}

TEST(StepMessageTest, MalformedMessagesAreRefused) {
  const EncodedStep good = EncodeStep(Sample());
  {
    std::vector<uint8_t> h = good.header;
    h[0] ^= 1;
    ExpectRefused(h, good.payload, "bad magic");
  }
  {
    std::vector<uint8_t> h = good.header;
    h[4] = 9;  // kind
    ExpectRefused(h, good.payload, "unknown kind");
  }
  ExpectRefused(std::vector<uint8_t>(good.header.begin(), good.header.end() - 1), good.payload,
                "header");
  ExpectRefused(good.header, std::vector<uint8_t>(good.payload.begin(), good.payload.end() - 4),
                "payload of");
  {  // A token outside the vocabulary.
    StepMessage m = Sample();
    m.tokens[1] = 100;
    const EncodedStep e = EncodeStep(m);
    ExpectRefused(e.header, e.payload, "outside the vocabulary");
  }
  {  // A block id past the cache.
    StepMessage m = Sample();
    m.sequences[0].blocks[0] = 16;
    const EncodedStep e = EncodeStep(m);
    ExpectRefused(e.header, e.payload, "KV block 16");
  }
  {  // Sequences whose token counts disagree with the header.
    StepMessage m = Sample();
    m.sequences[0].num_tokens = 2;
    const EncodedStep e = EncodeStep(m);
    ExpectRefused(e.header, e.payload, "its header says");
  }
  {  // Beyond the limits: refused from the header alone, before any allocation.
    StepMessage m;
    m.tokens.assign(65, 1);
    m.sequences = {{.start_position = 0, .num_tokens = 65, .blocks = {0}}};
    const EncodedStep e = EncodeStep(m);
    auto size = StepPayloadBytes(e.header, kLimits, "rank 2");
    ASSERT_FALSE(size.ok());
    EXPECT_NE(size.status().message().find("beyond the limits"), std::string::npos);
  }
}

TEST(StepMessageTest, RandomBytesNeverCrash) {
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> h(kStepHeaderBytes), p(static_cast<size_t>(i % 97));
    const EncodedStep good = EncodeStep(Sample());
    h = good.header;
    for (auto& b : p) b = static_cast<uint8_t>(x >>= 1, x ^= x << 13, x);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    h[static_cast<size_t>(x % kStepHeaderBytes)] ^= static_cast<uint8_t>(x >> 8);
    (void)DecodeStep(h, p, kLimits, "fuzz");
  }
}

}  // namespace
}  // namespace tessera::parallel
