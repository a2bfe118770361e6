// UTF-8 helpers, character classes, and the streaming decoder that holds back
// incomplete UTF-8 (byte-fallback tokens split an emoji over several tokens).
#include "model/unicode.h"

#include <gtest/gtest.h>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace tessera::model {
namespace {

TEST(UnicodeTest, DecodesAndRejectsInvalidSequences) {
  std::string text = "aé€🦙";
  size_t pos = 0;
  EXPECT_EQ(DecodeUtf8(text, &pos), 'a');
  EXPECT_EQ(DecodeUtf8(text, &pos), 0xE9u);
  EXPECT_EQ(DecodeUtf8(text, &pos), 0x20ACu);
  EXPECT_EQ(DecodeUtf8(text, &pos), 0x1F999u);
  EXPECT_EQ(pos, text.size());
  for (std::string bad : {"\x80", "\xC0\xAF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                          "\xE2\x82", "\xFF"}) {
    pos = 0;
    EXPECT_EQ(DecodeUtf8(bad, &pos), kInvalidCodepoint) << bad.size();
    EXPECT_EQ(pos, 1u);
  }
  std::string out;
  for (uint32_t cp : {0x41u, 0xE9u, 0x20ACu, 0x1F999u}) AppendUtf8(cp, &out);
  EXPECT_EQ(out, "Aé€🦙");
  EXPECT_EQ(SanitizeUtf8("a\xFF"
                         "b"),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(UnicodeTest, IncompleteSuffix) {
  EXPECT_EQ(IncompleteUtf8Suffix(""), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("abc"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0"), 1u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0\x9F"), 2u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0\x9F\xA6"), 3u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xF0\x9F\xA6\x99"), 0u);  // complete
  EXPECT_EQ(IncompleteUtf8Suffix("\xE2\x82"), 2u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xE0\x80"), 0u);  // can never complete: emit now
  EXPECT_EQ(IncompleteUtf8Suffix("\x80\x80"), 0u);  // stray continuations
  EXPECT_EQ(IncompleteUtf8Suffix("\xC0"), 0u);      // never a valid lead
}

TEST(UnicodeTest, CharacterClasses) {
  for (uint32_t cp : {uint32_t{'a'}, uint32_t{'Z'}, 0xE9u, 0x4E2Du, 0x0416u, 0x30A2u})
    EXPECT_TRUE(IsLetter(cp)) << cp;
  for (uint32_t cp : {uint32_t{'1'}, 0xB2u, 0xBDu, 0x216Bu, 0x0663u})
    EXPECT_TRUE(IsNumber(cp)) << cp;
  for (uint32_t cp : {0x20u, 0x09u, 0x0Au, 0xA0u, 0x3000u, 0x2009u}) EXPECT_TRUE(IsWhitespace(cp));
  for (uint32_t cp : {uint32_t{'!'}, uint32_t{'_'}, 0x0301u, 0x1F999u}) {
    EXPECT_FALSE(IsLetter(cp) || IsNumber(cp) || IsWhitespace(cp)) << cp;
  }
}

TEST(IncrementalDecoderTest, HoldsBackSplitEmojiUntilComplete) {
  Result<GgufFile> file =
      GgufFile::Open(std::string(TESSERA_SHARED_DIR) + "/models/vocab/ggml-vocab-llama-spm.gguf");
  if (!file.ok() && file.status().code() == StatusCode::kNotFound) GTEST_SKIP();
  ASSERT_TRUE(file.ok());
  Result<Tokenizer> tok = Tokenizer::FromGguf(*file);
  ASSERT_TRUE(tok.ok());
  // "🦙" is not in the vocabulary: it encodes as 4 byte tokens <0xF0><0x9F><0xA6><0x99>.
  std::vector<TokenId> ids = tok->Encode("a 🦙!", {.add_special = false});
  IncrementalDecoder decoder(*tok);
  std::vector<std::string> pieces;
  for (TokenId id : ids) pieces.push_back(decoder.Push(id));
  pieces.push_back(decoder.Flush());
  std::string joined;
  int empty = 0;
  for (const std::string& p : pieces) {
    joined += p;
    empty += p.empty();
    size_t pos = 0;
    while (pos < p.size()) ASSERT_NE(DecodeUtf8(p, &pos), kInvalidCodepoint) << "invalid piece";
  }
  EXPECT_EQ(joined, " a 🦙!");
  EXPECT_GE(empty, 3);  // three of the four byte tokens produced nothing yet

  // A dangling partial sequence is flushed as U+FFFD.
  IncrementalDecoder partial(*tok);
  EXPECT_EQ(partial.Push(tok->Find("<0xF0>")), "");
  EXPECT_EQ(partial.Flush(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace tessera::model
