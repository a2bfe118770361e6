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

// The algorithms of src/comm/algorithms/ (one file each there).
enum class AllReduceAlgo {
  kRing,               // allreduce_ring.cc: reduce-scatter + all-gather, P-1 steps each
  kRecursiveDoubling,  // allreduce_recursive_doubling.cc: log2 P whole-buffer exchanges
  kOneShot,            // allreduce_one_shot.cc: every rank reads every other's buffer
                       // from shared memory (a group on one host)
  kTwoShot,            // allreduce_deterministic.cc: each owner sums its chunk in rank
                       // order, then sends it directly to every peer
  // comm's deterministic all-reduce as a request: one-shot (the same tree) when
  // it is available, recursive doubling (the same tree) for a power-of-two group
  // up to small_bytes, two-shot otherwise. Resolve it with
  // DeterministicAllReduceChoice before computing bytes or seconds.
  kDeterministic,
};

// comm's thresholds. `oneshot_bytes` is comm's mailbox (TESSERA_ALLREDUCE_ONESHOT_BYTES,
// default 32 KiB) when every rank of the group shares one host, 0 otherwise.
struct AllReduceThresholds {
  int64_t small_bytes = int64_t{32} << 10;  // TESSERA_ALLREDUCE_SMALL_BYTES
  int64_t oneshot_bytes = int64_t{32} << 10;

  bool OneShotFits(int64_t message_bytes) const;  // like comm's Communicator::OneShotFits
};

// comm's automatic choice (Communicator::ChooseAllReduce): one-shot up to
// oneshot_bytes, else recursive doubling up to small_bytes, ring above.
AllReduceAlgo LibraryAllReduceChoice(int64_t message_bytes, const AllReduceThresholds& t);
// What kDeterministic runs (for f32/int payloads): one-shot up to oneshot_bytes,
// else recursive doubling when `ranks` is a power of two and the message is at
// most small_bytes, two-shot otherwise.
AllReduceAlgo DeterministicAllReduceChoice(int64_t message_bytes, const AllReduceThresholds& t,
                                           int64_t ranks);

enum class AllGatherAlgo {
  kRing,   // allgather_ring.cc: P-1 steps of one block
  kBruck,  // allgather_bruck.cc: ⌈log2 P⌉ steps of min(d, P-d) blocks
};
std::string_view AllGatherAlgoName(AllGatherAlgo algo);
// comm's choice (Communicator::ChooseAllGather): Bruck when a rank's block is at most
// `small_bytes` (comm's allgather_small_bytes, 16 KiB) and P > 2, else ring.
AllGatherAlgo LibraryAllGatherChoice(int64_t block_bytes, int64_t ranks, int64_t small_bytes);

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

// Recursive doubling on P' = 2^⌊log2 P⌋ ranks; the P−P' ranks r >= P' first fold
// their whole buffer into rank r−P' and get the result back from it (comm's
// allreduce_recursive_doubling.cc). A folded rank sends and receives the buffer
// once; a rank of the P' sends and receives it log2 P' times, +1 each when it
// has a folded partner (r < P−P').
RankBytes RecursiveDoublingAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks,
                                          int64_t rank);

// One-shot: every rank publishes its whole buffer and reads the P−1 others':
// sent = received = (P−1)·count elements.
RankBytes OneShotAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks);

// Two-shot: rank r sends chunk j to its owner j (count − c[r]), receives P−1 copies
// of its own chunk ((P−1)·c[r]), then sends its reduced chunk to the P−1 others and
// receives theirs: sent = received = count + (P−2)·c[r] elements.
RankBytes TwoShotAllReduceBytes(int64_t count, int64_t elem_bytes, int64_t ranks, int64_t rank);

// kDeterministic resolves with comm's default thresholds for a group on one host.
RankBytes AllReduceBytes(AllReduceAlgo algo, int64_t count, int64_t elem_bytes, int64_t ranks,
                         int64_t rank);

// Ring all-gather(v): rank j contributes block_elems[j]. Step s: rank r sends block
// (r−s) mod P and receives (r−s−1) mod P, so it sends every block but (r+1)'s and
// receives every block but its own. (comm's AllGather takes equal blocks: callers
// with uneven shards pad them to the largest, see docs/plan.md.)
RankBytes RingAllGatherBytes(std::span<const int64_t> block_elems, int64_t elem_bytes,
                             int64_t rank);
// Equal blocks: ring and Bruck both move (P−1)·block per rank each way (Bruck's
// steps carry min(d, P−d) blocks for d = 1, 2, 4, … < P, which sum to P−1).
RankBytes AllGatherBytes(int64_t block_bytes, int64_t ranks);

// Direct gather (gather_scatter_direct.cc) of `block_bytes` from every rank to
// `root`: a non-root sends its block once; the root copies its own and receives
// the P−1 others: {0, (P−1)·block}.
RankBytes GatherBytes(int64_t block_bytes, int64_t ranks, int64_t rank, int64_t root);

// Ring reduce-scatter: the first half of RingAllReduceBytes (rank r ends with chunk r+1).
RankBytes RingReduceScatterBytes(int64_t count, int64_t elem_bytes, int64_t ranks, int64_t rank);

// Deterministic reduce-scatter (comm's, for sequence parallelism) of P equal
// blocks: rank r sends block j to its owner j and receives the P−1 copies of its
// own: sent = received = (P−1)·block.
RankBytes DeterministicReduceScatterBytes(int64_t block_bytes, int64_t ranks);

// All-to-all(v), pairwise exchange: rank r sends send_elems[j] to each j ≠ r and
// receives recv_elems[j] from each j ≠ r; the diagonal is a local copy.
RankBytes AllToAllvBytes(std::span<const int64_t> send_elems, std::span<const int64_t> recv_elems,
                         int64_t elem_bytes, int64_t rank);

// Alpha-beta time of one call, the slowest rank's (seconds). A ring step moves the
// largest chunk; recursive doubling takes log2 P' (+2 when P is not a power of two)
// whole-buffer exchanges; one-shot is one alpha and (P−1) buffers read; two-shot posts all its
// sends at once, twice, so it pays alpha per 256 KiB round of its first phase and once for the
// second, and (P−1) chunks through the link in each; pairwise all-to-all posts everything at once:
// alpha + the bytes it sends.
double AllReduceSeconds(AllReduceAlgo algo, int64_t count, int64_t elem_bytes, int64_t ranks,
                        const Link& link);
double AllGatherSeconds(AllGatherAlgo algo, int64_t block_bytes, int64_t ranks, const Link& link);
// Direct gather: the root posts all P−1 receives at once and its link carries them.
double GatherSeconds(int64_t block_bytes, int64_t ranks, const Link& link);
// Deterministic reduce-scatter: two-shot's first phase, alpha per 256 KiB round.
double DeterministicReduceScatterSeconds(int64_t block_bytes, int64_t ranks, const Link& link);
double AllToAllSeconds(double sent_bytes, int64_t ranks, const Link& link);
double SendRecvSeconds(double bytes, const Link& link);

}  // namespace tessera::plan
