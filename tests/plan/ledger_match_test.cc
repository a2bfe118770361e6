// plan/'s byte counts held against comm's ledger: every algorithm, several rank
// counts and element counts (remainders included), ranks as threads over shared
// memory; then the calls plan/ predicts for TP and PP layouts replayed through comm
// as the engine makes them (engine/stage_runner.h: all-reduces and a gather of the
// logits to tp rank 0 on "tp", activations on "pp"), whose ledger must equal
// PredictLedger rank by rank. (`tessera generate --ledger` holds the engine's own
// per-step ledger against the same prediction.)
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/rendezvous/hash_store.h"
#include "plan/collectives.h"
#include "plan/presets.h"
#include "plan/traffic.h"

namespace tessera::plan {
namespace {

std::string UniqueJob() {
  static std::atomic<int> counter{0};
  return "plan" + std::to_string(::getpid()) + "x" + std::to_string(counter.fetch_add(1));
}

// Runs fn(comm) on n threads (one communicator each, shm transport).
void RunRanks(int n, const std::function<void(comm::Communicator&)>& fn) {
  auto store = std::make_shared<comm::HashStore>();
  comm::CommOptions options;
  options.transport = comm::TransportKind::kShm;
  options.timeout_ms = 60'000;
  options.job_id = UniqueJob();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = comm::Communicator::Create(store, r, n, options);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      fn(**c);
    });
  }
  for (auto& t : threads) t.join();
}

RankBytes Measured(const comm::Communicator& c, comm::Primitive p) {
  const comm::LedgerEntry& e = c.ledger().entry(p);
  return {static_cast<int64_t>(e.bytes_sent), static_cast<int64_t>(e.bytes_received)};
}

struct AlgoPair {
  comm::AllReduceAlgo comm;
  AllReduceAlgo plan;
};

TEST(LedgerMatchTest, AllReduceEveryAlgorithmRankCountAndRemainder) {
  const AlgoPair algos[] = {
      {comm::AllReduceAlgo::kRing, AllReduceAlgo::kRing},
      {comm::AllReduceAlgo::kRecursiveDoubling, AllReduceAlgo::kRecursiveDoubling},
      {comm::AllReduceAlgo::kOneShot, AllReduceAlgo::kOneShot},
      {comm::AllReduceAlgo::kDeterministic, AllReduceAlgo::kDeterministic}};
  const AllReduceThresholds defaults;  // comm's, ranks on one host
  for (int n : {2, 3, 4, 5, 8}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{100000}}) {
      RunRanks(n, [&](comm::Communicator& c) {
        std::vector<float> buf(count, 1.0f);
        for (const AlgoPair& a : algos) {
          c.mutable_ledger().Reset();
          ASSERT_TRUE(c.AllReduce(buf.data(), buf.data(), count, comm::DataType::kF32,
                                  comm::ReduceOp::kSum, a.comm)
                          .ok());
          // A one-shot request too large for the mailbox gets the automatic choice.
          const int64_t bytes = static_cast<int64_t>(count * 4);
          const AllReduceAlgo ran =
              a.plan == AllReduceAlgo::kOneShot && bytes > defaults.oneshot_bytes
                  ? LibraryAllReduceChoice(bytes, defaults)
                  : a.plan;
          EXPECT_EQ(Measured(c, comm::Primitive::kAllReduce),
                    AllReduceBytes(ran, static_cast<int64_t>(count), 4, n, c.rank()))
              << AllReduceAlgoName(a.plan) << " n=" << n << " count=" << count
              << " rank=" << c.rank();
        }
        // The automatic choice.
        c.mutable_ledger().Reset();
        ASSERT_TRUE(
            c.AllReduce(buf.data(), buf.data(), count, comm::DataType::kF32, comm::ReduceOp::kSum)
                .ok());
        const AllReduceAlgo chosen =
            LibraryAllReduceChoice(static_cast<int64_t>(count * 4),
                                   {static_cast<int64_t>(c.options().allreduce_small_bytes),
                                    static_cast<int64_t>(c.options().allreduce_oneshot_bytes)});
        EXPECT_EQ(Measured(c, comm::Primitive::kAllReduce),
                  AllReduceBytes(chosen, static_cast<int64_t>(count), 4, n, c.rank()))
            << "auto n=" << n << " count=" << count;
      });
    }
  }
}

