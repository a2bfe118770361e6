// Exact per-rank bytes and alpha-beta times of the collective algorithms tessera's
// comm library runs — the one place the planner's traffic figures come from, so a
// test can hold them against the ledger's measured bytes. Layer: plan (pure
// arithmetic). Conventions (chunking, which rank sends which chunk) are written
// beside each function and in docs/plan.md.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "base/status.h"
#include "plan/cluster.h"

namespace tessera::plan {

// What one rank moves in one call: payload bytes it sends to, and receives from,
// other ranks (copies to itself are not traffic).
struct RankBytes {
  int64_t sent = 0;
  int64_t received = 0;

  RankBytes& operator+=(const RankBytes& other) {
    sent += other.sent;
    received += other.received;
    return *this;
  }
  RankBytes Times(int64_t n) const { return {sent * n, received * n}; }
  bool operator==(const RankBytes&) const = default;
};

enum class AllReduceAlgo {
  kRing,               // reduce-scatter + all-gather around a ring, P-1 steps each
  kRecursiveDoubling,  // log2 P exchanges of the whole buffer (small messages)
  kTwoShot,            // deterministic: each owner sums its chunk in rank order, then
                       // all-gathers it directly (reduce-scatter + all-gather)
};

std::string_view AllReduceAlgoName(AllReduceAlgo algo);
// "ring", "rd" / "recursive-doubling", "two-shot"; InvalidArgument otherwise.
Result<AllReduceAlgo> ParseAllReduceAlgo(std::string_view name);

// Elements of chunk `index` when `count` elements are split into `parts` chunks:
// the first count % parts chunks get ⌈count/parts⌉, the rest ⌊count/parts⌋.
int64_t ChunkElems(int64_t count, int64_t parts, int64_t index);

// Ring all-reduce of `count` elements over `ranks` ranks, seen from `rank`.
// Reduce-scatter step s (0..P-2): rank r sends chunk (r-s) mod P to r+1 and receives
// chunk (r-s-1) mod P, ending with reduced chunk (r+1) mod P; all-gather step s:
// sends chunk (r+1-s) mod P, receives (r-s) mod P. So r sends every chunk but
// r+1 and then every chunk but r+2:
//   sent = 2·count − c[(r+1)%P] − c[(r+2)%P],  received = 2·count − c[r] − c[(r+1)%P]
// (times elem_bytes), which sums over ranks to 2(P−1)·count and is 2(P−1)/P·M per
// rank when P divides count.
RankBytes RingAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks, int64_t rank);

// Recursive doubling on P' = 2^⌊log2 P⌋ ranks, with the P−P' extra ranks folded in
// MPICH-style: among the first 2(P−P') ranks each even rank sends its whole buffer
// to rank+1 before and receives the result after. A participating rank sends and
// receives the whole buffer log2 P' times (+1 each for a partner of an extra rank).
RankBytes RecursiveDoublingAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks,
                                          int64_t rank);

// Two-shot: rank r sends chunk j to its owner j (count − c[r]), receives P−1 copies
// of its own chunk ((P−1)·c[r]), then sends its reduced chunk to the P−1 others and
// receives theirs: sent = received = count + (P−2)·c[r] elements.
RankBytes TwoShotAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks, int64_t rank);

RankBytes AllReduceBytes(AllReduceAlgo algo, int64_t count, int64_t elem_bytes, int64_t ranks,
                         int64_t rank);

// Ring all-gather(v): rank j contributes block_elems[j]. Step s: rank r sends block
// (r−s) mod P and receives (r−s−1) mod P, so it sends every block but (r+1)'s and
// receives every block but its own.
RankBytes RingAllGatherBytes(std::span<const int64_t> block_elems, int64_t elem_bytes,
                             int64_t rank);

// Ring reduce-scatter: the first half of RingAllReduceBytes (rank r ends with chunk r+1).
RankBytes RingReduceScatterBytes(int64_t count, int64_t elem_bytes, int64_t ranks, int64_t rank);

// All-to-all(v), pairwise exchange: rank r sends send_elems[j] to each j ≠ r and
// receives recv_elems[j] from each j ≠ r; the diagonal is a local copy.
RankBytes AllToAllvBytes(std::span<const int64_t> send_elems, std::span<const int64_t> recv_elems,
                         int64_t elem_bytes, int64_t rank);

// Alpha-beta time of one call, the slowest rank's (seconds). A ring step moves the
// largest chunk; recursive doubling takes log2 P' (+2 when P is not a power of two)
// whole-buffer exchanges; pairwise all-to-all P−1 steps of the largest peer message.
double AllReduceSeconds(AllReduceAlgo algo, int64_t count, int64_t elem_bytes, int64_t ranks,
                        const Link& link);
double AllGatherSeconds(int64_t max_block_bytes, int64_t ranks, const Link& link);
double AllToAllSeconds(double max_peer_bytes, int64_t ranks, const Link& link);
double SendRecvSeconds(double bytes, const Link& link);

// The algorithm with the lowest modelled time (what the library's size-based
// selection aims at); ties go to the ring.
AllReduceAlgo FastestAllReduce(int64_t count, int64_t elem_bytes, int64_t ranks, const Link& link);

}  // namespace tessera::plan
