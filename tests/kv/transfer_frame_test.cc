// The KV transfer's control frames: a round trip keeps every field; a frame of
// the wrong size, magic, version, type or wire type, one announcing more than the
// bounds, and a request whose token count is not its blocks' are refused by name.
// The wire dtypes: raw and f16 (from an f16 cache) give the block back bit for
// bit; q8_0 within half a step of its group's scale; fp8 e4m3 within its 3-bit
// mantissa's rounding, exact on representable values, saturating at 448.
#include "kv/transfer_frame.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/half.h"
#include "kv/transfer_codec.h"

namespace tessera::kv {
namespace {

TransferHeader Request() {
  return {.type = TransferType::kRequest,
          .transfer_id = 0x0123456789abcdefULL,
          .first_block = 2,
          .num_blocks = 5,
          .num_tokens = 7 * 16,
          .block_size = 16,
          .bytes_per_block = 4096,
          .kv_type = 1,
          .status = 0,
          .num_layers = 4};
}

TEST(TransferFrameTest, RoundTripKeepsEveryField) {
  const TransferHeader h = Request();
  const auto frame = EncodeTransferHeader(h);
  Result<TransferHeader> back = DecodeTransferHeader(frame);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->type, h.type);
  EXPECT_EQ(back->transfer_id, h.transfer_id);
  EXPECT_EQ(back->first_block, h.first_block);
  EXPECT_EQ(back->num_blocks, h.num_blocks);
  EXPECT_EQ(back->num_tokens, h.num_tokens);
  EXPECT_EQ(back->block_size, h.block_size);
  EXPECT_EQ(back->bytes_per_block, h.bytes_per_block);
  EXPECT_EQ(back->kv_type, h.kv_type);
  EXPECT_EQ(back->layer_begin, h.layer_begin);
  EXPECT_EQ(back->num_layers, h.num_layers);
  // Little-endian on the wire whatever the host.
  EXPECT_EQ(frame[0], 0x4B);
  EXPECT_EQ(frame[8], 0xef);
}

void ExpectRefused(std::span<const uint8_t> frame, const std::string& why) {
  Result<TransferHeader> h = DecodeTransferHeader(frame);
  ASSERT_FALSE(h.ok()) << why;
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find(why), std::string::npos) << h.status().ToString();
}

TEST(TransferFrameTest, MalformedFramesAreRefused) {
  auto frame = EncodeTransferHeader(Request());
  ExpectRefused(std::span(frame.data(), frame.size() - 1), "bytes");  // truncated
  std::vector<uint8_t> longer(frame.begin(), frame.end());
  longer.push_back(0);
  ExpectRefused(longer, "bytes");  // oversized
  auto bad = frame;
  bad[0] ^= 1;
  ExpectRefused(bad, "magic");
  bad = frame;
  bad[4] = 1;  // a build before streamed bursts
  ExpectRefused(bad, "version 1");
  bad = frame;
  bad[4] = 2;  // a build before layer pieces
  ExpectRefused(bad, "version 2");
  bad = frame;
  bad[6] = 9;
  ExpectRefused(bad, "unknown type 9");
  bad = frame;
  bad[6] = 0;
  ExpectRefused(bad, "unknown type 0");
  bad = frame;
  bad[48] = 5;
  ExpectRefused(bad, "unknown wire type 5");
  bad = frame;
  bad[52] = 4;
  ExpectRefused(bad, "unknown flags 4");
}

TEST(TransferFrameTest, BurstKeepsItsLayersAndFlags) {
  TransferHeader h = Request();
  h.type = TransferType::kBurst;
  h.first_block = 3;
  h.num_blocks = 2;
  h.layer_begin = 5;
  h.num_layers = 2;
  h.flags = kPrefillEnded;
  Result<TransferHeader> back = DecodeTransferHeader(EncodeTransferHeader(h));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->type, TransferType::kBurst);
  EXPECT_EQ(back->first_block, 3u);
  EXPECT_EQ(back->num_blocks, 2u);
  EXPECT_EQ(back->layer_begin, 5u);
  EXPECT_EQ(back->num_layers, 2u);
  EXPECT_EQ(back->flags, kPrefillEnded);
  // The last burst ends the transfer and carries nothing.
  h.flags = kLastBurst | kPrefillEnded;
  ExpectRefused(EncodeTransferHeader(h), "a last burst carrying 2 blocks");
  h.num_blocks = 0;
  back = DecodeTransferHeader(EncodeTransferHeader(h));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->flags, kLastBurst | kPrefillEnded);
  h.flags = 4;
  ExpectRefused(EncodeTransferHeader(h), "unknown flags");
}