TEST(LedgerMatchTest, AllGatherAndAllToAllv) {
  for (int n : {2, 3, 5, 8}) {
    RunRanks(n, [&](comm::Communicator& c) {
      for (size_t count : {size_t{1}, size_t{100}, size_t{10000}}) {
        for (comm::AllGatherAlgo algo : {comm::AllGatherAlgo::kRing, comm::AllGatherAlgo::kBruck}) {
          std::vector<float> in(count, 1.0f), out(count * n);
          c.mutable_ledger().Reset();
          ASSERT_TRUE(c.AllGather(in.data(), out.data(), count, comm::DataType::kF32, algo).ok());
          EXPECT_EQ(Measured(c, comm::Primitive::kAllGather),
                    AllGatherBytes(static_cast<int64_t>(count * 4), n));
        }
      }
      // All-to-allv: rank r sends (r + 1) * (p + 2) elements to rank p.
      std::vector<size_t> send_counts(n), recv_counts(n), send_displs(n), recv_displs(n);
      std::vector<int64_t> send64(n), recv64(n);
      size_t send_total = 0, recv_total = 0;
      for (int p = 0; p < n; ++p) {
        send_counts[p] = static_cast<size_t>((c.rank() + 1) * (p + 2));
        recv_counts[p] = static_cast<size_t>((p + 1) * (c.rank() + 2));
        send_displs[p] = send_total;
        recv_displs[p] = recv_total;
        send_total += send_counts[p];
        recv_total += recv_counts[p];
        send64[p] = static_cast<int64_t>(send_counts[p]);
        recv64[p] = static_cast<int64_t>(recv_counts[p]);
      }
      std::vector<float> in(send_total, 1.0f), out(recv_total);
      c.mutable_ledger().Reset();
      ASSERT_TRUE(c.AllToAllv(in.data(), send_counts, send_displs, out.data(), recv_counts,
                              recv_displs, comm::DataType::kF32)
                      .ok());
      EXPECT_EQ(Measured(c, comm::Primitive::kAllToAllv),
                AllToAllvBytes(send64, recv64, 4, c.rank()));
    });
  }
}

TEST(LedgerMatchTest, GatherToEveryRoot) {
  for (int n : {2, 3, 5, 8}) {
    RunRanks(n, [&](comm::Communicator& c) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
        for (int root : {0, n - 1}) {
          std::vector<float> in(count, 1.0f), out(count * n);
          c.mutable_ledger().Reset();
          ASSERT_TRUE(c.Gather(in.data(), c.rank() == root ? out.data() : nullptr, count,
                               comm::DataType::kF32, root)
                          .ok());
          EXPECT_EQ(c.ledger().entry(comm::Primitive::kGather).calls, 1u);
          EXPECT_EQ(Measured(c, comm::Primitive::kGather),
                    GatherBytes(static_cast<int64_t>(count * 4), n, c.rank(), root))
              << "n=" << n << " count=" << count << " root=" << root;
        }
      }
    });
  }
}

// Replays the calls RankCalls predicts and compares the ledger with PredictLedger
// for every rank. All-reduces take `algo` (the engine's default: the deterministic
// two-shot) or, when it is nullopt, comm's own choice (the engine's "fast" mode).
void ReplayAndCompare(const char* model_name, Parallelism p, const Pass& pass,
                      std::optional<AllReduceAlgo> algo = std::nullopt) {
  const ModelShape m = *ModelPreset(model_name);
  const Cluster cluster = *ClusterPreset("8xh100");
  Workload w;
  w.act_dtype = *ParseDType("f32");
  w.allreduce_algo = algo;
  comm::AllReduceAlgo comm_algo = comm::AllReduceAlgo::kAuto;
  if (algo == AllReduceAlgo::kDeterministic) comm_algo = comm::AllReduceAlgo::kDeterministic;
  if (algo == AllReduceAlgo::kRing) comm_algo = comm::AllReduceAlgo::kRing;
  if (algo == AllReduceAlgo::kRecursiveDoubling) {
    comm_algo = comm::AllReduceAlgo::kRecursiveDoubling;
  }
  const int n = static_cast<int>(p.devices());
  RunRanks(n, [&](comm::Communicator& world) {
    const RankCoords me = CoordsOf(p, world.rank());
    // TP group: same stage/dp/cp; PP group: same tp/dp/cp (ordered by stage).
    auto tp = world.Split(static_cast<int>((me.stage * p.dp + me.dp_rank) * p.cp + me.cp_rank),
                          static_cast<int>(me.tp_rank));
    auto pp = world.Split(static_cast<int>((me.dp_rank * p.cp + me.cp_rank) * p.tp + me.tp_rank),
                          static_cast<int>(me.stage));
    ASSERT_TRUE(tp.ok() && pp.ok());
    (*tp)->mutable_ledger().Reset();
    (*pp)->mutable_ledger().Reset();
    const std::vector<CommCall> calls = RankCalls(m, cluster, w, p, pass, world.rank());
    for (const CommCall& call : calls) {
      if (call.group != "tp") continue;
      for (int64_t i = 0; i < call.calls; ++i) {
        if (call.primitive == Primitive::kAllReduce) {
          std::vector<float> buf(call.elems_per_call, 1.0f);
          ASSERT_TRUE((*tp)
                          ->AllReduce(buf.data(), buf.data(), buf.size(), comm::DataType::kF32,
                                      comm::ReduceOp::kSum, comm_algo)
                          .ok());
        } else {
          // The logits: each rank's padded vocab block to tp rank 0.
          ASSERT_EQ(call.primitive, Primitive::kGather) << call.what;
          const size_t block = static_cast<size_t>(call.elems_per_call / p.tp);
          std::vector<float> in(block, 1.0f), out(block * p.tp);
          ASSERT_TRUE((*tp)
                          ->Gather(in.data(), me.tp_rank == 0 ? out.data() : nullptr, block,
                                   comm::DataType::kF32, 0)
                          .ok());
        }
      }
    }
    // Activations as the engine moves them: receive from the stage before, then
    // send to the stage after.
    for (Primitive primitive : {Primitive::kRecv, Primitive::kSend}) {
      for (const CommCall& call : calls) {
        if (call.group != "pp" || call.primitive != primitive) continue;
        ASSERT_EQ(call.what, "activations");
        std::vector<uint8_t> buf(call.elems_per_call * call.elem_bytes);
        if (primitive == Primitive::kSend) {
          ASSERT_TRUE((*pp)->Send(buf.data(), buf.size(), me.stage + 1, 7).ok());
        } else {
          ASSERT_TRUE((*pp)->Recv(buf.data(), buf.size(), me.stage - 1, 7).ok());
        }
      }
    }
    const std::map<std::string, LedgerEntry> predicted = PredictLedger(calls);
    std::map<std::string, LedgerEntry> measured;
    auto take = [&](const std::string& group, const comm::Communicator& c) {
      for (int i = 0; i < static_cast<int>(comm::Primitive::kCount); ++i) {
        const auto prim = static_cast<comm::Primitive>(i);
        const comm::LedgerEntry& e = c.ledger().entry(prim);
        if (e.calls == 0) continue;
        LedgerEntry& entry = measured[group + "/" + std::string(comm::PrimitiveName(prim))];
        entry.calls = static_cast<int64_t>(e.calls);
        entry.bytes = {static_cast<int64_t>(e.bytes_sent), static_cast<int64_t>(e.bytes_received)};
      }
    };
    take("tp", **tp);
    take("pp", **pp);
    ASSERT_EQ(measured.size(), predicted.size()) << "rank " << world.rank();
    for (const auto& [key, entry] : predicted) {
      ASSERT_TRUE(measured.count(key)) << key;
      EXPECT_EQ(measured[key].bytes, entry.bytes) << key << " rank " << world.rank();
      EXPECT_EQ(measured[key].calls, entry.calls) << key << " rank " << world.rank();
    }
  });
}

