// Byte-level BPE ("gpt2" vocab): the GPT-2 / Llama 3 / Qwen2 pre-tokenizers against
// the expressions themselves, and merging, byte mapping, special tokens and
// decoding on a small hand-made vocabulary.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/pre_tokenizer.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace tessera::model {
namespace {

struct SplitCase {
  std::string text;
  std::vector<std::string> words;
};

std::vector<std::string> Split(const std::string& text, PreTokenizer kind) {
  std::vector<std::string> out;
  for (std::string_view w : PreTokenize(text, kind)) out.emplace_back(w);
  return out;
}

// Expected words: what Python's `regex` module returns for llama.cpp's expressions
// (see pre_tokenizer.cc) on each text. The splitter also agreed with it on 60,000
// random strings over letters, digits, marks, spaces, CR/LF, CJK and emoji.
TEST(PreTokenizerTest, Gpt2MatchesItsExpression) {
  const std::vector<SplitCase> cases = {
      {"Hello world", {"Hello", " world"}},
      {"I'm here, you're not!  ", {"I", "'m", " here", ",", " you", "'re", " not", "!", "  "}},
      {"it'S 'LL we'Ve", {"it", "'", "S", " '", "LL", " we", "'", "Ve"}},
      {"  leading\tand\n\n trailing  ", {" ", " leading", "\t", "and", "\n\n", " trailing", "  "}},
      {"12345 678", {"12345", " 678"}},
      {"x²+½=Ⅻ", {"x", "²", "+", "½", "=", "Ⅻ"}},
      {"привет мир", {"привет", " мир"}},
      {"中文ア日本", {"中文ア日本"}},
      {" ...!!\r\n\r\nok", {" ...!!", "\r\n\r", "\n", "ok"}},
      {"🦙.cpp 😀😀", {"🦙.", "cpp", " 😀😀"}},
      {"a\u00a0b\u3000c", {"a", "\u00a0", "b", "\u3000", "c"}},
      {"'era 'twas", {"'", "era", " '", "twas"}},
  };
  for (const SplitCase& c : cases) EXPECT_EQ(Split(c.text, PreTokenizer::kGpt2), c.words) << c.text;
}

TEST(PreTokenizerTest, Llama3MatchesItsExpression) {
  const std::vector<SplitCase> cases = {
      {"Hello world", {"Hello", " world"}},
      {"I'm here, you're not!  ", {"I", "'m", " here", ",", " you", "'re", " not", "!", "  "}},
      {"it'S 'LL we'Ve", {"it", "'S", " '", "LL", " we", "'Ve"}},
      {"  leading\tand\n\n trailing  ", {" ", " leading", "\tand", "\n\n", " trailing", "  "}},
      {"12345 678", {"123", "45", " ", "678"}},
      {"x²+½=Ⅻ", {"x", "²", "+", "½", "=", "Ⅻ"}},
      {"привет мир", {"привет", " мир"}},
      {"中文ア日本", {"中文ア日本"}},
      {" ...!!\r\n\r\nok", {" ...!!\r\n\r\n", "ok"}},
      {"🦙.cpp 😀😀", {"🦙.", "cpp", " 😀😀"}},
      {"a\u00a0b\u3000c", {"a", "\u00a0b", "\u3000c"}},
      {"'era 'twas", {"'era", " '", "twas"}},
  };
  for (const SplitCase& c : cases) {
    EXPECT_EQ(Split(c.text, PreTokenizer::kLlama3), c.words) << c.text;
  }
}

TEST(PreTokenizerTest, Qwen2MatchesItsExpression) {
  const std::vector<SplitCase> cases = {
      {"Hello world", {"Hello", " world"}},
      {"I'm here, you're not!  ", {"I", "'m", " here", ",", " you", "'re", " not", "!", "  "}},
      {"it'S 'LL we'Ve", {"it", "'S", " '", "LL", " we", "'Ve"}},
      {"  leading\tand\n\n trailing  ", {" ", " leading", "\tand", "\n\n", " trailing", "  "}},
      {"12345 678", {"1", "2", "3", "4", "5", " ", "6", "7", "8"}},
      {"x²+½=Ⅻ", {"x", "²", "+", "½", "=", "Ⅻ"}},
      {"привет мир", {"привет", " мир"}},
      {"中文ア日本", {"中文ア日本"}},
      {" ...!!\r\n\r\nok", {" ...!!\r\n\r\n", "ok"}},
      {"🦙.cpp 😀😀", {"🦙.", "cpp", " 😀😀"}},
      {"a\u00a0b\u3000c", {"a", "\u00a0b", "\u3000c"}},
      {"'era 'twas", {"'era", " '", "twas"}},
  };
  for (const SplitCase& c : cases) {
    EXPECT_EQ(Split(c.text, PreTokenizer::kQwen2), c.words) << c.text;
  }
}

TEST(PreTokenizerTest, InvalidUtf8IsKeptAndEmptyGivesNothing) {
  EXPECT_TRUE(PreTokenize("", PreTokenizer::kLlama3).empty());
  std::string text = "ab\xff\xfe cd";
  std::string joined;
  for (std::string_view w : PreTokenize(text, PreTokenizer::kLlama3)) joined += w;
  EXPECT_EQ(joined, text);
  EXPECT_EQ(Split(text, PreTokenizer::kNone), std::vector<std::string>{text});
}

// A byte-level vocabulary: token id b is byte b's printable character, then merge
// results. Merges are listed in rank order.
class BpeTokenizerTest : public ::testing::Test {
 protected:
  static std::string ByteChar(uint8_t b);

