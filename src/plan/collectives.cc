#include "plan/collectives.h"

#include <algorithm>

#include "base/check.h"

namespace tessera::plan {
namespace {

// Bytes a deterministic all-reduce or reduce-scatter round moves per contribution
// (comm/algorithms/allreduce_deterministic.cc).
constexpr int64_t kRoundBytes = int64_t{256} << 10;

int64_t Mod(int64_t a, int64_t p) { return ((a % p) + p) % p; }

int64_t FloorPow2(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int64_t Log2(int64_t pow2) {
  int64_t log = 0;
  while ((int64_t{1} << log) < pow2) ++log;
  return log;
}

void CheckRank(int64_t ranks, int64_t rank) {
  TESSERA_CHECK_GE(ranks, 1);
  TESSERA_CHECK(rank >= 0 && rank < ranks) << "rank " << rank << " of " << ranks;
}

}  // namespace

std::string_view AllReduceAlgoName(AllReduceAlgo algo) {
  switch (algo) {
    case AllReduceAlgo::kRing:
      return "ring";
    case AllReduceAlgo::kRecursiveDoubling:
      return "recursive-doubling";
    case AllReduceAlgo::kOneShot:
      return "one-shot";
    case AllReduceAlgo::kTwoShot:
      return "two-shot";
    case AllReduceAlgo::kDeterministic:
      return "deterministic";
  }
  return "?";
}

Result<AllReduceAlgo> ParseAllReduceAlgo(std::string_view name) {
  if (name == "ring") return AllReduceAlgo::kRing;
  // comm's spellings (TESSERA_ALLREDUCE_ALGO) are accepted too.
  if (name == "rd" || name == "recursive-doubling" || name == "recursive_doubling") {
    return AllReduceAlgo::kRecursiveDoubling;
  }
  if (name == "one-shot" || name == "oneshot" || name == "one_shot") return AllReduceAlgo::kOneShot;
  if (name == "two-shot" || name == "two_shot") return AllReduceAlgo::kTwoShot;
  if (name == "deterministic" || name == "det") return AllReduceAlgo::kDeterministic;
  return InvalidArgumentError("unknown all-reduce algorithm '" + std::string(name) +
                              "' (known: ring, rd, one-shot, two-shot, deterministic, auto)");
}

bool AllReduceThresholds::OneShotFits(int64_t message_bytes) const {
  return oneshot_bytes > 0 && message_bytes <= oneshot_bytes;
}

AllReduceAlgo LibraryAllReduceChoice(int64_t message_bytes, const AllReduceThresholds& t) {
  if (t.OneShotFits(message_bytes)) return AllReduceAlgo::kOneShot;
  return message_bytes <= t.small_bytes ? AllReduceAlgo::kRecursiveDoubling : AllReduceAlgo::kRing;
}

AllReduceAlgo DeterministicAllReduceChoice(int64_t message_bytes, const AllReduceThresholds& t,
                                           int64_t ranks) {
  if (t.OneShotFits(message_bytes)) return AllReduceAlgo::kOneShot;
  const bool power_of_two = ranks > 0 && (ranks & (ranks - 1)) == 0;
  return power_of_two && message_bytes <= t.small_bytes ? AllReduceAlgo::kRecursiveDoubling
                                                        : AllReduceAlgo::kTwoShot;
}

std::string_view AllGatherAlgoName(AllGatherAlgo algo) {
  return algo == AllGatherAlgo::kBruck ? "bruck" : "ring";
}

AllGatherAlgo LibraryAllGatherChoice(int64_t block_bytes, int64_t ranks, int64_t small_bytes) {
  return block_bytes <= small_bytes && ranks > 2 ? AllGatherAlgo::kBruck : AllGatherAlgo::kRing;
}

int64_t ChunkElems(int64_t count, int64_t parts, int64_t index) {
  TESSERA_CHECK_GE(parts, 1);
  TESSERA_CHECK(index >= 0 && index < parts) << "chunk " << index << " of " << parts;
  return count / parts + (index < count % parts ? 1 : 0);
}

RankBytes RingAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks, int64_t rank) {
  CheckRank(ranks, rank);
  if (ranks == 1) return {};
  const int64_t c_r = ChunkElems(count, ranks, rank);
  const int64_t c_r1 = ChunkElems(count, ranks, Mod(rank + 1, ranks));
  const int64_t c_r2 = ChunkElems(count, ranks, Mod(rank + 2, ranks));
  return {(2 * count - c_r1 - c_r2) * elem_bytes, (2 * count - c_r - c_r1) * elem_bytes};
}

RankBytes RingReduceScatterBytes(int64_t count, int64_t elem_bytes, int64_t ranks, int64_t rank) {
  CheckRank(ranks, rank);
  if (ranks == 1) return {};
  const int64_t c_r = ChunkElems(count, ranks, rank);
  const int64_t c_r1 = ChunkElems(count, ranks, Mod(rank + 1, ranks));
  return {(count - c_r1) * elem_bytes, (count - c_r) * elem_bytes};
}

RankBytes RecursiveDoublingAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks,
                                          int64_t rank) {
  CheckRank(ranks, rank);
  if (ranks == 1) return {};
  const int64_t pow2 = FloorPow2(ranks);
  const int64_t buffer = count * elem_bytes;
  if (rank >= pow2) return {buffer, buffer};  // folds into rank - pow2
  const int64_t exchanges = Log2(pow2) + (rank + pow2 < ranks ? 1 : 0);
  return {exchanges * buffer, exchanges * buffer};
}

