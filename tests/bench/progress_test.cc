// Progress display: the bar and log-line formats, the ~10% log steps, and the
// reporter writing log lines (not a terminal) and ending the bar's line (terminal).
#include "bench/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace tessera::bench {
namespace {

TEST(ProgressTest, BarShowsCountsFailuresTimeAndThroughput) {
  ProgressSnapshot s{
      .num_done = 45, .num_total = 100, .num_failed = 2, .elapsed_s = 12.34, .output_tokens = 5000};
  EXPECT_EQ(FormatProgressBar(s),
            "[##########..............] 45/100  45%  failed 2  12.3 s  405.2 out tok/s");
  s.label = "rate 4";
  s.num_done = 100;
  EXPECT_EQ(FormatProgressBar(s),
            "rate 4: [########################] 100/100 100%  failed 2  12.3 s  405.2 out tok/s");
  s.num_done = 0;
  s.elapsed_s = 0.04;  // too early for a rate
  EXPECT_EQ(FormatProgressBar(s),
            "rate 4: [........................] 0/100   0%  failed 2  0.0 s  0.0 out tok/s");
}

TEST(ProgressTest, LogLine) {
  ProgressSnapshot s{
      .num_done = 50, .num_total = 100, .num_failed = 0, .elapsed_s = 2, .output_tokens = 640};
  EXPECT_EQ(FormatProgressLine(s), "progress: 50/100 (50%), failed 0, 2.0 s, 320.0 out tok/s\n");
  s.label = "rate inf";
  EXPECT_EQ(FormatProgressLine(s),
            "rate inf: progress: 50/100 (50%), failed 0, 2.0 s, 320.0 out tok/s\n");
}

TEST(ProgressTest, LogStepsEveryTenPercent) {
  int lines = 0;
  for (int done = 1; done <= 100; ++done) lines += IsProgressLogStep(done, 100);
  EXPECT_EQ(lines, 10);
  EXPECT_TRUE(IsProgressLogStep(10, 100));
  EXPECT_FALSE(IsProgressLogStep(11, 100));
  // Fewer than 10 requests: every one; 25 requests: every 3rd and the last.
  for (int done = 1; done <= 7; ++done) EXPECT_TRUE(IsProgressLogStep(done, 7));
  EXPECT_TRUE(IsProgressLogStep(24, 25));
  EXPECT_FALSE(IsProgressLogStep(23, 25));
  EXPECT_TRUE(IsProgressLogStep(25, 25));
  EXPECT_FALSE(IsProgressLogStep(0, 25));
}

std::string Contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[256];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  return out;
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ProgressTest, ReporterLogsTenLinesWhenNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressReporter progress(f, /*is_terminal=*/false, 20, "");
    RequestOutcome ok{.ok = true, .output_tokens = 5};
    RequestOutcome failed{.ok = false, .error = "boom"};
    for (int i = 0; i < 20; ++i) progress.OnRequestDone(i % 4 == 0 ? failed : ok);
    progress.Finish();
    progress.OnRequestDone(ok);  // after Finish: ignored
  }
  const std::string text = Contents(f);
  std::fclose(f);
  EXPECT_EQ(CountOf(text, "progress: "), 10) << text;
  EXPECT_EQ(CountOf(text, "\n"), 10) << text;
  EXPECT_NE(text.find("progress: 2/20 (10%), failed 1,"), std::string::npos) << text;
  EXPECT_NE(text.find("progress: 20/20 (100%), failed 5,"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

TEST(ProgressTest, TerminalBarEndsItsLineOnFinish) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressReporter progress(f, /*is_terminal=*/true, 3, "rate 2");
    RequestOutcome ok{.ok = true, .output_tokens = 4};
    for (int i = 0; i < 3; ++i) progress.OnRequestDone(ok);
    progress.Finish();
  }
  const std::string text = Contents(f);
  std::fclose(f);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.front(), '\r');
  // Redrawn in place, then exactly one line end, last: the report can follow.
  EXPECT_EQ(CountOf(text, "\n"), 1) << text;
  EXPECT_EQ(text.back(), '\n');
  const size_t last = text.rfind('\r');
  EXPECT_EQ(text.substr(last).find("\rrate 2: [########################] 3/3 100%  failed 0"), 0u)
      << text;
  EXPECT_NE(text.find("\033[K\n"), std::string::npos);
}

}  // namespace
}  // namespace tessera::bench