  VocabData MakeVocab(PreTokenizer pre) {
    VocabData v;
    v.kind = VocabKind::kBpe;
    v.pre = pre;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteChar(static_cast<uint8_t>(b)));
    const std::string G = ByteChar(' ');  // "Ġ"
    v.merges = {"l l", "e ll",       "h ell", "hell o", G + " w", "o r", G + "w or",
                "l d", G + "wor ld", "x y",   "1 2",    "12 3",   "3 4", "4 5"};
    for (std::string t :
         {std::string("ll"), std::string("ell"), std::string("hell"), std::string("hello"), G + "w",
          std::string("or"), G + "wor", std::string("ld"), G + "world", std::string("12"),
          std::string("123"), std::string("34"), std::string("45"), G + "qq"}) {
      v.tokens.push_back(t);  // note: no "xy" token for the "x y" merge
    }
    v.tokens.push_back("<|end|>");
    v.types.assign(v.tokens.size(), TokenType::kNormal);
    v.types.back() = TokenType::kControl;
    v.eos_id = static_cast<TokenId>(v.tokens.size() - 1);
    return v;
  }

  Tokenizer Make(PreTokenizer pre) {
    Result<Tokenizer> t = Tokenizer::FromVocab(MakeVocab(pre));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }

  static std::vector<TokenId> Bytes(std::string_view s) {
    std::vector<TokenId> out;
    for (char c : s) out.push_back(static_cast<uint8_t>(c));
    return out;
  }
};

std::string BpeTokenizerTest::ByteChar(uint8_t b) {
  // GPT-2's map: printable bytes are themselves, the other 68 follow U+0100 in order.
  auto printable = [](int x) {
    return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
  };
  uint32_t cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += !printable(x);
  }
  std::string out;
  AppendUtf8(cp, &out);
  return out;
}

TEST_F(BpeTokenizerTest, MergesByRank) {
  Tokenizer tok = Make(PreTokenizer::kGpt2);
  TokenId hello = tok.Find("hello"), world = tok.Find("\xC4\xA0world");
  ASSERT_GE(hello, 256);
  ASSERT_GE(world, 256);
  EXPECT_EQ(tok.Encode("hello world", {.add_special = false}),
            (std::vector<TokenId>{hello, world}));
  // Equal ranks merge leftmost first: "lll" -> "ll" + "l".
  EXPECT_EQ(tok.Encode("lll", {.add_special = false}), (std::vector<TokenId>{tok.Find("ll"), 'l'}));
  // A merge whose result is not a token falls back to one token per character.
  EXPECT_EQ(tok.Encode("xy", {.add_special = false}), Bytes("xy"));
  // Bytes outside ASCII and control bytes map through GPT-2's byte characters.
  EXPECT_EQ(tok.Encode("é\n", {.add_special = false}), Bytes("é\n"));
  EXPECT_EQ(tok.TokenText('\n'), "\xC4\x8A");  // "Ċ"
}

