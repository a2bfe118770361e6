// The KV transfer's control frames: a round trip keeps every field; a frame of
// the wrong size, magic, version or type, one announcing more than the bounds,
// and a request whose token count is not its blocks' are refused by name.
#include "kv/transfer_frame.h"

#include <gtest/gtest.h>

#include <vector>

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
          .status = 0};
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
  bad[4] = 2;
  ExpectRefused(bad, "version 2");
  bad = frame;
  bad[6] = 9;
  ExpectRefused(bad, "unknown type 9");
  bad = frame;
  bad[6] = 0;
  ExpectRefused(bad, "unknown type 0");
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
  // A reply need not carry tokens.
  h = Request();
  h.type = TransferType::kReply;
  h.num_tokens = 0;
  EXPECT_TRUE(DecodeTransferHeader(EncodeTransferHeader(h)).ok());
}

}  // namespace
}  // namespace tessera::kv
