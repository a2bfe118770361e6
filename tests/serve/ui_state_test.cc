// UiStateJson: per-rank time over the last interval (and none across a restart),
// tp/pp groups from the ranks' places, the ledger summed per group and primitive,
// and the recent requests bucketed with their last-minute quantiles.
#include "serve/ui_state.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/clock.h"

namespace tessera::serve {
namespace {

using nlohmann::json;
constexpr int64_t kSecond = 1'000'000'000;

engine::RankReport Rank(int rank, int stage, int tp_rank, int64_t steps, int64_t compute_ms,
                        uint64_t all_reduce_bytes) {
  engine::RankReport r;
  r.rank = rank;
  r.stage = stage;
  r.tp_rank = tp_rank;
  r.decode = {
      .steps = steps, .compute_ns = compute_ms * 1'000'000, .comm_ns = 1'000'000, .wait_ns = 0};
  r.prefill = {.steps = 1, .compute_ns = 0, .comm_ns = 0, .wait_ns = 2'000'000};
  r.ledger["tp/all_reduce"] = {
      .calls = 2, .bytes_sent = all_reduce_bytes, .bytes_received = all_reduce_bytes};
  if (stage == 0) r.ledger["pp/send"] = {.calls = 1, .bytes_sent = 100, .bytes_received = 0};
  return r;
}

json State(const LiveView& live, int64_t now_ns) {
  engine::SchedulerStats stats;
  stats.kv_blocks_used = 1;
  stats.kv_blocks_total = 4;
  stats.waiting = 3;
  const json state = json::parse(
      UiStateJson({.model_name = "m", .plan = "tp2 pp2", .started_ns = 0}, stats, live, now_ns),
      nullptr, false);
  EXPECT_TRUE(state.is_object());
  return state;
}

TEST(UiState, RanksGroupsAndLedger) {
  Metrics metrics;
  std::vector<engine::RankReport> before, now;
  for (int r = 0; r < 4; ++r) {
    before.push_back(Rank(r, r / 2, r % 2, 10, 100, 1000));
    now.push_back(Rank(r, r / 2, r % 2, 30, 400, 3000));
  }
  metrics.SetRanks(before, 10 * kSecond);
  metrics.SetRanks(now, 12 * kSecond);
  const json state = State(metrics.Live(13 * kSecond), 13 * kSecond);
  EXPECT_EQ(state["scheduler"]["kv_usage"], 0.25);
  EXPECT_EQ(state["scheduler"]["waiting"], 3);
  EXPECT_EQ(state["ranks_age_s"], 1.0);
  ASSERT_EQ(state["ranks"].size(), 4u);
  const json& iv = state["ranks"][3]["interval"];
  EXPECT_EQ(iv["seconds"], 2.0);
  EXPECT_EQ(iv["steps"], 20);
  EXPECT_NEAR(iv["compute_s"].get<double>(), 0.3, 1e-12);
  EXPECT_EQ(iv["comm_s"], 0.0);
  EXPECT_EQ(state["ranks"][3]["total"]["steps"], 31);  // decode + prefill
  EXPECT_NEAR(state["ranks"][3]["total"]["wait_s"].get<double>(), 0.002, 1e-12);
  EXPECT_EQ(state["groups"], json::parse(R"([{"kind":"tp","index":0,"ranks":[0,1]},
      {"kind":"tp","index":1,"ranks":[2,3]},{"kind":"pp","index":0,"ranks":[0,2]},
      {"kind":"pp","index":1,"ranks":[1,3]}])"));
  ASSERT_EQ(state["ledger"].size(), 2u);
  const json& pp = state["ledger"][0];
  EXPECT_EQ(pp["group"], "pp");
  EXPECT_EQ(pp["primitive"], "send");
  EXPECT_EQ(pp["bytes_sent"], 200);
  EXPECT_EQ(pp["bytes_sent_by_rank"], json::parse("[100,100,0,0]"));
  const json& tp = state["ledger"][1];
  EXPECT_EQ(tp["calls"], 8);
  EXPECT_EQ(tp["bytes_sent"], 12000);
}

TEST(UiState, NoIntervalBeforeASecondSampleOrAfterARestart) {
  Metrics metrics;
  State(metrics.Live(kSecond), kSecond);  // nothing yet: still well-formed
  EXPECT_TRUE(State(metrics.Live(kSecond), kSecond)["ranks_age_s"].is_null());
  metrics.SetRanks({Rank(0, 0, 0, 50, 10, 0), Rank(1, 0, 1, 50, 10, 0)}, kSecond);
  EXPECT_TRUE(State(metrics.Live(kSecond), kSecond)["ranks"][0]["interval"].is_null());
  // The ranks restarted: their counters went back, nothing to compare with.
  metrics.SetRanks({Rank(0, 0, 0, 5, 1, 0), Rank(1, 0, 1, 5, 1, 0)}, 2 * kSecond);
  const json state = State(metrics.Live(2 * kSecond), 2 * kSecond);
  EXPECT_TRUE(state["ranks"][0]["interval"].is_null());
  EXPECT_EQ(state["ranks"][0]["total"]["steps"], 6);
  // A world of another size starts over.
  metrics.SetRanks({Rank(0, 0, 0, 9, 1, 0)}, 3 * kSecond);
  EXPECT_TRUE(State(metrics.Live(3 * kSecond), 3 * kSecond)["ranks"][0]["interval"].is_null());
}

TEST(UiState, RecentRequestsAreBucketedAndOldOnesDropped) {
  Metrics metrics;
  metrics.ObserveRequest("completions", "length", 0.010, 0.002, 0.1);
  metrics.ObserveRequest("completions", "length", 0.030, -1, 0.2);  // one token: no TPOT
  metrics.ObserveRequest("completions", "stop", 0.020, 0.004, 0.3);
  const int64_t now = NowNs();
  json latency = State(metrics.Live(now), now)["latency"];
  ASSERT_EQ(latency["buckets"].size(), 30u);
  EXPECT_EQ(latency["buckets"][0]["start_s"], -300);
  const json& last = latency["buckets"].back();
  EXPECT_EQ(last["requests"], 3);
  EXPECT_NEAR(last["ttft_mean_s"].get<double>(), 0.020, 1e-12);
  EXPECT_EQ(last["ttft_max_s"], 0.030);
  EXPECT_NEAR(last["tpot_mean_s"].get<double>(), 0.003, 1e-12);
  EXPECT_TRUE(latency["buckets"][0]["ttft_mean_s"].is_null());
  EXPECT_EQ(latency["last_minute"]["requests"], 3);
  EXPECT_EQ(latency["last_minute"]["ttft_p50_s"], 0.020);
  EXPECT_EQ(latency["last_minute"]["ttft_p90_s"], 0.030);
  // Ten minutes later they are gone from the view (the histograms keep them).
  const int64_t later = now + 600 * kSecond;
  latency = State(metrics.Live(later), later)["latency"];
  EXPECT_EQ(latency["last_minute"]["requests"], 0);
  EXPECT_TRUE(latency["last_minute"]["ttft_p50_s"].is_null());
  EXPECT_TRUE(metrics.Live(later).recent.empty());
}

}  // namespace
}  // namespace tessera::serve
