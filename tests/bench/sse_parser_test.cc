#include "bench/sse_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::bench {
namespace {

std::vector<std::string> FeedAll(const std::vector<std::string>& pieces, bool finish = true) {
  SseParser parser;
  std::vector<std::string> events;
  auto on_data = [&](std::string_view d) { events.emplace_back(d); };
  for (const std::string& p : pieces) parser.Feed(p, on_data);
  if (finish) parser.Finish(on_data);
  return events;
}

TEST(SseParserTest, WholeEvents) {
  auto events = FeedAll({"data: {\"a\":1}\n\ndata: [DONE]\n\n"});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "{\"a\":1}");
  EXPECT_EQ(events[1], "[DONE]");
}

// Every possible split point of a two-event stream gives the same events.
TEST(SseParserTest, EverySplitPointGivesSameEvents) {
  const std::string stream = "data: {\"x\":\"he\"}\r\n\r\n: keep-alive\n\ndata:{\"x\":\"llo\"}\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    for (size_t cut2 = cut; cut2 <= stream.size(); cut2 += 3) {
      auto events =
          FeedAll({stream.substr(0, cut), stream.substr(cut, cut2 - cut), stream.substr(cut2)});
      ASSERT_EQ(events.size(), 2u) << "cut " << cut << "," << cut2;
      EXPECT_EQ(events[0], "{\"x\":\"he\"}");
      EXPECT_EQ(events[1], "{\"x\":\"llo\"}");
    }
  }
}

TEST(SseParserTest, ByteAtATime) {
  const std::string stream = "event: message\ndata: one\ndata: two\nid: 3\n\ndata: three\n\n";
  SseParser parser;
  std::vector<std::string> events;
  auto on_data = [&](std::string_view d) { events.emplace_back(d); };
  for (char c : stream) parser.Feed(std::string_view(&c, 1), on_data);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "one\ntwo");  // multi-line data joins with '\n'
  EXPECT_EQ(events[1], "three");
}

TEST(SseParserTest, NoEventBeforeBlankLineUntilFinish) {
  EXPECT_TRUE(FeedAll({"data: partial"}, /*finish=*/false).empty());
  EXPECT_TRUE(FeedAll({"data: complete line\n"}, /*finish=*/false).empty());
  auto events = FeedAll({"data: tail-without-newline"});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], "tail-without-newline");
}

TEST(StreamChunkTest, CompletionText) {
  auto chunk = ParseStreamChunk(R"({"choices":[{"index":0,"text":" world"}]})");
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->text, " world");
  EXPECT_FALSE(chunk->prompt_tokens.has_value());
}

TEST(StreamChunkTest, ChatDeltaAndNullContent) {
  auto chunk = ParseStreamChunk(R"({"choices":[{"delta":{"content":"hi"}}]})");
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->text, "hi");
  auto role_only =
      ParseStreamChunk(R"({"choices":[{"delta":{"role":"assistant","content":null}}]})");
  ASSERT_TRUE(role_only.ok());
  EXPECT_EQ(role_only->text, "");
}

TEST(StreamChunkTest, UsageChunk) {
  auto chunk = ParseStreamChunk(
      R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}})");
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->text, "");
  EXPECT_EQ(chunk->prompt_tokens, 12);
  EXPECT_EQ(chunk->completion_tokens, 5);
}

TEST(StreamChunkTest, DoneErrorAndGarbage) {
  auto done = ParseStreamChunk("[DONE]");
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
  auto err = ParseStreamChunk(R"({"error":{"message":"out of KV blocks","code":503}})");
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->error, "out of KV blocks");
  EXPECT_FALSE(ParseStreamChunk("{not json").ok());
}

}  // namespace
}  // namespace tessera::bench