RankBytes OneShotAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks) {
  const int64_t bytes = (ranks - 1) * count * elem_bytes;
  return {bytes, bytes};
}

RankBytes TwoShotAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks, int64_t rank) {
  CheckRank(ranks, rank);
  if (ranks == 1) return {};
  const int64_t own = ChunkElems(count, ranks, rank);
  const int64_t elems = (count - own) + (ranks - 1) * own;
  return {elems * elem_bytes, elems * elem_bytes};
}

RankBytes AllReduceBytes(AllReduceAlgo algo, int64_t count, int64_t elem_bytes, int64_t ranks,
                         int64_t rank) {
  switch (algo) {
    case AllReduceAlgo::kRing:
      return RingAllReduceBytes(count, elem_bytes, ranks, rank);
    case AllReduceAlgo::kRecursiveDoubling:
      return RecursiveDoublingAllReduceBytes(count, elem_bytes, ranks, rank);
    case AllReduceAlgo::kOneShot:
      CheckRank(ranks, rank);
      return OneShotAllReduceBytes(count, elem_bytes, ranks);
    case AllReduceAlgo::kTwoShot:
      return TwoShotAllReduceBytes(count, elem_bytes, ranks, rank);
    case AllReduceAlgo::kDeterministic:
      return AllReduceBytes(DeterministicAllReduceChoice(count * elem_bytes, {}, ranks), count,
                            elem_bytes, ranks, rank);
  }
  return {};
}

RankBytes RingAllGatherBytes(std::span<const int64_t> block_elems, int64_t elem_bytes,
                             int64_t rank) {
  const int64_t ranks = static_cast<int64_t>(block_elems.size());
  CheckRank(ranks, rank);
  if (ranks == 1) return {};
  int64_t total = 0;
  for (int64_t b : block_elems) total += b;
  return {(total - block_elems[Mod(rank + 1, ranks)]) * elem_bytes,
          (total - block_elems[rank]) * elem_bytes};
}

RankBytes AllGatherBytes(int64_t block_bytes, int64_t ranks) {
  TESSERA_CHECK_GE(ranks, 1);
  return {(ranks - 1) * block_bytes, (ranks - 1) * block_bytes};
}

RankBytes GatherBytes(int64_t block_bytes, int64_t ranks, int64_t rank, int64_t root) {
  CheckRank(ranks, rank);
  CheckRank(ranks, root);
  if (rank != root) return {block_bytes, 0};
  return {0, (ranks - 1) * block_bytes};
}

