// GgufFile / GgufWriter: every metadata type round-trips, typed getters, tensor
// views, alignment, and the real models in shared/models.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstring>

#include "model/config.h"
#include "model/gguf_writer.h"
#include "test_util.h"

namespace tessera::model {
namespace {

using kernels::WeightType;
using testing::ReadBytes;
using testing::TempPath;

TEST(GgufTest, RoundTripsEveryMetadataTypeAndNestedArrays) {
  // Build a nested array value by writing and reading a file first.
  std::string inner_path = TempPath("inner.gguf");
  {
    GgufWriter w;
    std::vector<std::string> strings = {"x", "", "zz"};
    w.SetStringArray("s", strings);
    ASSERT_TRUE(w.Open(inner_path).ok());
    ASSERT_TRUE(w.Close().ok());
  }
  Result<GgufFile> inner = GgufFile::Open(inner_path);
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();

  std::string path = TempPath("all_types.gguf");
  GgufWriter w;
  w.SetU32("u32", 4000000000u);
  w.SetI32("i32", -5);
  w.SetU64("u64", 1ull << 40);
  w.SetF32("f32", 0.25f);
  w.SetBool("bool", true);
  w.SetString("str", "héllo");
  std::vector<int32_t> ints = {1, -2, 3};
  w.SetI32Array("ints", ints);
  std::vector<float> floats = {0.5f, 1.5f};
  w.SetF32Array("floats", floats);
  w.SetValue("strings", *inner->Find("s"));
  ASSERT_TRUE(w.Open(path).ok());
  ASSERT_TRUE(w.Close().ok());

  // A nested array (array of arrays of u8), spliced in by hand: the writer copies
  // values it has read, so read this one back and copy it again.
  Result<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->metadata().size(), 9u);
  EXPECT_EQ(*file->GetU32("u32"), 4000000000u);
  EXPECT_EQ(*file->GetInt("i32"), -5);
  EXPECT_EQ(*file->GetInt("u64"), int64_t{1} << 40);
  EXPECT_FALSE(file->GetU32("u64").ok());  // does not fit
  EXPECT_FALSE(file->GetU32("i32").ok());  // negative
  EXPECT_EQ(*file->GetF32("f32"), 0.25f);
  EXPECT_TRUE(*file->GetBool("bool"));
  EXPECT_EQ(*file->GetString("str"), "héllo");
  EXPECT_EQ(*file->GetI32Array("ints"), ints);
  EXPECT_EQ(*file->GetF32Array("floats"), floats);
  std::span<const std::string_view> strings = *file->GetStringArray("strings");
  ASSERT_EQ(strings.size(), 3u);
  EXPECT_EQ(strings[2], "zz");

  // Wrong type and missing keys are errors that name the key.
  Result<std::string_view> wrong = file->GetString("u32");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("'u32' has type u32"), std::string::npos);
  Result<int64_t> missing = file->GetInt("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*file->GetIntOr("nope", 42), 42);
  EXPECT_FALSE(file->GetIntOr("str", 42).ok());
  EXPECT_FALSE(file->Has("nope"));
}

TEST(GgufTest, NestedArraysParse) {
  // [[1, 2], [3]] as arrays of u8, written by hand.
  testing::ByteBuilder b;
  b.U32(kGgufMagic);
  b.U32(2);  // v2
  b.U64(0);  // tensors
  b.U64(1);  // kv
  b.Str("nested");
  b.U32(static_cast<uint32_t>(GgufType::kArray));
  b.U32(static_cast<uint32_t>(GgufType::kArray));
  b.U64(2);
  b.U32(static_cast<uint32_t>(GgufType::kU8));
  b.U64(2);
  b.Put<uint8_t>(1);
  b.Put<uint8_t>(2);
  b.U32(static_cast<uint32_t>(GgufType::kU8));
  b.U64(1);
  b.Put<uint8_t>(3);
  const std::vector<uint8_t>& bytes = b.bytes;
  Result<GgufFile> file = GgufFile::FromBytes(bytes, "nested");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->version(), 2u);
  const GgufValue* v = file->Find("nested");
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->array_elements().size(), 2u);
  EXPECT_EQ(v->array_elements()[0].array_raw().size(), 2u);
  EXPECT_EQ(v->array_elements()[1].array_raw()[0], 3);
  EXPECT_EQ(v->Summary(), "[array x 2]");

  // The writer copies nested arrays byte for byte.
  std::string path = TempPath("nested_copy.gguf");
  GgufWriter w;
  w.SetValue("nested", *v);
  ASSERT_TRUE(w.Open(path).ok());
  ASSERT_TRUE(w.Close().ok());
  std::vector<uint8_t> copy = ReadBytes(path);
  std::vector<uint8_t> expected = bytes;
  expected[4] = 3;  // the writer writes v3
  EXPECT_EQ(copy, expected);
}