TEST(TransferFrameTest, FieldsBeyondTheBoundsAreRefused) {
  TransferHeader h = Request();
  h.num_blocks = kMaxTransferBlocks + 1;
  ExpectRefused(EncodeTransferHeader(h), "exceed the bound");
  h = Request();
  h.num_tokens = kMaxTransferTokens + 1;
  ExpectRefused(EncodeTransferHeader(h), "exceed the bound");
  h = Request();
  h.bytes_per_block = kMaxTransferBlockBytes + 1;
  ExpectRefused(EncodeTransferHeader(h), "exceed the bound");
  h = Request();
  h.num_tokens -= 1;  // not whole blocks
  ExpectRefused(EncodeTransferHeader(h), "are not the 7 blocks");
  h = Request();
  h.num_blocks = 0;
  h.num_tokens = 2 * 16;
  ExpectRefused(EncodeTransferHeader(h), "blocks");
  h = Request();
  h.num_layers = kMaxTransferLayers + 1;
  ExpectRefused(EncodeTransferHeader(h), "exceed the bound");
  h = Request();
  h.type = TransferType::kBurst;
  h.layer_begin = kMaxTransferLayers;  // + 4 layers
  ExpectRefused(EncodeTransferHeader(h), "exceed the bound");
  h = Request();
  h.num_layers = 0;
  ExpectRefused(EncodeTransferHeader(h), "in 0 layer pieces");
  h = Request();
  h.num_layers = 3;  // 4096 bytes do not split in 3
  ExpectRefused(EncodeTransferHeader(h), "in 3 layer pieces");
  // A reply need not carry tokens.
  h = Request();
  h.type = TransferType::kReply;
  h.num_tokens = 0;
  EXPECT_TRUE(DecodeTransferHeader(EncodeTransferHeader(h)).ok());
}

KvCacheShape CodecShape(kernels::KvType type) {
  return {.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_size = 16, .type = type};
}

// A block of K/V-like values: mostly within ±4, a few large ones.
std::vector<uint8_t> RandomBlock(const KvCacheShape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const int64_t elems = shape.BytesPerBlock() / shape.elem_bytes();
  std::vector<uint8_t> block(static_cast<size_t>(shape.BytesPerBlock()));
  for (int64_t i = 0; i < elems; ++i) {
    float x = normal(rng);
    if (i % 97 == 0) x *= 20;
    if (shape.type == kernels::KvType::kF16) {
      const uint16_t h = F32ToF16(x);
      std::memcpy(block.data() + i * 2, &h, 2);
    } else {
      std::memcpy(block.data() + i * 4, &x, 4);
    }
  }
  return block;
}

float Elem(const KvCacheShape& shape, const std::vector<uint8_t>& block, int64_t i) {
  if (shape.type == kernels::KvType::kF16) {
    uint16_t h;
    std::memcpy(&h, block.data() + i * 2, 2);
    return F16ToF32(h);
  }
  float f;
  std::memcpy(&f, block.data() + i * 4, 4);
  return f;
}

std::vector<uint8_t> RoundTrip(const KvCacheShape& shape, WireType type,
                               const std::vector<uint8_t>& block) {
  std::vector<uint8_t> wire(static_cast<size_t>(WireBytesPerBlock(shape, type)));
  EncodeBlock(shape, type, block.data(), wire.data());
  std::vector<uint8_t> back(block.size(), 0xAB);
  DecodeBlock(shape, type, wire.data(), back.data());
  return back;
}

TEST(TransferCodecTest, WireSizesAreThePlannersDtypes) {
  const KvCacheShape f16 = CodecShape(kernels::KvType::kF16);
  const int64_t elems = f16.BytesPerBlock() / 2;  // 2 layers x 2 x 2 heads x 16 x 8 = 1024
  EXPECT_EQ(elems, 1024);
  EXPECT_EQ(WireBytesPerBlock(f16, WireType::kRaw), 2048);
  EXPECT_EQ(WireBytesPerBlock(f16, WireType::kF16), 2048);
  EXPECT_EQ(WireBytesPerBlock(f16, WireType::kQ8_0), 1024 / 32 * 34);
  EXPECT_EQ(WireBytesPerBlock(f16, WireType::kFp8E4M3), 1024);
  EXPECT_EQ(WireBytesPerBlock(f16, WireType::kMxFp8), 1024 / 32 * 33);
  EXPECT_EQ(WirePlanDType(WireType::kMxFp8, f16), "mxfp8");
  EXPECT_EQ(ParseWireType("mxfp8"), WireType::kMxFp8);
  EXPECT_EQ(WireBytesPerBlock(CodecShape(kernels::KvType::kF32), WireType::kRaw), 4096);
  EXPECT_EQ(WirePlanDType(WireType::kRaw, f16), "f16");
  EXPECT_EQ(WirePlanDType(WireType::kFp8E4M3, f16), "fp8");
  EXPECT_EQ(ParseWireType("q8_0"), WireType::kQ8_0);
  EXPECT_FALSE(ParseWireType("int4").has_value());
}