RankBytes DeterministicReduceScatterBytes(int64_t block_bytes, int64_t ranks) {
  TESSERA_CHECK(ranks >= 1);
  return {(ranks - 1) * block_bytes, (ranks - 1) * block_bytes};
}

RankBytes AllToAllvBytes(std::span<const int64_t> send_elems, std::span<const int64_t> recv_elems,
                         int64_t elem_bytes, int64_t rank) {
  TESSERA_CHECK_EQ(send_elems.size(), recv_elems.size());
  CheckRank(static_cast<int64_t>(send_elems.size()), rank);
  RankBytes bytes;
  for (size_t j = 0; j < send_elems.size(); ++j) {
    if (static_cast<int64_t>(j) == rank) continue;
    bytes.sent += send_elems[j] * elem_bytes;
    bytes.received += recv_elems[j] * elem_bytes;
  }
  return bytes;
}

double AllReduceSeconds(AllReduceAlgo algo, int64_t count, int64_t elem_bytes, int64_t ranks,
                        const Link& link) {
  if (ranks <= 1) return 0;
  const int64_t max_chunk_bytes = ChunkElems(count, ranks, 0) * elem_bytes;
  switch (algo) {
    case AllReduceAlgo::kRing:
      return 2.0 * static_cast<double>(ranks - 1) * link.SecondsFor(max_chunk_bytes);
    case AllReduceAlgo::kTwoShot: {
      const int64_t rounds =
          std::max<int64_t>(1, (max_chunk_bytes + kRoundBytes - 1) / kRoundBytes);
      const double bytes = static_cast<double>((ranks - 1) * max_chunk_bytes);
      return static_cast<double>(rounds + 1) * link.latency_us * 1e-6 +
             2 * bytes / (link.bandwidth_gbps * 1e9);
    }
    case AllReduceAlgo::kDeterministic:  // comm's defaults, one host
      return AllReduceSeconds(DeterministicAllReduceChoice(count * elem_bytes, {}, ranks), count,
                              elem_bytes, ranks, link);
    case AllReduceAlgo::kOneShot:
      return link.SecondsFor(static_cast<double>((ranks - 1) * count * elem_bytes));
    case AllReduceAlgo::kRecursiveDoubling: {
      const int64_t pow2 = FloorPow2(ranks);
      const int64_t steps = Log2(pow2) + (pow2 == ranks ? 0 : 2);
      return static_cast<double>(steps) * link.SecondsFor(static_cast<double>(count * elem_bytes));
    }
  }
  return 0;
}

double AllGatherSeconds(AllGatherAlgo algo, int64_t block_bytes, int64_t ranks, const Link& link) {
  if (ranks <= 1) return 0;
  if (algo == AllGatherAlgo::kRing) {
    return static_cast<double>(ranks - 1) * link.SecondsFor(static_cast<double>(block_bytes));
  }
  double seconds = 0;
  for (int64_t d = 1; d < ranks; d *= 2) {
    seconds += link.SecondsFor(static_cast<double>(std::min(d, ranks - d) * block_bytes));
  }
  return seconds;
}

double DeterministicReduceScatterSeconds(int64_t block_bytes, int64_t ranks, const Link& link) {
  if (ranks <= 1) return 0;
  const int64_t rounds = std::max<int64_t>(1, (block_bytes + kRoundBytes - 1) / kRoundBytes);
  return static_cast<double>(rounds) * link.latency_us * 1e-6 +
         static_cast<double>((ranks - 1) * block_bytes) / (link.bandwidth_gbps * 1e9);
}

double GatherSeconds(int64_t block_bytes, int64_t ranks, const Link& link) {
  if (ranks <= 1) return 0;
  return link.SecondsFor(static_cast<double>((ranks - 1) * block_bytes));
}

double AllToAllSeconds(double sent_bytes, int64_t ranks, const Link& link) {
  if (ranks <= 1) return 0;
  return link.SecondsFor(sent_bytes);
}

double SendRecvSeconds(double bytes, const Link& link) { return link.SecondsFor(bytes); }

}  // namespace tessera::plan
