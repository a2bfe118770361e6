// RankReport's wire form: a report with every field set comes back equal, and
// every truncation of it, or a ledger size out of range, is refused (it comes
// from another process).
#include "engine/rank_report.h"

#include <gtest/gtest.h>

namespace tessera::engine {
namespace {

RankReport FullReport() {
  RankReport r;
  r.rank = 3;
  r.stage = 1;
  r.tp_rank = 1;
  r.weight_bytes = 1000;
  r.kv_bytes = 2000;
  r.peak_rss_bytes = 3000;
  r.activation_bytes = 4000;
  r.links = "shm shm tcp self";
  r.decode = {.steps = 5, .compute_ns = 6, .comm_ns = 7, .wait_ns = 8};
  r.prefill = {.steps = 9, .compute_ns = 10, .comm_ns = 11, .wait_ns = 12};
  r.expert_rows_total = {1, 2, 3};
  r.expert_rows_computed = 6;
  StepTraffic& t = r.traffic.emplace_back();
  t.step_id = 42;
  t.decode = true;
  t.tokens = 2;
  t.bytes["tp/all_reduce"] = {.calls = 4, .bytes_sent = 512, .bytes_received = 512};
  r.ledger["tp/all_reduce"] = {.calls = 40, .bytes_sent = 5120, .bytes_received = 5121};
  r.ledger["ctl/send"] = {.calls = 3, .bytes_sent = 96, .bytes_received = 0};
  return r;
}

void ExpectEqualEntries(const std::map<std::string, comm::LedgerEntry>& a,
                        const std::map<std::string, comm::LedgerEntry>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, e] : a) {
    ASSERT_TRUE(b.contains(key)) << key;
    EXPECT_EQ(e.calls, b.at(key).calls) << key;
    EXPECT_EQ(e.bytes_sent, b.at(key).bytes_sent) << key;
    EXPECT_EQ(e.bytes_received, b.at(key).bytes_received) << key;
  }
}

TEST(RankReport, RoundTripsEveryField) {
  const RankReport in = FullReport();
  Result<RankReport> out = DecodeRankReport(EncodeRankReport(in));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->rank, 3);
  EXPECT_EQ(out->stage, 1);
  EXPECT_EQ(out->links, in.links);
  EXPECT_EQ(out->prefill.wait_ns, 12);
  EXPECT_EQ(out->expert_rows_total, in.expert_rows_total);
  ASSERT_EQ(out->traffic.size(), 1u);
  EXPECT_EQ(out->traffic[0].step_id, 42u);
  ExpectEqualEntries(out->traffic[0].bytes, in.traffic[0].bytes);
  ExpectEqualEntries(out->ledger, in.ledger);
}

TEST(RankReport, TruncatedOrOversizedIsRefused) {
  const std::vector<int64_t> words = EncodeRankReport(FullReport());
  for (size_t n = 0; n < words.size(); ++n) {
    EXPECT_FALSE(DecodeRankReport(std::span(words).first(n)).ok()) << n << " words";
  }
  std::vector<int64_t> bad = EncodeRankReport(RankReport{});
  bad.back() = 65;  // the ledger's size, the last word of a report without entries
  EXPECT_FALSE(DecodeRankReport(bad).ok());
  bad.back() = -1;
  EXPECT_FALSE(DecodeRankReport(bad).ok());
}

}  // namespace
}  // namespace tessera::engine