TEST(TransferCodecTest, RawAndF16FromAnF16CacheAreExact) {
  const KvCacheShape shape = CodecShape(kernels::KvType::kF16);
  const std::vector<uint8_t> block = RandomBlock(shape, 1);
  EXPECT_EQ(RoundTrip(shape, WireType::kRaw, block), block);
  EXPECT_EQ(RoundTrip(shape, WireType::kF16, block), block);
  const KvCacheShape f32 = CodecShape(kernels::KvType::kF32);
  const std::vector<uint8_t> wide = RandomBlock(f32, 2);
  EXPECT_EQ(RoundTrip(f32, WireType::kRaw, wide), wide);
  const std::vector<uint8_t> rounded = RoundTrip(f32, WireType::kF16, wide);
  for (int64_t i = 0; i < 1024; ++i) {
    EXPECT_EQ(Elem(f32, rounded, i), F16ToF32(F32ToF16(Elem(f32, wide, i)))) << i;
  }
}

TEST(TransferCodecTest, Q8_0IsWithinHalfAStepOfItsGroupScale) {
  for (kernels::KvType type : {kernels::KvType::kF16, kernels::KvType::kF32}) {
    const KvCacheShape shape = CodecShape(type);
    const std::vector<uint8_t> block = RandomBlock(shape, 3);
    const std::vector<uint8_t> back = RoundTrip(shape, WireType::kQ8_0, block);
    double worst = 0;
    for (int64_t g = 0; g < 1024 / 32; ++g) {
      float amax = 0;
      for (int64_t i = 0; i < 32; ++i)
        amax = std::max(amax, std::fabs(Elem(shape, block, g * 32 + i)));
      const float step = amax / 127;
      for (int64_t i = 0; i < 32; ++i) {
        const float x = Elem(shape, block, g * 32 + i), y = Elem(shape, back, g * 32 + i);
        // Half a step, the f16 scale's rounding, and the f16 cache's on the way back.
        EXPECT_LE(std::fabs(x - y), 0.5f * step + amax * 2e-3f + std::fabs(x) * 1e-3f)
            << "group " << g << " element " << i;
        worst = std::max<double>(worst, std::fabs(x - y));
      }
    }
    EXPECT_GT(worst, 0);  // lossy indeed
  }
}

TEST(TransferCodecTest, Fp8E4M3RoundsToItsGridAndSaturates) {
  for (float x : {0.0f, 1.0f, -2.0f, 0.5f, 1.125f, 448.0f, -448.0f, 0.015625f, 0.001953125f}) {
    EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(x)), x) << x;  // representable: exact
  }
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(1000.0f)), 448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(-1e9f)), -448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(1.0625f)), 1.0f);  // a tie: to the even mantissa
  EXPECT_EQ(Fp8E4M3ToF32(F32ToFp8E4M3(1.1875f)), 1.25f);
  for (int v = 0; v < 256; ++v) {  // every finite code decodes and re-encodes to itself
    const float x = Fp8E4M3ToF32(static_cast<uint8_t>(v));
    if (std::isnan(x) || (v & 0x7f) == 0) continue;
    EXPECT_EQ(F32ToFp8E4M3(x), v) << v;
  }
  const KvCacheShape shape = CodecShape(kernels::KvType::kF16);
  const std::vector<uint8_t> block = RandomBlock(shape, 4);
  const std::vector<uint8_t> back = RoundTrip(shape, WireType::kFp8E4M3, block);
  for (int64_t i = 0; i < 1024; ++i) {
    const float x = Elem(shape, block, i), y = Elem(shape, back, i);
    EXPECT_LE(std::fabs(x - y), std::max(std::fabs(x) / 16 * 1.01f, std::ldexp(1.0f, -10))) << i;
  }
}