TEST(LedgerMatchTest, TensorParallelLayoutsReplayExactly) {
  // stories260K: H 64, vocab 512; prefill of 5 and 37 tokens, decode of 1 and 3.
  for (int64_t tp : {2, 4}) {
    ReplayAndCompare("stories260k", {.tp = tp}, {Phase::kPrefill, 1, 37, 0});
    ReplayAndCompare("stories260k", {.tp = tp}, {Phase::kDecode, 3, 1, 40});
  }
  // TinyLlama-shaped: 8 KiB per token, ring above 4 tokens (32 KiB).
  ReplayAndCompare("synth-tinyllama", {.tp = 2}, {Phase::kPrefill, 1, 9, 0});
}

TEST(LedgerMatchTest, PipelineAndMixedLayoutsReplayExactly) {
  ReplayAndCompare("stories260k", {.pp = 2}, {Phase::kDecode, 4, 1, 10});
  ReplayAndCompare("stories260k", {.pp = 3}, {Phase::kPrefill, 1, 11, 0});
  ReplayAndCompare("stories260k", {.tp = 2, .pp = 2}, {Phase::kDecode, 2, 1, 10});
  ReplayAndCompare("stories260k", {.tp = 2, .pp = 2}, {Phase::kDecode, 2, 1, 10},
                   AllReduceAlgo::kDeterministic);
}

TEST(LedgerMatchTest, EngineStepsReplayExactly) {
  // The engine's default all-reduce is the deterministic two-shot; steps mix
  // decoding and prefilling sequences (StepPass: T new tokens, R rows of logits).
  for (int64_t tp : {2, 3, 4}) {
    ReplayAndCompare("stories260k", {.tp = tp}, StepPass(3, 13, 3), AllReduceAlgo::kDeterministic);
  }
  ReplayAndCompare("stories260k", {.tp = 2, .pp = 3}, StepPass(2, 9, 9),
                   AllReduceAlgo::kDeterministic);
  ReplayAndCompare("stories260k", {.tp = 3, .pp = 2}, StepPass(5, 5, 5));  // comm's choice
  // MoE: (T·K) expert-output rows all-reduced per layer (stories260K-moe4x2: top-2).
  ReplayAndCompare("stories260k-moe4x2", {.tp = 2}, StepPass(2, 7, 2),
                   AllReduceAlgo::kDeterministic);
  ReplayAndCompare("stories260k-moe4x2", {.tp = 2, .pp = 2}, {Phase::kDecode, 3, 1, 10});
  // A shared expert adds T rows (qwen2moe): Qwen1.5-MoE's shape, one decode token.
  ReplayAndCompare("qwen1.5-moe-a2.7b", {.tp = 4}, StepPass(1, 1, 1),
                   AllReduceAlgo::kDeterministic);
}

}  // namespace
}  // namespace tessera::plan
