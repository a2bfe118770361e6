// CommOptions: every setting of a communicator — transport, deadlines, waiting,
// buffer sizes, algorithm overrides — with defaults from the environment
// (docs/knobs.md lists each TESSERA_* variable). Layer: comm. A plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "comm/calibration.h"

namespace tessera::comm {

// kAuto: shared memory between ranks on one host; between hosts MPI when the
// process runs under an MPI launcher in an MPI build (InitWorld starts MPI), TCP
// otherwise. kMpi: MPI for every peer (transport/mpi_channel.h).
enum class TransportKind : uint8_t { kAuto, kShm, kTcp, kMpi };
std::string_view TransportKindName(TransportKind kind);
std::optional<TransportKind> ParseTransportKind(std::string_view name);

enum class AllReduceAlgo : uint8_t {
  kAuto,
  kRing,               // reduce-scatter + all-gather around the ring (bandwidth)
  kRecursiveDoubling,  // log2(N) whole-buffer exchanges (latency)
  // Every rank reads every input from the shared-memory mailbox and combines them
  // with the deterministic tree (below): one hand-off, no rounds. Only when every
  // rank is on this host and the message fits allreduce_oneshot_bytes; otherwise
  // a request for it gets the automatic choice.
  kOneShot,
  // The deterministic all-reduce. Contract (the inference engine relies on it for
  // bit-identical results across parallel layouts): every element of the result
  // is Tree(0, N) over the N ranks' contributions x[0..N-1] in rank order, where
  //   Tree(lo, hi) = x[lo]                          if hi - lo == 1
  //                = Tree(lo, mid) op Tree(mid, hi)  with mid = lo + (hi - lo) / 2.
  // f16/bf16 accumulate in f32 through the whole tree and round once at the end;
  // avg divides the f32 (or native) tree sum by N before that rounding. The result
  // is identical on every rank, every run, and for every transport. Two-shot
  // (algorithms/allreduce_deterministic.cc); one-shot when it is available (it
  // computes that tree on every rank); otherwise for a power-of-two group and a
  // native type up to allreduce_small_bytes, recursive doubling, which computes
  // the same tree.
  kDeterministic,
};
enum class AllGatherAlgo : uint8_t { kAuto, kRing, kBruck };
// kDeterministic: every element is the deterministic all-reduce's tree (above), so
// a reduce-scatter then an all-gather reproduce that all-reduce bit for bit.
enum class ReduceScatterAlgo : uint8_t { kAuto, kRing, kDeterministic };
enum class BroadcastAlgo : uint8_t { kAuto, kBinomialTree, kPipelinedChain };

std::string_view AllReduceAlgoName(AllReduceAlgo algo);  // "ring", "rd", "oneshot", …
std::optional<AllReduceAlgo> ParseAllReduceAlgo(std::string_view name);
std::string_view AllGatherAlgoName(AllGatherAlgo algo);  // "ring", "bruck"
std::optional<AllGatherAlgo> ParseAllGatherAlgo(std::string_view name);
std::string_view ReduceScatterAlgoName(ReduceScatterAlgo algo);  // "ring", "deterministic"
std::optional<ReduceScatterAlgo> ParseReduceScatterAlgo(std::string_view name);
std::string_view BroadcastAlgoName(BroadcastAlgo algo);  // "tree", "chain"
std::optional<BroadcastAlgo> ParseBroadcastAlgo(std::string_view name);

enum MpiCollective : uint32_t {
  kMpiAllGather = 1,
  kMpiAllToAll = 2,
  kMpiAllToAllv = 4,
};
// "allgather,alltoall,alltoallv", any subset, "all" or "" (none).
std::optional<uint32_t> ParseMpiCollectives(std::string_view list);

struct CommOptions {
  // Names shared-memory segments and store keys; every rank of a job must agree.
  std::string job_id = "job";
  TransportKind transport = TransportKind::kAuto;
  // Every operation's deadline (and connection setup's).
  int64_t timeout_ms = 300'000;
  // A same-host peer whose heartbeat stops this long while we wait on it is an error
  // (frozen: SIGSTOP, a debugger); 0 = never. TESSERA_COMM_FROZEN_MS.
  int64_t frozen_peer_ms = 5'000;
  // Spin this long after the last progress before sleeping; -1 = automatic
  // (long when each local rank has a core, short and yielding when oversubscribed).
  int64_t spin_us = -1;
  size_t shm_ring_bytes = size_t{4} << 20;    // per directed pair
  size_t shm_chunk_bytes = size_t{64} << 10;  // largest chunk in a ring
  // Collective messages of at least this size (and below the max) to a same-host
  // peer go as single copy: the receiver reads the sender's buffer with
  // process_vm_readv (when the probe at connect shows it may) instead of both
  // copying through the ring. 0 = never. What pays depends on the host: on the Zen 3
  // VM single copy was 30–60% faster for 256–512 KiB messages; on the Zen 5 VM the
  // kernel's page pinning made it ~2.5x slower per byte than a memcpy (docs/comm.md).
  // So unless the caller or the environment sets these (shm_single_copy_source
  // kEnv), Connect takes the window from this host's calibration (calibration.h,
  // `calibration` below); without one, every message streams. An all-reduce's
  // copying half never single-copies from its own max (1 MiB): the ring keeps the
  // reducing half's pipeline going.
  size_t shm_single_copy_bytes = 0;
  size_t shm_single_copy_max_bytes = size_t{8} << 20;
  size_t shm_single_copy_allreduce_max_bytes = size_t{1} << 20;
  // Where the window above came from. kDefault lets Connect calibrate; a caller that
  // sets the window itself sets kEnv; Connect records kCalibrated / kCached, which
  // Split passes on, so sub-communicators do not measure again.
  SettingSource shm_single_copy_source = SettingSource::kDefault;
  // TESSERA_COMM_CALIBRATION: auto (the host's cache, measured at first use), off
  // (the fixed defaults), redo (measure again and rewrite the cache).
  CalibrationMode calibration = CalibrationMode::kAuto;
  // Where the calibration cache lives ("" = CalibrationCacheDir(): TESSERA_CACHE_DIR,
  // XDG_CACHE_HOME/tessera or HOME/.cache/tessera, read when it is needed).
  std::string calibration_cache_dir;
  // Tests only: stands in for the measurement on the calibrating rank (which it is
  // given), so the protocol, the cache and the decision run without timing; it also
  // lets ranks that are threads of one process calibrate. Empty: measure.
  std::function<std::vector<CalibrationPoint>(int rank)> calibration_measure_for_test;
  // Collective messages of at least this size whose bytes lie in one of the
  // sender's shared buffers (Communicator::AllocateShared) go to a same-host peer
  // as a descriptor; the peer reads them from its mapping (0 = never).
  size_t shm_shared_buffer_bytes = size_t{64} << 10;
  // Copying receives and local blocks this large store past the cache (0 = never).
  size_t copy_bypass_cache_bytes = size_t{8} << 20;
  int tcp_connections = 4;  // per peer
  size_t tcp_stripe_bytes = size_t{256} << 10;
  // Emulated one-way link latency on TCP channels, for tests and benchmarks
  // only (0 = off, no cost): every byte written becomes readable this long after
  // it was written; back-to-back messages pipeline. Shared memory is never
  // delayed. Every rank must use the same value.
  int64_t tcp_emulated_delay_us = 0;
  size_t unexpected_limit_bytes = size_t{64} << 20;
  std::string cluster_token;  // authenticates TCP transport connections
  std::string listen_host;    // TCP transport listen address ("" = from the store link)
  // Listen beyond loopback without a cluster token (comm/exposure.h); refused otherwise.
  bool insecure_no_token = false;
  // Authenticate every TCP frame after the handshake (transport/authenticated_channel.h).
  // Off (TESSERA_TCP_FRAME_AUTH=0) only for measuring its cost: loud, and every rank
  // must agree.
  bool tcp_frame_auth = true;
  // TLS 1.3 on every TCP connection instead (transport/tls_channel.h): encrypted as
  // well as authenticated, with forward secrecy. Every rank must agree.
  bool tcp_tls = false;
  // Algorithm overrides and the automatic thresholds.
  AllReduceAlgo allreduce_algo = AllReduceAlgo::kAuto;
  AllGatherAlgo allgather_algo = AllGatherAlgo::kAuto;
  BroadcastAlgo broadcast_algo = BroadcastAlgo::kAuto;
  size_t allreduce_small_bytes = size_t{32} << 10;  // <= this: recursive doubling
  // <= this, every rank on this host: one-shot through the mailbox (also the
  // mailbox slot size; 0 = no mailbox). Every rank must use the same value.
  size_t allreduce_oneshot_bytes = size_t{32} << 10;
  size_t allgather_small_bytes = size_t{16} << 10;  // per rank, <= this: Bruck
  size_t broadcast_small_bytes = size_t{64} << 10;  // <= this: binomial tree
  size_t broadcast_chunk_bytes = size_t{256} << 10;
  // Local ranks sharing this host's CPUs (to detect oversubscription); 0 = count
  // the communicator's same-host ranks.
  int local_ranks_hint = 0;
  // MPI's own collectives instead of tessera's algorithms, on communicators whose
  // every pair is on MPI and whose ranks are distinct MPI processes: a bit set of
  // MpiCollective (TESSERA_MPI_COLLECTIVES="allgather,alltoallv" or "all"; none by
  // default). Only collectives that move data: the bytes that arrive, and the
  // ledger's counts, are the same; reductions keep tessera's order.
  uint32_t mpi_collectives = 0;

  // Defaults overridden by TESSERA_* environment variables. Malformed values
  // are InvalidArgument.
  static Result<CommOptions> FromEnvironment();
};

}  // namespace tessera::comm