// mxfp8's shared scale keeps what plain e4m3 saturates (beyond ±448) or flushes
// (below its smallest subnormal, 2^-9) within e4m3's relative step.
TEST(TransferCodecTest, MxFp8KeepsValuesBeyondFp8sRange) {
  const KvCacheShape shape = CodecShape(kernels::KvType::kF32);
  std::vector<uint8_t> block(static_cast<size_t>(shape.BytesPerBlock()));
  const int64_t elems = shape.BytesPerBlock() / 4;
  for (int64_t i = 0; i < elems; ++i) {
    // Group 0 large, group 1 tiny, the rest ordinary.
    const float x = (i < 32   ? 3000.0f
                     : i < 64 ? 1e-4f
                              : 1.0f) *
                    (1.0f + 0.01f * float(i % 32)) * (i % 2 ? -1.0f : 1.0f);
    std::memcpy(block.data() + i * 4, &x, 4);
  }
  const std::vector<uint8_t> mx = RoundTrip(shape, WireType::kMxFp8, block);
  const std::vector<uint8_t> fp8 = RoundTrip(shape, WireType::kFp8E4M3, block);
  for (int64_t i = 0; i < 64; ++i) {
    const float x = Elem(shape, block, i);
    EXPECT_LE(std::fabs(Elem(shape, mx, i) - x), std::fabs(x) / 16 * 1.01f) << i;
  }
  EXPECT_EQ(std::fabs(Elem(shape, fp8, 0)), 448.0f);  // saturated without a scale
  EXPECT_EQ(Elem(shape, fp8, 32), 0.0f);              // flushed without a scale
}

// The block codecs (tables, row converters, vectorised rounding) against a plain
// per-element reference, byte for byte both ways, from f16 and f32 caches, on
// values that hit the edges: ±0, subnormals of both formats, fp8 ties, saturation,
// q8_0 ties (x / scale exactly k + 0.5) and an all-zero group.
TEST(TransferCodecTest, BlockCodecsEqualThePerElementReference) {
  for (kernels::KvType type : {kernels::KvType::kF16, kernels::KvType::kF32}) {
    const KvCacheShape shape = CodecShape(type);
    std::vector<uint8_t> block = RandomBlock(shape, 9);
    const int64_t elems = shape.BytesPerBlock() / shape.elem_bytes();
    const std::vector<float> edges = {
        0.0f,   -0.0f, 1e-7f,    -3e-6f,         0.0009765625f, 1.0625f, -1.1875f, 448.0f,
        500.0f, -1e4f, 65504.0f, 0.00048828125f, 2.5f,          -3.5f,   127.0f,   0.5f};
    auto set = [&](int64_t i, float x) {
      if (type == kernels::KvType::kF16) {
        const uint16_t h = F32ToF16(x);
        std::memcpy(block.data() + i * 2, &h, 2);
      } else {
        std::memcpy(block.data() + i * 4, &x, 4);
      }
    };
    for (size_t k = 0; k < edges.size(); ++k) set(static_cast<int64_t>(k), edges[k]);
    for (int64_t i = 64; i < 96; ++i) set(i, 0.0f);  // a zero group
    for (int64_t i = 96; i < 128; ++i)
      set(i, (i == 96) ? 127.0f : 0.5f + static_cast<float>(i % 7));
    // fp8 both ways.
    std::vector<uint8_t> wire(static_cast<size_t>(WireBytesPerBlock(shape, WireType::kFp8E4M3)));
    EncodeBlock(shape, WireType::kFp8E4M3, block.data(), wire.data());
    for (int64_t i = 0; i < elems; ++i) {
      ASSERT_EQ(wire[static_cast<size_t>(i)], F32ToFp8E4M3(Elem(shape, block, i))) << i;
    }
    std::vector<uint8_t> back(block.size());
    DecodeBlock(shape, WireType::kFp8E4M3, wire.data(), back.data());
    for (int64_t i = 0; i < elems; ++i) {
      const float want = Fp8E4M3ToF32(wire[static_cast<size_t>(i)]);
      ASSERT_EQ(Elem(shape, back, i),
                type == kernels::KvType::kF16 ? F16ToF32(F32ToF16(want)) : want)
          << i;
    }
    // mxfp8 both ways: per group of 32 the E8M0 scale 2^s, the smallest s >= -127
    // with max|x| / 2^s <= 448 (byte 0 for an all-zero group), then e4m3 of x / 2^s.
    wire.assign(static_cast<size_t>(WireBytesPerBlock(shape, WireType::kMxFp8)), 0);
    EncodeBlock(shape, WireType::kMxFp8, block.data(), wire.data());
    for (int64_t g = 0; g < elems / 32; ++g) {
      float amax = 0;
      for (int64_t i = 0; i < 32; ++i)
        amax = std::max(amax, std::fabs(Elem(shape, block, g * 32 + i)));
      int s = -127;
      while (amax > 0 && s < 127 && std::ldexp(amax, -s) > 448.0f) ++s;
      const uint8_t* got = wire.data() + g * 33;
      ASSERT_EQ(got[0], amax > 0 ? s + 127 : 0) << "group " << g;
      for (int64_t i = 0; i < 32; ++i) {
        ASSERT_EQ(got[1 + i], F32ToFp8E4M3(std::ldexp(Elem(shape, block, g * 32 + i), -s)))
            << "group " << g << " element " << i;
      }
    }
    DecodeBlock(shape, WireType::kMxFp8, wire.data(), back.data());
    for (int64_t i = 0; i < elems; ++i) {
      const uint8_t* group = wire.data() + i / 32 * 33;
      const float want = Fp8E4M3ToF32(group[1 + i % 32]) * std::ldexp(1.0f, int{group[0]} - 127);
      ASSERT_EQ(Elem(shape, back, i),
                type == kernels::KvType::kF16 ? F16ToF32(F32ToF16(want)) : want)
          << i;
    }
    // q8_0 both ways: scale max|x| / 127 in f16, then nearbyint(x / scale) clamped.
    wire.assign(static_cast<size_t>(WireBytesPerBlock(shape, WireType::kQ8_0)), 0);
    EncodeBlock(shape, WireType::kQ8_0, block.data(), wire.data());
    for (int64_t g = 0; g < elems / 32; ++g) {
      float amax = 0;
      for (int64_t i = 0; i < 32; ++i)
        amax = std::max(amax, std::fabs(Elem(shape, block, g * 32 + i)));
      const uint16_t dh = F32ToF16(amax / 127.0f);
      const float dq = F16ToF32(dh);
      const uint8_t* got = wire.data() + g * 34;
      uint16_t got_dh;
      std::memcpy(&got_dh, got, 2);
      ASSERT_EQ(got_dh, dh) << "group " << g;
      for (int64_t i = 0; i < 32; ++i) {
        const float q = dq > 0 ? std::nearbyint(Elem(shape, block, g * 32 + i) / dq) : 0.0f;
        ASSERT_EQ(static_cast<int8_t>(got[2 + i]),
                  static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)))
            << "group " << g << " element " << i;
      }
    }
    DecodeBlock(shape, WireType::kQ8_0, wire.data(), back.data());
    for (int64_t i = 0; i < elems; ++i) {
      uint16_t dh;
      std::memcpy(&dh, wire.data() + i / 32 * 34, 2);
      const float want =
          F16ToF32(dh) * static_cast<int8_t>(wire[static_cast<size_t>(i / 32 * 34 + 2 + i % 32)]);
      ASSERT_EQ(Elem(shape, back, i),
                type == kernels::KvType::kF16 ? F16ToF32(F32ToF16(want)) : want)
          << i;
    }
  }
}

