// The SentencePiece ("llama") tokenizer against llama.cpp's test vectors
// (shared/models/vocab/ggml-vocab-llama-spm.gguf.inp/.out) and the stories260K
// reference prompt.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace tessera::model {
namespace {

const std::string kShared = TESSERA_SHARED_DIR;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Loaded {
  GgufFile file;
  Tokenizer tokenizer;
};

Result<Loaded> Load(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  TESSERA_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::FromGguf(file));
  return Loaded{std::move(file), std::move(tokenizer)};
}

TEST(SpmTokenizerTest, ReproducesLlamaCppVocabVectors) {
  std::string base = kShared + "/models/vocab/ggml-vocab-llama-spm.gguf";
  Result<Loaded> loaded = Load(base);
  if (!loaded.ok() && loaded.status().code() == StatusCode::kNotFound) {
    GTEST_SKIP() << "shared models not present: " << loaded.status().ToString();
  }
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tokenizer& tok = loaded->tokenizer;
  EXPECT_EQ(tok.kind(), VocabKind::kSpm);
  EXPECT_EQ(tok.vocab_size(), 32000);

  const std::string separator = "\n__ggml_vocab_test__\n";
  std::string inp = ReadFile(base + ".inp");
  std::vector<std::string> inputs;
  for (size_t start = 0; start < inp.size();) {
    size_t end = inp.find(separator, start);
    ASSERT_NE(end, std::string::npos) << "input file does not end with the separator";
    inputs.push_back(inp.substr(start, end - start));
    start = end + separator.size();
  }
  std::ifstream out(base + ".out");
  std::vector<std::vector<TokenId>> expected;
  for (std::string line; std::getline(out, line);) {
    std::istringstream ss(line);
    std::vector<TokenId> ids;
    for (TokenId id; ss >> id;) ids.push_back(id);
    expected.push_back(ids);
  }
  ASSERT_EQ(inputs.size(), 46u);
  ASSERT_EQ(inputs.size(), expected.size());
  int passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<TokenId> ids = tok.Encode(inputs[i], {.add_special = false});
    EXPECT_EQ(ids, expected[i]) << "test string #" << i << ": '" << inputs[i] << "'";
    passed += ids == expected[i];
    // Decoding gives back the text with the space prefix SPM adds.
    if (!inputs[i].empty()) {
      EXPECT_EQ(tok.Decode(ids), " " + inputs[i]) << "#" << i;
    }
  }
  EXPECT_EQ(passed, 46);
}

// llama.cpp's test-tokenizer-1-spm: every token's text survives encode/decode.
TEST(SpmTokenizerTest, EveryTokenRoundTrips) {
  Result<Loaded> loaded = Load(kShared + "/models/vocab/ggml-vocab-llama-spm.gguf");
  if (!loaded.ok() && loaded.status().code() == StatusCode::kNotFound) GTEST_SKIP();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tokenizer& tok = loaded->tokenizer;
  int checked = 0;
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    if (tok.GetTokenType(id) == TokenType::kControl) continue;
    std::string piece = tok.TokenPiece(id);
    std::vector<TokenId> ids = tok.Encode(piece, {.add_special = false});
    ASSERT_EQ(tok.Decode(ids), " " + piece) << "token " << id << " '" << tok.TokenText(id) << "'";
    ++checked;
  }
  EXPECT_GT(checked, 31990);
}

TEST(SpmTokenizerTest, Stories260KPromptMatchesReference) {
  Result<Loaded> loaded = Load(kShared + "/models/stories260K.gguf");
  if (!loaded.ok() && loaded.status().code() == StatusCode::kNotFound) GTEST_SKIP();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  // refs/stories260K.json: "prompt_ids": [1, 403, 407, 261, 378]
  std::vector<TokenId> expected = {1, 403, 407, 261, 378};
  EXPECT_EQ(loaded->tokenizer.Encode("Once upon a time"), expected);
  std::vector<TokenId> no_bos(expected.begin() + 1, expected.end());
  EXPECT_EQ(loaded->tokenizer.Encode("Once upon a time", {.add_special = false}), no_bos);
  EXPECT_EQ(loaded->tokenizer.Decode(expected), " Once upon a time");
  EXPECT_TRUE(loaded->tokenizer.IsEndOfGeneration(2));
  EXPECT_FALSE(loaded->tokenizer.IsEndOfGeneration(1));
}

}  // namespace
}  // namespace tessera::model
