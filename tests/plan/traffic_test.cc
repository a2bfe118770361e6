#include "plan/traffic.h"

#include <gtest/gtest.h>

#include "plan/presets.h"

namespace tessera::plan {
namespace {

Workload RingF32() {
  Workload w;
  w.act_dtype = *ParseDType("f32");
  w.allreduce_algo = AllReduceAlgo::kRing;
  return w;
}

std::map<std::string, LedgerEntry> Ledger(const char* model, Parallelism p, const Pass& pass,
                                          int64_t rank, const Workload& w = RingF32()) {
  return PredictLedger(RankCalls(*ModelPreset(model), *ClusterPreset("8xh100"), w, p, pass, rank));
}

TEST(TrafficTest, TensorParallelDecodeByHand) {
  // Llama-3-8B, tp=2, one sequence: each all-reduce is 4096 f32 = 16 KiB and a
  // 2-rank ring sends half of it twice: 16 KiB per call. Embedding + 2 × 32 layers
  // = 65 calls. Logits: the vocab (128256) split 64128/64128, f32, gathered to tp
  // rank 0: rank 1 sends its block, rank 0 receives it.
  const Pass decode{Phase::kDecode, 1, 1, 100};
  for (int64_t rank : {0, 1}) {
    const auto ledger = Ledger("llama-3-8b", {.tp = 2}, decode, rank);
    ASSERT_EQ(ledger.size(), 2u);
    EXPECT_EQ(ledger.at("tp/all_reduce").calls, 65);
    EXPECT_EQ(ledger.at("tp/all_reduce").bytes, (RankBytes{65 * 16384, 65 * 16384}));
    EXPECT_EQ(ledger.at("tp/gather").calls, 1);
  }
  EXPECT_EQ(Ledger("llama-3-8b", {.tp = 2}, decode, 0).at("tp/gather").bytes,
            (RankBytes{0, 64128 * 4}));
  EXPECT_EQ(Ledger("llama-3-8b", {.tp = 2}, decode, 1).at("tp/gather").bytes,
            (RankBytes{64128 * 4, 0}));
}

TEST(TrafficTest, TensorParallelPrefillRemainders) {
  // stories260K (H 64, 5 layers), tp=4, a 5-token prompt: each all-reduce is
  // 5 × 64 = 320 f32 in chunks of 80; ring per rank 2·320 − 80 − 80 = 480 elements.
  const Pass prefill{Phase::kPrefill, 1, 5, 0};
  const auto ledger = Ledger("stories260k", {.tp = 4}, prefill, 3);
  EXPECT_EQ(ledger.at("tp/all_reduce").calls, 1 + 2 * 5);
  EXPECT_EQ(ledger.at("tp/all_reduce").bytes.sent, 11 * 480 * 4);
  // Logits: vocab 512 / 4 = 128 rows each, one position: rank 3 sends its block,
  // the root (tp rank 0) receives the other 3.
  EXPECT_EQ(ledger.at("tp/gather").bytes, (RankBytes{128 * 4, 0}));
  EXPECT_EQ(Ledger("stories260k", {.tp = 4}, prefill, 0).at("tp/gather").bytes,
            (RankBytes{0, 3 * 128 * 4}));
  // A vocabulary that tp does not divide: shards 128, 128, 128, 126, padded to the
  // engine's vocab block ⌈510/4⌉ = 128 rows.
  ModelShape m = *ModelPreset("stories260k");
  m.vocab_size = 510;
  const auto uneven =
      PredictLedger(RankCalls(m, *ClusterPreset("8xh100"), RingF32(), {.tp = 4}, prefill, 3));
  EXPECT_EQ(uneven.at("tp/gather").bytes, (RankBytes{128 * 4, 0}));
}

TEST(TrafficTest, SequenceParallelByHand) {
  // stories260K (H 64, 5 layers), tp=2 with sp, pp=2 (layers 0-2 | 3-4), one 600-token
  // prompt: chunks of 256, 256 and 88 rows, pieces of 128, 128 and 44 (300 rows a
  // rank). Stage 0: the embedding reduce-scatters each chunk (3 calls), each block
  // all-gathers and reduce-scatters each chunk (2 blocks × 3 layers × 3 chunks);
  // every call moves one piece to the peer. Then 300 rows go to stage 1, whose last
  // layer all-reduces the one logit row (64 f32, one-shot between 2 ranks).
  const Pass prefill = StepPass(1, 600, 1);
  const Parallelism p{.tp = 2, .pp = 2, .sp = 1};
  const int64_t piece_bytes = 300 * 64 * 4;  // one rank's pieces, all chunks
  Workload w = RingF32();
  w.allreduce_algo = AllReduceAlgo::kDeterministic;
  const auto first = Ledger("stories260k", p, prefill, 1, w);
  EXPECT_EQ(first.at("tp/reduce_scatter").calls, 3 + 2 * 3 * 3);
  EXPECT_EQ(first.at("tp/reduce_scatter").bytes, (RankBytes{7 * piece_bytes, 7 * piece_bytes}));
  EXPECT_EQ(first.at("tp/all_gather").calls, 2 * 3 * 3);
  EXPECT_EQ(first.at("tp/all_gather").bytes, (RankBytes{6 * piece_bytes, 6 * piece_bytes}));
  EXPECT_EQ(first.count("tp/all_reduce"), 0u);
  EXPECT_EQ(first.at("pp/send").bytes, (RankBytes{piece_bytes, 0}));
  const auto last = Ledger("stories260k", p, prefill, 3, w);
  EXPECT_EQ(last.at("tp/reduce_scatter").calls, 2 * 2 * 3);
  EXPECT_EQ(last.at("pp/recv").bytes, (RankBytes{0, piece_bytes}));
  EXPECT_EQ(last.at("tp/all_reduce").calls, 1);
  EXPECT_EQ(last.at("tp/all_reduce").bytes, (RankBytes{64 * 4, 64 * 4}));
  // Below --sp-min-tokens the step is plain tensor parallel.
  const auto plain = Ledger("stories260k", {.tp = 2, .pp = 2, .sp = 601}, prefill, 1, w);
  EXPECT_EQ(plain.count("tp/reduce_scatter"), 0u);
  EXPECT_EQ(plain.at("tp/all_reduce").calls, 1 + 2 * 3);
  EXPECT_EQ(plain.at("pp/send").bytes, (RankBytes{600 * 64 * 4, 0}));
}

TEST(TrafficTest, PipelineSendsActivationsAtStageBoundaries) {
  // pp=2, 3 sequences decoding: stage 0 sends 3 × 4096 f32, stage 1 receives them.
  // Equal to the seeds' C_PP = B·S·H·bytes. (The step messages travel on the
  // engine's ctl group, not modelled: no token ids come back on pp.)
  const Pass decode{Phase::kDecode, 3, 1, 10};
  const auto first = Ledger("llama-3-8b", {.pp = 2}, decode, 0);
  const auto last = Ledger("llama-3-8b", {.pp = 2}, decode, 1);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(first.at("pp/send").bytes, (RankBytes{3 * 4096 * 4, 0}));
  EXPECT_EQ(first.at("pp/send").calls, 1);
  EXPECT_EQ(last.at("pp/recv").bytes, (RankBytes{0, 3 * 4096 * 4}));
  EXPECT_EQ(last.at("pp/recv").calls, 1);
  // A middle stage of three receives and sends activations.
  const auto middle = Ledger("llama-3-8b", {.pp = 3}, decode, 1);
  EXPECT_EQ(middle.at("pp/send").bytes, (RankBytes{3 * 4096 * 4, 0}));
  EXPECT_EQ(middle.at("pp/recv").bytes, (RankBytes{0, 3 * 4096 * 4}));
  const std::vector<CommItem> items = PassCommItems(
      *ModelPreset("llama-3-8b"), *ClusterPreset("8xh100"), RingF32(), {.pp = 2}, decode);
  for (const CommItem& item : items) {
    if (item.what != "activations") continue;
    EXPECT_EQ(item.seed_bytes, 3.0 * 4096 * 4);
    EXPECT_EQ(item.max_rank.sent, 3 * 4096 * 4);
    EXPECT_EQ(item.primitive, "send/recv");
    EXPECT_EQ(item.note, "same as the seeds");
  }
}

TEST(TrafficTest, TensorTimesPipelineSplitsTheCalls) {
  // tp=2 × pp=2 on 4 ranks (tp innermost): ranks 0,1 = stage 0 (layers 0-15),
  // ranks 2,3 = stage 1 (16-31). Stage 0: embedding + 32 all-reduces; stage 1: 32
  // all-reduces + the logits gathered to rank 2 (tp rank 0 of the last stage).
  const Pass decode{Phase::kDecode, 1, 1, 10};
  const auto r1 = Ledger("llama-3-8b", {.tp = 2, .pp = 2}, decode, 1);
  const auto r2 = Ledger("llama-3-8b", {.tp = 2, .pp = 2}, decode, 2);
  const auto r3 = Ledger("llama-3-8b", {.tp = 2, .pp = 2}, decode, 3);
  EXPECT_EQ(r1.at("tp/all_reduce").calls, 33);
  EXPECT_EQ(r1.count("tp/gather"), 0u);
  EXPECT_EQ(r1.at("pp/send").bytes, (RankBytes{4096 * 4, 0}));  // each tp rank its own copy
  EXPECT_EQ(r1.count("pp/recv"), 0u);
  EXPECT_EQ(r2.at("tp/all_reduce").calls, 32);
  EXPECT_EQ(r2.at("tp/gather").bytes, (RankBytes{0, 64128 * 4}));
  EXPECT_EQ(r2.count("pp/send"), 0u);
  EXPECT_EQ(r2.at("pp/recv").bytes, (RankBytes{0, 4096 * 4}));
  EXPECT_EQ(r3.at("tp/gather").bytes, (RankBytes{64128 * 4, 0}));
  EXPECT_EQ(r3.at("pp/recv").bytes, (RankBytes{0, 4096 * 4}));
}

TEST(TrafficTest, MoeLayersAllReduceEveryExpertOutput) {
  // Mixtral (top-2, no shared expert), tp=2, 3 sequences decoding: the engine
  // all-reduces the 3 × 2 (token, choice) expert outputs of each layer before
  // mixing: 6 × 4096 f32; attention outputs and the embedding stay 3 × 4096. A
  // 2-rank ring sends half of each buffer twice, i.e. the buffer once.
  const Pass decode{Phase::kDecode, 3, 1, 10};
  const auto ledger = Ledger("mixtral-8x7b", {.tp = 2}, decode, 1);
  EXPECT_EQ(ledger.at("tp/all_reduce").calls, 1 + 32 + 32);
  EXPECT_EQ(ledger.at("tp/all_reduce").bytes.sent, (1 + 32) * 3 * 4096 * 4 + 32 * 6 * 4096 * 4);
  const std::vector<CommCall> calls = RankCalls(
      *ModelPreset("mixtral-8x7b"), *ClusterPreset("8xh100"), RingF32(), {.tp = 2}, decode, 1);
  bool found = false;
  for (const CommCall& call : calls) {
    if (call.what != "expert outputs") continue;
    found = true;
    EXPECT_EQ(call.calls, 32);
    EXPECT_EQ(call.elems_per_call, 3 * 2 * 4096);
  }
  EXPECT_TRUE(found);
  // Qwen1.5-MoE (top-4 + a shared expert): (T·4 + T) rows of 2048 for T = 5 tokens,
  // over tp=4 with the deterministic (two-shot) all-reduce: count + 2·count/4.
  Workload two_shot = RingF32();
  two_shot.allreduce_algo = AllReduceAlgo::kTwoShot;
  const auto qwen = Ledger("qwen1.5-moe-a2.7b", {.tp = 4}, {Phase::kPrefill, 1, 5, 0}, 2, two_shot);
  const int64_t attention = 5 * 2048, experts = (5 * 4 + 5) * 2048;
  EXPECT_EQ(qwen.at("tp/all_reduce").calls, 1 + 24 + 24);
  EXPECT_EQ(qwen.at("tp/all_reduce").bytes.sent,
            ((1 + 24) * (attention + 2 * attention / 4) + 24 * (experts + 2 * experts / 4)) * 4);
  // The per-pass table names the item and compares it with the seeds' B·S·H/P.
  const std::vector<CommItem> items =
      PassCommItems(*ModelPreset("qwen1.5-moe-a2.7b"), *ClusterPreset("8xh100"), two_shot,
                    {.tp = 4}, {Phase::kPrefill, 1, 5, 0});
  found = false;
  for (const CommItem& item : items) {
    if (item.what != "expert outputs") continue;
    found = true;
    EXPECT_EQ(item.primitive, "all_reduce");
    EXPECT_EQ(item.message_bytes, experts * 4);
    EXPECT_EQ(item.calls_per_rank, 24);
    EXPECT_DOUBLE_EQ(item.seed_bytes, 5.0 * 2048 / 4 * 24 * 4);
    EXPECT_NE(item.note.find("before mixing"), std::string::npos) << item.note;
  }
  EXPECT_TRUE(found);
}

TEST(TrafficTest, MixedStepsUseTheirTotals) {
  // An engine step of 3 sequences bringing 1 + 1 + 8 = 10 tokens (two decoding,
  // one prefilling), one row of logits each: stories260K (H 64, vocab 512, 5
  // layers: stage 0 holds 3, stage 1 2) on tp=2 × pp=2.
  const Pass step = StepPass(3, 10, 3);
  EXPECT_EQ(step.tokens(), 10);
  EXPECT_EQ(step.rows(), 3);
  EXPECT_EQ(step.phase, Phase::kPrefill);
  Workload two_shot = RingF32();
  two_shot.allreduce_algo = AllReduceAlgo::kTwoShot;
  const Parallelism p{.tp = 2, .pp = 2};
  // Two-shot on 2 ranks: count + 0·c[r] elements each way.
  const auto r0 = Ledger("stories260k", p, step, 0, two_shot);
  EXPECT_EQ(r0.at("tp/all_reduce").calls, 1 + 2 * 3);
  EXPECT_EQ(r0.at("tp/all_reduce").bytes, (RankBytes{7 * 640 * 4, 7 * 640 * 4}));
  EXPECT_EQ(r0.at("pp/send").bytes, (RankBytes{640 * 4, 0}));
  const auto r2 = Ledger("stories260k", p, step, 2, two_shot);
  EXPECT_EQ(r2.at("tp/all_reduce").calls, 2 * 2);
  EXPECT_EQ(r2.at("pp/recv").bytes, (RankBytes{0, 640 * 4}));
  EXPECT_EQ(r2.at("tp/gather").bytes, (RankBytes{0, 3 * 256 * 4}));
  const auto r3 = Ledger("stories260k", p, step, 3, two_shot);
  EXPECT_EQ(r3.at("tp/gather").bytes, (RankBytes{3 * 256 * 4, 0}));
  // All logits wanted (every token): R = T.
  const auto all = Ledger("stories260k", p, StepPass(2, 7, 7), 3, two_shot);
  EXPECT_EQ(all.at("tp/gather").bytes, (RankBytes{7 * 256 * 4, 0}));
  // A step of single tokens is a decode step, the same as the uniform pass.
  const Pass decode_step = StepPass(4, 4, 4);
  EXPECT_EQ(decode_step.phase, Phase::kDecode);
  for (int64_t rank = 0; rank < 4; ++rank) {
    const auto a = Ledger("stories260k", p, decode_step, rank, two_shot);
    const auto b = Ledger("stories260k", p, {Phase::kDecode, 4, 1, 0}, rank, two_shot);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [key, entry] : a) {
      EXPECT_EQ(entry.bytes, b.at(key).bytes) << key;
      EXPECT_EQ(entry.calls, b.at(key).calls) << key;
    }
  }
}

TEST(TrafficTest, ExpertParallelAllToAll) {
  // Mixtral, tp=2 ep=2: 4 decoding sequences, each tp rank owns 2 of them; a
  // token's 2 outputs of 4096 f32 come from the other rank half the time: per layer
  // the combine sends and receives 2 × 2 × 4096 × 4 / 2 = 32 KiB (dispatch is free:
  // the activations are replicated over tp). The FFN all-reduce becomes an
  // all-gather of the token halves.
  Pass decode{Phase::kDecode, 4, 1, 10};
  auto ledger = Ledger("mixtral-8x7b", {.tp = 2, .ep = 2}, decode, 0);
  EXPECT_EQ(ledger.at("ep/all_to_allv").calls, 32);
  EXPECT_EQ(ledger.at("ep/all_to_allv").bytes, (RankBytes{32 * 32768, 32 * 32768}));
  // With the rows a run measured, the bytes are exact: rows × 4096 × 4.
  decode.expert_rows = ExpertRows{.sent = 70, .received = 3};
  ledger = Ledger("mixtral-8x7b", {.tp = 2, .ep = 2}, decode, 0);
  EXPECT_EQ(ledger.at("ep/all_to_allv").calls, 32);
  EXPECT_EQ(ledger.at("ep/all_to_allv").bytes, (RankBytes{70 * 16384, 3 * 16384}));
  EXPECT_EQ(ledger.at("tp/all_reduce").calls, 1 + 32);
  EXPECT_EQ(ledger.at("tp/all_gather").calls, 32);  // MoE outputs
  EXPECT_EQ(ledger.at("tp/gather").calls, 1);       // logits
  // An EP group across DP replicas (tp1 dp2 ep2): each has its own tokens, so
  // dispatch sends too.
  const auto dp = Ledger("mixtral-8x7b", {.dp = 2, .ep = 2}, Pass{Phase::kDecode, 4, 1, 10}, 0);
  EXPECT_EQ(dp.at("ep/all_to_allv").calls, 2 * 32);
}

TEST(TrafficTest, AutomaticAlgorithmFollowsComm) {
  // Without a forced algorithm, comm picks one-shot up to 32 KiB in a group on one
  // node: one sequence of Llama-3-8B (16 KiB) over tp=4 → every rank reads the
  // three other buffers. Without the mailbox (TCP): recursive doubling, log2 4 = 2
  // whole-buffer exchanges.
  Workload w = RingF32();
  w.allreduce_algo.reset();
  const Pass decode{Phase::kDecode, 1, 1, 10};
  const auto small = Ledger("llama-3-8b", {.tp = 4}, decode, 0, w);
  EXPECT_EQ(small.at("tp/all_reduce").bytes.sent, 65 * 3 * 16384);
  Workload tcp = w;
  tcp.allreduce_oneshot_bytes = 0;
  const auto small_tcp = Ledger("llama-3-8b", {.tp = 4}, decode, 0, tcp);
  EXPECT_EQ(small_tcp.at("tp/all_reduce").bytes.sent, 65 * 2 * 16384);
  // 4 sequences = 64 KiB: ring, 2·3/4 of it.
  const auto big = Ledger("llama-3-8b", {.tp = 4}, {Phase::kDecode, 4, 1, 10}, 0, w);
  EXPECT_EQ(big.at("tp/all_reduce").bytes.sent, 65 * 3 * 65536 / 2);
}

TEST(TrafficTest, DataParallelAndSingleRankNeedNothing) {
  const Pass decode{Phase::kDecode, 8, 1, 10};
  EXPECT_TRUE(Ledger("llama-3-8b", {.dp = 4}, decode, 3).empty());
  EXPECT_TRUE(Ledger("llama-3-8b", {}, decode, 0).empty());
}

TEST(TrafficTest, TensorParallelItemComparesWithTheSeeds) {
  // Seeds: C_TP = 2·B·S·H/P per layer. Exact ring: 2 all-reduces × 2(P−1)/P·B·S·H
  // per rank, i.e. 2(P−1) times the seeds' figure (6x at P = 4, bytes included).
  const Pass prefill{Phase::kPrefill, 1, 128, 0};
  const std::vector<CommItem> items = PassCommItems(
      *ModelPreset("llama-3-8b"), *ClusterPreset("8xh100"), RingF32(), {.tp = 4}, prefill);
  bool found = false;
  for (const CommItem& item : items) {
    if (item.what != "layer outputs") continue;
    found = true;
    EXPECT_EQ(item.calls_per_rank, 64);
    EXPECT_EQ(item.max_rank.sent, 64 * (128 * 4096 * 4) * 3 / 2);
    EXPECT_DOUBLE_EQ(item.seed_bytes, 2.0 * 128 * 4096 / 4 * 32 * 4);
    EXPECT_DOUBLE_EQ(item.max_rank.sent / item.seed_bytes, 6.0);
    EXPECT_EQ(item.total_sent, 4 * item.max_rank.sent);
  }
  EXPECT_TRUE(found);
}

// Context-parallel decode over distributed KV against gathering the context's KV to
// one rank after the prefill: the planner prices both in bytes. llama-2-7b: 32 layers
// × 2 × 4096 f16 values = 512 KiB of KV a token; at cp 2 the other rank's half of a
// 4096-token context is 1 GiB, once.
TEST(TrafficTest, ContextParallelDecodeIsPricedAgainstGatheringTheKv) {
  const Pass decode{Phase::kDecode, 1, 1, 4096};
  const std::vector<CommItem> items = PassCommItems(
      *ModelPreset("llama-2-7b"), *ClusterPreset("8xh100"), RingF32(), {.cp = 2}, decode);
  bool found = false;
  for (const CommItem& item : items) {
    if (item.what != "attention partials") continue;
    found = true;
    EXPECT_NE(item.note.find("would move 1 GiB to it once"), std::string::npos) << item.note;
    EXPECT_NE(item.note.find("pays off after"), std::string::npos) << item.note;
  }
  EXPECT_TRUE(found);
}

TEST(TrafficTest, KvTransferItemCorrectsTheSeeds) {
  Workload w = RingF32();
  w.prompt_tokens = 4096;
  w.kv_dtype = *ParseDType("f16");
  const CommItem item = KvTransferItem(*ModelPreset("llama-2-7b"), w, {.tp = 2}, true);
  EXPECT_EQ(item.total_sent, int64_t{1} << 31);
  EXPECT_EQ(item.max_rank.sent, int64_t{1} << 30);  // two tp ranks send half each
  // The seeds' formula B·S·2·H·layers with H = 4096 counts elements, not bytes.
  EXPECT_DOUBLE_EQ(item.seed_bytes, 4096.0 * 2 * 4096 * 32);
}

}  // namespace
}  // namespace tessera::plan