// A transfer's pieces: each layer encoded apart lands at its place in the
// block's wire form, and decoding layer by layer (in any order) gives the block
// that decoding it whole gives.
TEST(TransferCodecTest, LayerPiecesMakeTheWholeBlock) {
  for (kernels::KvType type : {kernels::KvType::kF16, kernels::KvType::kF32}) {
    KvCacheShape shape = CodecShape(type);
    shape.num_layers = 3;
    const std::vector<uint8_t> block = RandomBlock(shape, 4);
    for (WireType wire :
         {WireType::kRaw, WireType::kF16, WireType::kQ8_0, WireType::kFp8E4M3, WireType::kMxFp8}) {
      const int64_t layer_bytes = WireBytesPerLayer(shape, wire);
      ASSERT_EQ(WireBytesPerBlock(shape, wire), 3 * layer_bytes);
      std::vector<uint8_t> whole(static_cast<size_t>(3 * layer_bytes));
      EncodeBlock(shape, wire, block.data(), whole.data());
      std::vector<uint8_t> pieces(whole.size(), 0xEE);
      for (int32_t l : {2, 0, 1}) EncodeLayers(shape, wire, l, l + 1, block.data(), pieces.data());
      EXPECT_EQ(pieces, whole) << WireTypeName(wire);
      std::vector<uint8_t> back(block.size(), 0xAB), back_pieces(block.size(), 0xCD);
      DecodeBlock(shape, wire, whole.data(), back.data());
      DecodeLayers(shape, wire, 1, 3, whole.data(), back_pieces.data());
      DecodeLayers(shape, wire, 0, 1, whole.data(), back_pieces.data());
      EXPECT_EQ(back_pieces, back) << WireTypeName(wire);
      if (wire == WireType::kRaw) {
        EXPECT_EQ(back, block);
      }
    }
  }
}

}  // namespace
}  // namespace tessera::kv
