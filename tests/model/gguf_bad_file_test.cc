// Malformed GGUF files: each gives an InvalidArgument error that says what is
// wrong and where — never a crash, a hang or an allocation sized by a bad count.
#include <gtest/gtest.h>

#include <cstring>

#include "model/config.h"
#include "model/gguf.h"
#include "test_util.h"

namespace tessera::model {
namespace {

using testing::SmallGguf;

// Offsets in SmallGguf(): magic 0, version 4, n_tensors 8, n_kv 16, first key 24.
constexpr size_t kVersionOffset = 4;
constexpr size_t kTensorCountOffset = 8;
constexpr size_t kKvCountOffset = 16;
constexpr size_t kFirstKeyLengthOffset = 24;

template <typename T>
void Poke(std::vector<uint8_t>& bytes, size_t offset, T value) {
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// Offset of the tensor info for `name` (its name's length field).
size_t TensorInfoOffset(const std::vector<uint8_t>& bytes, std::string_view name) {
  std::string needle(8, '\0');
  uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  needle += name;
  std::string_view haystack(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  // The last match: tensor infos follow the metadata.
  size_t at = haystack.rfind(needle);
  EXPECT_NE(at, std::string_view::npos);
  return at;
}

Status ParseError(const std::vector<uint8_t>& bytes) {
  Result<GgufFile> file = GgufFile::FromBytes(bytes, "bad.gguf");
  return file.ok() ? Status::Ok() : file.status();
}

void ExpectError(const std::vector<uint8_t>& bytes, const std::string& fragment) {
  Status s = ParseError(bytes);
  ASSERT_FALSE(s.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("bad.gguf"), std::string::npos) << s.message();
}

TEST(GgufBadFileTest, SmallFileIsValid) { EXPECT_TRUE(ParseError(SmallGguf()).ok()); }

TEST(GgufBadFileTest, EveryTruncationIsAnError) {
  std::vector<uint8_t> bytes = SmallGguf();
  for (size_t size = 0; size < bytes.size(); ++size) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + size);
    Status s = ParseError(prefix);
    ASSERT_FALSE(s.ok()) << "prefix of " << size << " bytes parsed";
    bool says_where = s.message().find("truncated") != std::string::npos ||
                      s.message().find("exceeds") != std::string::npos ||
                      s.message().find("cannot fit") != std::string::npos ||
                      s.message().find("past the end") != std::string::npos;
    EXPECT_TRUE(says_where) << size << ": " << s.message();
  }
  ExpectError({}, "truncated file: need 4 bytes at offset 0 to read the magic number");
}

TEST(GgufBadFileTest, TruncatedDataSectionNamesTheTensor) {
  std::vector<uint8_t> bytes = SmallGguf();
  bytes.resize(bytes.size() - 4);  // cut into tensor "b"
  ExpectError(bytes, "tensor 'b' (12 bytes at data offset 32) extends past the end of the file");
}

TEST(GgufBadFileTest, BadMagicAndVersion) {
  std::vector<uint8_t> bytes = SmallGguf();
  bytes[0] = 'X';
  ExpectError(bytes, "bad magic");
  bytes = SmallGguf();
  Poke<uint32_t>(bytes, kVersionOffset, 1);
  ExpectError(bytes, "unsupported GGUF version 1");
  Poke<uint32_t>(bytes, kVersionOffset, 4);
  ExpectError(bytes, "unsupported GGUF version 4");
  Poke<uint32_t>(bytes, kVersionOffset, 0x03000000);
  ExpectError(bytes, "big-endian");
}

TEST(GgufBadFileTest, HugeCountsAreRefusedBeforeAllocating) {
  std::vector<uint8_t> bytes = SmallGguf();
  Poke<uint64_t>(bytes, kTensorCountOffset, ~0ull);
  ExpectError(bytes, "tensor count 18446744073709551615 cannot fit");
  bytes = SmallGguf();
  Poke<uint64_t>(bytes, kKvCountOffset, 1ull << 60);
  ExpectError(bytes, "metadata count");
  bytes = SmallGguf();
  Poke<uint64_t>(bytes, kFirstKeyLengthOffset, 1ull << 62);
  ExpectError(bytes, "string length 4611686018427387904 of metadata #0 key at offset 24 exceeds");
}

TEST(GgufBadFileTest, HugeArrayLengthIsRefused) {
  std::vector<uint8_t> bytes = SmallGguf();
  // test.floats: key, type (u32 9), element type (u32 6), count (u64 2).
  std::string_view all(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  size_t key = all.find("test.floats");
  ASSERT_NE(key, std::string_view::npos);
  size_t count_offset = key + std::strlen("test.floats") + 4 + 4;
  Poke<uint64_t>(bytes, count_offset, 1ull << 61);
  ExpectError(bytes, "metadata 'test.floats': array of 2305843009213693952 f32 elements");
  Poke<uint32_t>(bytes, count_offset - 4, 99);
  ExpectError(bytes, "unknown array element type 99");
  Poke<uint32_t>(bytes, count_offset - 8, 13);
  ExpectError(bytes, "metadata 'test.floats' has unknown value type 13");
}

TEST(GgufBadFileTest, UnsupportedTensorTypeNamesTensorAndType) {
  std::vector<uint8_t> bytes = SmallGguf();
  size_t info = TensorInfoOffset(bytes, "b");
  size_t type_offset = info + 8 + 1 + 4 + 8;  // name, n_dims, one dim
  Poke<uint32_t>(bytes, type_offset, 13);     // GGML q5_K
  ExpectError(bytes, "tensor 'b' has type q5_K (ggml id 13), which tessera does not support");
  Poke<uint32_t>(bytes, type_offset, 1000);
  ExpectError(bytes, "tensor 'b' has type unknown (ggml id 1000)");
}

TEST(GgufBadFileTest, BadShapes) {
  std::vector<uint8_t> bytes = SmallGguf();
  size_t info = TensorInfoOffset(bytes, "a");
  size_t n_dims = info + 8 + 1;
  Poke<uint32_t>(bytes, n_dims, 5);
  ExpectError(bytes, "tensor 'a' has 5 dimensions");
  bytes = SmallGguf();
  Poke<uint64_t>(bytes, n_dims + 4, 0);
  ExpectError(bytes, "tensor 'a' has dimension 0 = 0");
  bytes = SmallGguf();
  Poke<uint64_t>(bytes, n_dims + 4, 1ull << 62);
  Poke<uint64_t>(bytes, n_dims + 12, 1ull << 10);
  ExpectError(bytes, "tensor 'a': element count of shape overflows 64 bits");
  bytes = SmallGguf();
  Poke<uint64_t>(bytes, n_dims + 4, 1ull << 40);  // fits in 64 bits, not in the file
  ExpectError(bytes, "tensor 'a' (");
  ExpectError(bytes, "extends past the end of the file");
  // A q8_0 tensor whose row is not whole blocks.
  bytes = SmallGguf();
  Poke<uint32_t>(bytes, n_dims + 4 + 16, 8);  // type q8_0, row length 4
  ExpectError(bytes,
              "tensor 'a' of type q8_0 has row length 4, not a multiple of its block size 32");
}

TEST(GgufBadFileTest, MisalignedAndOverlappingTensors) {
  std::vector<uint8_t> bytes = SmallGguf();
  size_t info_b = TensorInfoOffset(bytes, "b");
  size_t offset_b = info_b + 8 + 1 + 4 + 8 + 4;
  Poke<uint64_t>(bytes, offset_b, 4);
  ExpectError(bytes, "tensor 'b' data offset 4 is not a multiple of the alignment 32");
  Poke<uint64_t>(bytes, offset_b, 0);
  ExpectError(bytes, "tensors 'a' (data offset 0, 32 bytes) and 'b' (data offset 0) overlap");
}

TEST(GgufBadFileTest, DuplicateNamesAndBadAlignment) {
  std::vector<uint8_t> bytes = SmallGguf();
  size_t info_b = TensorInfoOffset(bytes, "b");
  bytes[info_b + 8] = 'a';
  ExpectError(bytes, "duplicate tensor name 'a'");

  std::string path = testing::TempPath("align.gguf");
  GgufWriter w;
  w.SetU32("general.alignment", 48);
  ASSERT_TRUE(w.Open(path).ok());
  ASSERT_TRUE(w.Close().ok());
  ExpectError(testing::ReadBytes(path), "general.alignment 48 is not a power of two");
}

TEST(GgufBadFileTest, DeepNestingIsRefused) {
  testing::ByteBuilder b;
  b.U32(kGgufMagic);
  b.U32(3);
  b.U64(0);
  b.U64(1);
  b.Str("k");
  b.U32(static_cast<uint32_t>(GgufType::kArray));
  for (int i = 0; i < 100; ++i) {
    b.U32(static_cast<uint32_t>(GgufType::kArray));
    b.U64(1);
  }
  const std::vector<uint8_t>& bytes = b.bytes;
  ExpectError(bytes, "arrays nested deeper than 8");
}

TEST(GgufBadFileTest, BadStringInAnArrayIsNamedByIndex) {
  testing::ByteBuilder b;
  b.U32(kGgufMagic);
  b.U32(3);
  b.U64(0);
  b.U64(1);
  b.Str("tokenizer.ggml.tokens");
  b.U32(static_cast<uint32_t>(GgufType::kArray));
  b.U32(static_cast<uint32_t>(GgufType::kString));
  b.U64(3);
  b.Str("a");
  b.Str("bc");
  b.U64(uint64_t{1} << 40);  // the third string's length, past the end
  b.Str("d");
  ExpectError(b.bytes, "string length 1099511627776 of metadata 'tokenizer.ggml.tokens'[2] at");
}

TEST(GgufBadFileTest, MissingFileIsNotFound) {
  Result<GgufFile> file = GgufFile::Open("/nonexistent/model.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera::model