TEST(GgufTest, TensorsAreViewsWithShapesAndAlignment) {
  for (uint32_t alignment : {32u, 64u, 1u}) {
    std::string path = TempPath("tensors.gguf");
    GgufWriter w(alignment);
    ASSERT_TRUE(w.AddTensor("x", WeightType::kF32, {3}).ok());
    ASSERT_TRUE(w.AddTensor("q", WeightType::kQ8_0, {64, 2, 3}).ok());
    ASSERT_TRUE(w.AddTensor("h", WeightType::kF16, {5, 1}).ok());
    ASSERT_TRUE(w.Open(path).ok());
    std::vector<uint8_t> x(12, 0x11), q(34 * 2 * 2 * 3, 0x22), h(10, 0x33);
    ASSERT_TRUE(w.Append(x).ok());
    ASSERT_TRUE(w.Append({q.data(), 100}).ok());  // in pieces
    ASSERT_TRUE(w.Append({q.data() + 100, q.size() - 100}).ok());
    ASSERT_TRUE(w.Append(h).ok());
    EXPECT_FALSE(w.Append(h).ok());  // more than declared
    ASSERT_TRUE(w.Close().ok());

    Result<GgufFile> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ(file->alignment(), alignment);
    EXPECT_EQ(file->data_offset() % alignment, 0u);
    ASSERT_EQ(file->tensors().size(), 3u);
    const GgufTensor* t = file->FindTensor("q");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, WeightType::kQ8_0);
    EXPECT_EQ(t->dims, (std::vector<int64_t>{64, 2, 3}));
    EXPECT_EQ(t->num_elements, 384);
    EXPECT_EQ(t->num_rows(), 6);
    EXPECT_EQ(t->row_bytes(), 68u);
    EXPECT_EQ(t->size_bytes(), q.size());
    EXPECT_EQ(t->ShapeString(), "[64, 2, 3]");
    EXPECT_EQ(t->offset % alignment, 0u);
    EXPECT_TRUE(std::all_of(t->data.begin(), t->data.end(), [](uint8_t b) { return b == 0x22; }));
    EXPECT_EQ(file->FindTensor("h")->data[9], 0x33);
    EXPECT_EQ(file->FindTensor("nope"), nullptr);
    EXPECT_EQ(file->total_tensor_bytes(), 12u + q.size() + 10u);
  }
}

TEST(GgufTest, WriterRejectsBadDeclarationsAndIncompleteData) {
  GgufWriter w;
  EXPECT_FALSE(w.AddTensor("", WeightType::kF32, {1}).ok());
  EXPECT_FALSE(w.AddTensor("a", WeightType::kF32, {}).ok());
  EXPECT_FALSE(w.AddTensor("a", WeightType::kF32, {0}).ok());
  EXPECT_FALSE(w.AddTensor("a", WeightType::kF32, {1, 1, 1, 1, 1}).ok());
  Status partial = w.AddTensor("a", WeightType::kQ4_0, {48});
  EXPECT_FALSE(partial.ok());
  EXPECT_NE(partial.message().find("multiple of the q4_0 block size 32"), std::string::npos);
  ASSERT_TRUE(w.AddTensor("a", WeightType::kF32, {4}).ok());
  EXPECT_FALSE(w.AddTensor("a", WeightType::kF32, {4}).ok());  // twice
  std::string path = TempPath("incomplete.gguf");
  ASSERT_TRUE(w.Open(path).ok());
  std::vector<uint8_t> some(8);
  ASSERT_TRUE(w.Append(some).ok());
  Status closed = w.Close();
  EXPECT_FALSE(closed.ok());
  EXPECT_NE(closed.message().find("'a' has only 8 of 16 bytes"), std::string::npos);
}

TEST(GgufTest, OpensEverySharedModel) {
  const std::string dir = std::string(TESSERA_SHARED_DIR) + "/models/";
  int opened = 0;
  for (const char* name :
       {"stories260K.gguf", "stories260K-F16.gguf", "stories260K-ffn192.gguf",
        "stories260K-ffn192-Q8_0.gguf", "stories260K-ffn192-Q4_0.gguf", "stories260K-moe4x2.gguf",
        "llama-2-tiny-random.gguf", "vocab/ggml-vocab-llama-spm.gguf"}) {
    Result<GgufFile> file = GgufFile::Open(dir + name);
    if (!file.ok() && file.status().code() == StatusCode::kNotFound) continue;
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ(*file->GetString("general.architecture"), "llama") << name;
    ++opened;
  }
  if (opened == 0) GTEST_SKIP() << "shared models not present";
  EXPECT_EQ(opened, 8);
  Result<GgufFile> q4 = GgufFile::Open(dir + "stories260K-ffn192-Q4_0.gguf");
  ASSERT_TRUE(q4.ok());
  const GgufTensor* down = q4->FindTensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, WeightType::kQ4_0);
  EXPECT_EQ(down->dims, (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(down->size_bytes(), 192u / 32 * 18 * 64);
}

// The fuzz seeds are written by an independent Python writer (fuzz/make_seeds.py):
// every one must parse, and the llama ones must load as models.
TEST(GgufTest, OpensEveryFuzzSeed) {
  const std::string dir = std::string(TESSERA_SOURCE_DIR) + "/fuzz/corpus/gguf/";
  int models = 0;
  for (const char* name :
       {"metadata_v3.gguf", "metadata_v2.gguf", "tensors_align64.gguf", "llama_spm_f32.gguf",
        "llama_spm_moe_q8_0.gguf", "llama_bpe_llama3.gguf", "vocab_bpe_qwen2.gguf"}) {
    Result<GgufFile> file = GgufFile::Open(dir + name);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    if (std::string_view(name).starts_with("llama_")) {
      Result<ModelConfig> c = ModelConfigFromGguf(*file);
      ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
      Status valid = ValidateModelTensors(*file, *c);
      EXPECT_TRUE(valid.ok()) << name << ": " << valid.ToString();
      ++models;
    }
  }
  EXPECT_EQ(models, 3);
  Result<GgufFile> v3 = GgufFile::Open(dir + "metadata_v3.gguf");
  ASSERT_TRUE(v3.ok());
  EXPECT_EQ(*v3->GetInt("i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*v3->GetString("str"), "héllo");
  EXPECT_EQ(v3->Find("arr_arr")->array_elements().size(), 2u);
}

}  // namespace
}  // namespace tessera::model