TEST_F(BpeTokenizerTest, PreTokenizerChangesDigitGrouping) {
  // gpt2: one word "45123" -> 45 + 123; llama3: "451" "23"; qwen2: single digits.
  Tokenizer gpt2 = Make(PreTokenizer::kGpt2);
  Tokenizer llama3 = Make(PreTokenizer::kLlama3);
  Tokenizer qwen2 = Make(PreTokenizer::kQwen2);
  TokenId t45 = gpt2.Find("45"), t123 = gpt2.Find("123");
  EXPECT_EQ(gpt2.Encode("45123", {.add_special = false}), (std::vector<TokenId>{t45, t123}));
  EXPECT_EQ(llama3.Encode("45123", {.add_special = false}),
            (std::vector<TokenId>{t45, '1', '2', '3'}));
  EXPECT_EQ(qwen2.Encode("45123", {.add_special = false}), Bytes("45123"));
}

TEST_F(BpeTokenizerTest, Llama3TakesWholeWordTokensBeforeMerging) {
  // " qq" is a token but no merge produces it: llama3 (ignore_merges) uses it.
  Tokenizer gpt2 = Make(PreTokenizer::kGpt2);
  Tokenizer llama3 = Make(PreTokenizer::kLlama3);
  TokenId qq = llama3.Find("\xC4\xA0qq");
  EXPECT_EQ(llama3.Encode(" qq", {.add_special = false}), std::vector<TokenId>{qq});
  EXPECT_EQ(gpt2.Encode(" qq", {.add_special = false}), Bytes(" qq"));
}

TEST_F(BpeTokenizerTest, SpecialTokensAndBos) {
  VocabData v = MakeVocab(PreTokenizer::kLlama3);
  v.bos_id = 'B';  // any id, for the test
  v.add_bos = true;
  Result<Tokenizer> tok = Tokenizer::FromVocab(std::move(v));
  ASSERT_TRUE(tok.ok());
  TokenId end = tok->Find("<|end|>");
  std::vector<TokenId> parsed =
      tok->Encode("hi<|end|>", {.add_special = true, .parse_special = true});
  EXPECT_EQ(parsed, (std::vector<TokenId>{'B', 'h', 'i', end}));
  std::vector<TokenId> literal = tok->Encode("hi<|end|>", {.add_special = false});
  EXPECT_EQ(literal, Bytes("hi<|end|>"));
  EXPECT_TRUE(tok->IsEndOfGeneration(end));
  EXPECT_EQ(tok->TokenPiece(end), "");
  EXPECT_EQ(tok->TokenPiece(end, /*render_special=*/true), "<|end|>");
}

TEST_F(BpeTokenizerTest, DecodeRoundTripsAnyBytes) {
  Tokenizer tok = Make(PreTokenizer::kLlama3);
  for (std::string text : {std::string("hello world"), std::string("  x\ty\r\n"),
                           std::string("\xff\xfe\x00z", 4), std::string("é🦙 45123 lll")}) {
    EXPECT_EQ(tok.Decode(tok.Encode(text, {.add_special = false})), text);
  }
}

TEST_F(BpeTokenizerTest, BadVocabulariesAreErrors) {
  VocabData v = MakeVocab(PreTokenizer::kGpt2);
  v.merges.push_back("nospace");
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  v = MakeVocab(PreTokenizer::kGpt2);
  v.types.pop_back();
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  v = MakeVocab(PreTokenizer::kGpt2);
  v.types[3] = static_cast<TokenType>(9);
  EXPECT_FALSE(Tokenizer::FromVocab(v).ok());
  EXPECT_FALSE(Tokenizer::FromVocab(VocabData{}).ok());
}

}  // namespace
}  // namespace tessera::model
