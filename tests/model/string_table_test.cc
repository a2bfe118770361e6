// StringTable (the tokenizer's vocabulary and merge storage) against a
// std::map reference: positions, lookups of present and absent texts, the
// duplicate rules, the empty string, and its heap size.
#include "model/string_table.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace tessera::model {
namespace {

std::vector<std::string> RandomStrings(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string s(rng() % 9, '\0');  // short, with repeats and the empty string
    for (char& c : s) c = static_cast<char>('a' + rng() % 3);
    out.push_back(std::move(s));
  }
  return out;
}

TEST(StringTableTest, FindsEveryTextByTheRuleAndNothingElse) {
  const std::vector<std::string> strings = RandomStrings(5000, 7);
  for (const auto rule :
       {StringTable::Duplicates::kFirstWins, StringTable::Duplicates::kLastWins}) {
    Result<StringTable> built = StringTable::Build(strings, rule);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    const StringTable& table = *built;
    ASSERT_EQ(table.size(), 5000);
    std::map<std::string, int32_t> reference;
    for (int32_t i = 0; i < 5000; ++i) {
      EXPECT_EQ(table[i], strings[i]);
      if (rule == StringTable::Duplicates::kLastWins || !reference.contains(strings[i])) {
        reference[strings[i]] = i;
      }
    }
    ASSERT_LT(reference.size(), 5000u);  // the test has duplicates to resolve
    for (const auto& [text, position] : reference) EXPECT_EQ(table.Find(text), position) << text;
    for (const std::string& absent : RandomStrings(2000, 8)) {
      EXPECT_EQ(table.Find(absent + "d"), -1);  // no text in the table holds a d
    }
  }
}

TEST(StringTableTest, BuildsFromStringViewsAndWhenEmpty) {
  const std::vector<std::string_view> views = {"▁the", "<0x0A>", "", "▁the"};
  Result<StringTable> table = StringTable::Build(views, StringTable::Duplicates::kLastWins);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->Find("▁the"), 3);
  EXPECT_EQ(table->Find(""), 2);
  EXPECT_EQ((*table)[1], "<0x0A>");
  EXPECT_EQ(table->Find("<0x0B>"), -1);

  Result<StringTable> empty =
      StringTable::Build(std::span<const std::string>{}, StringTable::Duplicates::kFirstWins);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0);
  EXPECT_EQ(empty->Find(""), -1);
  EXPECT_EQ(StringTable().Find("x"), -1);
}

TEST(StringTableTest, CostsAnOffsetAndAHalfFullIndexBeyondItsText) {
  std::vector<std::string> strings;
  size_t text_bytes = 0;
  for (int i = 0; i < 32000; ++i) {
    strings.push_back("piece" + std::to_string(i));
    text_bytes += strings.back().size();
  }
  Result<StringTable> table = StringTable::Build(strings, StringTable::Duplicates::kLastWins);
  ASSERT_TRUE(table.ok());
  // 4 bytes of offset a string and a half-full index of 4-byte slots (65536 here).
  EXPECT_LE(table->MemoryBytes(), text_bytes + 4 * 32001 + 4 * 65536);
  EXPECT_EQ(table->Find("piece31999"), 31999);
}

}  // namespace
}  // namespace tessera::model
