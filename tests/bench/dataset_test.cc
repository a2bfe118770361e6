#include "bench/dataset.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

namespace tessera::bench {
namespace {

int64_t CountWords(const std::string& text) {
  std::istringstream in(text);
  std::string w;
  int64_t n = 0;
  while (in >> w) ++n;
  return n;
}

TEST(DatasetTest, RandomPromptsHaveInputLenWords) {
  DatasetOptions o{.num_prompts = 10, .input_len = 37, .output_len = 5, .seed = 3};
  auto ds = MakeDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ASSERT_EQ(ds->size(), 10u);
  for (const BenchRequest& r : *ds) {
    EXPECT_EQ(CountWords(r.prompt), 37);
    EXPECT_EQ(r.approx_prompt_tokens, 37);
    EXPECT_EQ(r.max_output_tokens, 5);
    EXPECT_NE(r.prompt.front(), ' ');
  }
  EXPECT_NE((*ds)[0].prompt, (*ds)[1].prompt);
}

TEST(DatasetTest, SharedPrefix) {
  DatasetOptions o{.kind = DatasetKind::kSharedPrefix,
                   .num_prompts = 4,
                   .input_len = 8,
                   .output_len = 2,
                   .prefix_len = 20};
  auto ds = MakeDataset(o);
  ASSERT_TRUE(ds.ok());
  const std::string& first = (*ds)[0].prompt;
  // The first 20 words are common to every prompt.
  size_t pos = 0;
  for (int i = 0; i < 20; ++i) pos = first.find(' ', pos + 1);
  for (const BenchRequest& r : *ds) {
    EXPECT_EQ(r.prompt.substr(0, pos), first.substr(0, pos));
    EXPECT_EQ(CountWords(r.prompt), 28);
    EXPECT_EQ(r.approx_prompt_tokens, 28);
  }
  o.prefix_len = 0;
  EXPECT_FALSE(MakeDataset(o).ok());
}

TEST(DatasetTest, SharedPrefixPerTenant) {
  DatasetOptions o{.kind = DatasetKind::kSharedPrefix,
                   .num_prompts = 6,
                   .input_len = 4,
                   .output_len = 2,
                   .prefix_len = 10,
                   .num_prefixes = 3};
  auto ds = MakeDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  auto prefix = [](const std::string& p) {
    size_t pos = 0;
    for (int i = 0; i < 10; ++i) pos = p.find(' ', pos + 1);
    return p.substr(0, pos);
  };
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(prefix((*ds)[i].prompt), prefix((*ds)[i % 3].prompt));  // tenant i mod 3
    EXPECT_EQ(CountWords((*ds)[i].prompt), 14);
  }
  EXPECT_NE(prefix((*ds)[0].prompt), prefix((*ds)[1].prompt));
  o.num_prefixes = 0;
  EXPECT_FALSE(MakeDataset(o).ok());
}

TEST(DatasetTest, ShuffledTenantsKeepTheirCounts) {
  DatasetOptions o{.kind = DatasetKind::kSharedPrefix,
                   .num_prompts = 64,
                   .input_len = 2,
                   .output_len = 2,
                   .prefix_len = 3,
                   .num_prefixes = 4,
                   .shuffle_tenants = true};
  auto ds = MakeDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  auto prefix = [&](size_t i) {  // the first 3 words: the tenant's prefix
    const std::string& p = (*ds)[i].prompt;
    size_t pos = 0;
    for (int w = 0; w < 3; ++w) pos = p.find(' ', pos + 1);
    return p.substr(0, pos);
  };
  std::map<std::string, int> count;
  bool in_order = true;
  for (size_t i = 0; i < ds->size(); ++i) {
    ++count[prefix(i)];
    if (i >= 4 && prefix(i) != prefix(i - 4)) in_order = false;
  }
  ASSERT_EQ(count.size(), 4u);
  for (const auto& [prefix, n] : count) EXPECT_EQ(n, 16) << prefix;
  EXPECT_FALSE(in_order);  // not tenant i mod 4
}

TEST(DatasetTest, MultiTurnIsTurnMajor) {
  DatasetOptions o{.kind = DatasetKind::kMultiTurn,
                   .num_prompts = 6,
                   .input_len = 5,
                   .output_len = 3,
                   .num_turns = 3};
  auto ds = MakeDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ASSERT_EQ(ds->size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const BenchRequest& r = (*ds)[i];
    EXPECT_EQ(r.turn, static_cast<int64_t>(i / 2 + 1));  // 2 conversations
    EXPECT_EQ(r.previous_turn, i < 2 ? -1 : static_cast<int64_t>(i) - 2);
    EXPECT_EQ(CountWords(r.prompt), 5);          // the new question only
    EXPECT_EQ(r.prompt.front() == ' ', i >= 2);  // later turns append to the conversation
  }
  EXPECT_EQ(*ParseDatasetKind("multi-turn"), DatasetKind::kMultiTurn);
  o.num_turns = 0;
  EXPECT_FALSE(MakeDataset(o).ok());
}

TEST(DatasetTest, MixedHasRequestedShareOfLongPrompts) {
  DatasetOptions o{.kind = DatasetKind::kMixed,
                   .num_prompts = 20,
                   .input_len = 10,
                   .output_len = 2,
                   .long_input_len = 100,
                   .long_fraction = 0.25};
  auto ds = MakeDataset(o);
  ASSERT_TRUE(ds.ok());
  int num_long = 0;
  for (const BenchRequest& r : *ds) {
    ASSERT_TRUE(r.approx_prompt_tokens == 10 || r.approx_prompt_tokens == 100);
    EXPECT_EQ(CountWords(r.prompt), r.approx_prompt_tokens);
    num_long += r.approx_prompt_tokens == 100;
  }
  EXPECT_EQ(num_long, 5);
}

TEST(DatasetTest, RejectsBadOptions) {
  EXPECT_FALSE(MakeDataset({.num_prompts = 0}).ok());
  EXPECT_FALSE(MakeDataset({.input_len = 0}).ok());
  EXPECT_FALSE(ParseDatasetKind("sharegpt").ok());
  EXPECT_EQ(*ParseDatasetKind("mixed"), DatasetKind::kMixed);
}

}  // namespace
}  // namespace tessera::bench
