#include "comm/bench/comm_bench.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <vector>

#include "base/clock.h"
#include "comm/bench/copy_mode_report.h"
#include "comm/bench/pattern.h"
#include "comm/bench/raw_baseline.h"

namespace tessera::comm {
namespace {

// Least warm-up time per (op, size), summed over rounds of `warmup` iterations.
constexpr int64_t kMinWarmupNs = 10'000'000;
// ... and for the run's first size: a new job's first ~10–20 ms of collectives ran
// several times slow on the Zen 5 VM even with the rings mapped at connect (256 KiB
// all-gathers: the first 30 took 400 µs each, against 7 µs later).
constexpr int64_t kFirstWarmupNs = 150'000'000;

const char* const kAllOps[] = {"allreduce", "allgather",     "reducescatter", "alltoall",
                               "alltoallv", "alltoallvskew", "broadcast",     "reduce",
                               "gather",    "scatter",       "sendrecv"};

bool IsAllToAll(const std::string& op) {
  return op == "alltoall" || op == "alltoallv" || op == "alltoallvskew";
}

// all_to_allv's per-peer element counts for a benchmark block of `count`:
// "alltoallv" sends every peer `count` (the uniform case, through the v
// interface); "alltoallvskew" sends rank (r + s) % n ⌊2(1 + s)·count / (n + 1)⌋,
// from 2/(n+1) to 2n/(n+1) blocks, the same total as uniform (the load an MoE
// router puts on its expert ranks: every pair different). `from` = false: what
// `rank` sends to each peer; true: what it receives from each.
std::vector<size_t> PeerCounts(const std::string& op, size_t count, int n, int rank, bool from) {
  std::vector<size_t> counts(static_cast<size_t>(n), count);
  if (op != "alltoallvskew") return counts;
  for (int q = 0; q < n; ++q) {
    // The sender's offset to the receiver.
    const int s = from ? (rank - q + n) % n : (q - rank + n) % n;
    counts[static_cast<size_t>(q)] = 2 * (1 + static_cast<size_t>(s)) * count / (n + 1);
  }
  return counts;
}

std::vector<size_t> Displacements(const std::vector<size_t>& counts) {
  std::vector<size_t> displs(counts.size(), 0);
  for (size_t p = 1; p < counts.size(); ++p) displs[p] = displs[p - 1] + counts[p - 1];
  return displs;
}

std::string Canonical(std::string op) {
  op.erase(std::remove(op.begin(), op.end(), '_'), op.end());
  op.erase(std::remove(op.begin(), op.end(), '-'), op.end());
  if (op == "a2a") return "alltoall";
  return op;
}

// Elements each rank contributes for a benchmark "size" (nccl-tests semantics).
size_t CountFor(const std::string& op, size_t bytes, size_t esize, int n) {
  size_t total = bytes / esize;
  if (op == "allgather" || op == "reducescatter" || IsAllToAll(op) || op == "gather" ||
      op == "scatter") {
    return total / static_cast<size_t>(n);
  }
  return total;
}

size_t BytesFor(const std::string& op, size_t count, size_t esize, int n) {
  if (op == "allgather" || op == "reducescatter" || IsAllToAll(op) || op == "gather" ||
      op == "scatter") {
    return count * esize * static_cast<size_t>(n);
  }
  return count * esize;
}

// The send and receive buffers: plain memory, or shared buffers (--register).
struct Buffers {
  std::span<uint8_t> send;
  std::span<uint8_t> recv;
  std::vector<uint8_t> expected;
  std::vector<uint8_t> plain_send, plain_recv;
  SharedBuffer shared_send, shared_recv;

  Status Allocate(Communicator& comm, size_t bytes, bool shared) {
    if (shared) {
      TESSERA_ASSIGN_OR_RETURN(shared_send, comm.AllocateShared(bytes));
      TESSERA_ASSIGN_OR_RETURN(shared_recv, comm.AllocateShared(bytes));
      send = {shared_send.data(), bytes};
      recv = {shared_recv.data(), bytes};
    } else {
      plain_send.resize(bytes);
      plain_recv.resize(bytes);
      send = plain_send;
      recv = plain_recv;
    }
    std::fill(send.begin(), send.end(), uint8_t{1});
    std::fill(recv.begin(), recv.end(), uint8_t{0});
    return Status::Ok();
  }
};

struct Bench {
  Communicator& comm;
  const CommBenchOptions& options;
  AllReduceAlgo allreduce_algo = AllReduceAlgo::kAuto;
  AllGatherAlgo allgather_algo = AllGatherAlgo::kAuto;
  BroadcastAlgo broadcast_algo = BroadcastAlgo::kAuto;

  std::string AlgoName(const std::string& op, size_t count) const {
    const size_t esize = DataTypeSize(options.dtype);
    if (op == "allreduce") {
      return std::string(AllReduceAlgoName(comm.ChooseAllReduce(count * esize, allreduce_algo)));
    }
    if (op == "allgather") {
      if (comm.UsesMpi(kMpiAllGather)) return "mpi";
      return std::string(AllGatherAlgoName(comm.ChooseAllGather(count * esize, allgather_algo)));
    }
    if (op == "broadcast") {
      return std::string(BroadcastAlgoName(comm.ChooseBroadcast(count * esize, broadcast_algo)));
    }
    if (op == "reducescatter") return "ring";
    if (IsAllToAll(op)) {
      return comm.UsesMpi(op == "alltoall" ? kMpiAllToAll : kMpiAllToAllv) ? "mpi" : "pairwise";
    }
    if (op == "reduce") return "tree";
    if (op == "gather" || op == "scatter") return "direct";
    return "p2p";
  }

  Status RunOnce(const std::string& op, size_t count, Buffers& b) {
    const DataType dt = options.dtype;
    const int n = comm.size();
    const int r = comm.rank();
    uint8_t* s = b.send.data();
    uint8_t* d = b.recv.data();
    if (op == "allreduce") return comm.AllReduce(s, d, count, dt, options.redop, allreduce_algo);
    if (op == "allgather") return comm.AllGather(s, d, count, dt, allgather_algo);
    if (op == "reducescatter") return comm.ReduceScatter(s, d, count, dt, options.redop);
    if (op == "alltoall") return comm.AllToAll(s, d, count, dt);
    if (IsAllToAll(op)) {
      const std::vector<size_t> to = PeerCounts(op, count, n, r, false);
      const std::vector<size_t> from = PeerCounts(op, count, n, r, true);
      return comm.AllToAllv(s, to, Displacements(to), d, from, Displacements(from), dt);
    }
    if (op == "broadcast") return comm.Broadcast(r == 0 ? s : d, count, dt, 0, broadcast_algo);
    if (op == "reduce") return comm.Reduce(s, d, count, dt, options.redop, 0);
    if (op == "gather") return comm.Gather(s, d, count, dt, 0);
    if (op == "scatter") return comm.Scatter(s, d, count, dt, 0);
    // sendrecv: send to the right, receive from the left (a ring shift).
    const size_t bytes = count * DataTypeSize(dt);
    TESSERA_ASSIGN_OR_RETURN(Request rq, comm.Irecv(d, bytes, (r - 1 + n) % n, 7));
    TESSERA_ASSIGN_OR_RETURN(Request sq, comm.Isend(s, bytes, (r + 1) % n, 7));
    TESSERA_RETURN_IF_ERROR(comm.Wait(rq));
    return comm.Wait(sq);
  }

  // Fills inputs, runs the op once and counts wrong elements on this rank.
  Result<size_t> Check(const std::string& op, size_t count, Buffers& b) {
    const DataType dt = options.dtype;
    const ReduceOp ro = options.redop;
    const size_t esize = DataTypeSize(dt);
    const int n = comm.size();
    const int r = comm.rank();
    if (op == "sendrecv" && n == 1) return size_t{0};
    std::memset(b.recv.data(), 0xcd, b.recv.size());
    uint8_t* exp = b.expected.data();
    size_t check_count = count;
    const uint8_t* actual = b.recv.data();
    bool mine = true;
    if (op == "allreduce" || op == "reduce") {
      FillPattern(b.send.data(), count, dt, ro, r, 0);
      FillExpected(exp, count, dt, ro, n, 0);
      mine = op == "allreduce" || r == 0;
    } else if (op == "reducescatter") {
      FillPattern(b.send.data(), count * n, dt, ro, r, 0);
      FillExpected(exp, count, dt, ro, n, r * count);
    } else if (op == "allgather" || op == "gather") {
      FillPattern(b.send.data(), count, dt, ReduceOp::kSum, r, r * count);
      for (int q = 0; q < n; ++q) {
        FillPattern(exp + q * count * esize, count, dt, ReduceOp::kSum, q, q * count);
      }
      check_count = count * n;
      mine = op == "allgather" || r == 0;
    } else if (op == "scatter") {
      for (int q = 0; q < n; ++q) {
        FillPattern(b.send.data() + q * count * esize, count, dt, ReduceOp::kSum, 0, q * count);
      }
      FillPattern(exp, count, dt, ReduceOp::kSum, 0, r * count);
    } else if (op == "alltoall") {
      // Block for q = pattern(me, q*count); block from p = pattern(p, me*count).
      for (int q = 0; q < n; ++q) {
        FillPattern(b.send.data() + q * count * esize, count, dt, ReduceOp::kSum, r, q * count);
        FillPattern(exp + q * count * esize, count, dt, ReduceOp::kSum, q, r * count);
      }
      check_count = count * n;
    } else if (IsAllToAll(op)) {
      // As alltoall, each peer's block `count` long or skewed, packed in peer order.
      const std::vector<size_t> to = PeerCounts(op, count, n, r, false);
      const std::vector<size_t> from = PeerCounts(op, count, n, r, true);
      const std::vector<size_t> sd = Displacements(to), rd = Displacements(from);
      check_count = 0;
      for (int q = 0; q < n; ++q) {
        FillPattern(b.send.data() + sd[q] * esize, to[q], dt, ReduceOp::kSum, r, q * count);
        FillPattern(exp + rd[q] * esize, from[q], dt, ReduceOp::kSum, q, r * count);
        check_count += from[q];
      }
    } else if (op == "broadcast") {
      FillPattern(b.send.data(), count, dt, ReduceOp::kSum, 0, 0);
      FillPattern(exp, count, dt, ReduceOp::kSum, 0, 0);
      if (r == 0) actual = b.send.data();
    } else {  // sendrecv
      FillPattern(b.send.data(), count, dt, ReduceOp::kSum, r, 0);
      FillPattern(exp, count, dt, ReduceOp::kSum, (r - 1 + n) % n, 0);
    }
    TESSERA_RETURN_IF_ERROR(RunOnce(op, count, b));
    if (!mine) return size_t{0};
    return CountMismatches(actual, exp, check_count, dt);
  }
};

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

double BusBandwidthFactor(const std::string& op, int n) {
  if (n <= 1)
    return op == "allreduce" || op == "allgather" || op == "reducescatter" || IsAllToAll(op) ||
                   op == "gather" || op == "scatter"
               ? 0.0
               : 1.0;
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  // Skewed: the block a rank keeps is 2/(n+1) of the uniform one, so more crosses.
  if (op == "alltoallvskew") return 1.0 - 2.0 / (static_cast<double>(n) * (n + 1));
  if (op == "allgather" || op == "reducescatter" || IsAllToAll(op) || op == "gather" ||
      op == "scatter") {
    return static_cast<double>(n - 1) / n;
  }
  return 1.0;
}

Result<std::vector<std::string>> ExpandBenchOps(const std::vector<std::string>& ops) {
  std::vector<std::string> out;
  for (const std::string& raw : ops) {
    std::string op = Canonical(raw);
    if (op == "all") {
      out.assign(std::begin(kAllOps), std::end(kAllOps));
      continue;
    }
    if (std::find(std::begin(kAllOps), std::end(kAllOps), op) == std::end(kAllOps)) {
      return InvalidArgumentError(
          "unknown op '" + raw +
          "' (allreduce, allgather, reducescatter, alltoall, alltoallv, alltoallvskew, broadcast, "
          "reduce, gather, scatter, sendrecv, all)");
    }
    if (std::find(out.begin(), out.end(), op) == out.end()) out.push_back(op);
  }
  return out;
}

Status RunCommBench(Communicator& comm, const CommBenchOptions& options, FILE* out) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> ops, ExpandBenchOps(options.ops));
  Bench bench{comm, options};
  if (options.algo != "auto") {
    if (auto a = ParseAllReduceAlgo(options.algo)) bench.allreduce_algo = *a;
    if (auto a = ParseAllGatherAlgo(options.algo)) bench.allgather_algo = *a;
    if (auto a = ParseBroadcastAlgo(options.algo)) bench.broadcast_algo = *a;
    if (!ParseAllReduceAlgo(options.algo) && !ParseAllGatherAlgo(options.algo) &&
        !ParseBroadcastAlgo(options.algo)) {
      return InvalidArgumentError("unknown --algo '" + options.algo + "'");
    }
  }
  const int n = comm.size();
  const int r = comm.rank();
  const bool print = r == 0 && out != nullptr;
  const size_t esize = DataTypeSize(options.dtype);
  int64_t total_wrong = 0;
  std::string json = "[";
  bool first_record = true;
  auto add_record = [&](const std::string& record) {
    json += (first_record ? "\n  " : ",\n  ") + record;
    first_record = false;
  };
  const std::string transport = n > 1 ? comm.TransportTo((r + 1) % n) : "self";
  const std::string transport_kind = transport.substr(0, transport.find(' '));

  if (print) {
    std::fprintf(
        out, "# tessera bench comm: np %d, transport %s, dtype %s, redop %s, %s%s\n", n,
        transport.c_str(), std::string(DataTypeName(options.dtype)).c_str(),
        std::string(ReduceOpName(options.redop)).c_str(),
        options.iters > 0 ? ("iters " + std::to_string(options.iters)).c_str() : "iters auto",
        options.label.empty() ? "" : (", " + options.label).c_str());
    PrintCopyMode(comm.copy_mode(), comm.options(), options.calibration_table, out);
  }
  if (options.baseline) {
    TESSERA_ASSIGN_OR_RETURN(RawBaseline b, MeasureRawBaseline(comm, size_t{512} << 20));
    if (print) {
      std::fprintf(out,
                   "# baseline: memcpy %.1f GB/s (1 thread), %.1f GB/s (2 threads); TCP loopback "
                   "%.2f GB/s one way (%.2f from and into %zu MiB buffers), %.2f GB/s per "
                   "direction both ways; cache-line round trip %.3f us\n",
                   b.memcpy_1t_gbps, b.memcpy_2t_gbps, b.tcp_one_way_gbps,
                   b.tcp_one_way_memory_gbps, kLargeTcpBufferBytes >> 20, b.tcp_both_ways_gbps,
                   b.cacheline_roundtrip_us);
    }
    char rec[512];
    std::snprintf(rec, sizeof(rec),
                  "{\"op\":\"baseline\",\"np\":%d,\"memcpy_1t_gbps\":%.3f,\"memcpy_2t_gbps\":%.3f,"
                  "\"tcp_one_way_gbps\":%.3f,\"tcp_both_ways_gbps\":%.3f,"
                  "\"tcp_one_way_memory_gbps\":%.3f,\"cacheline_roundtrip_us\":%.4f}",
                  n, b.memcpy_1t_gbps, b.memcpy_2t_gbps, b.tcp_one_way_gbps, b.tcp_both_ways_gbps,
                  b.tcp_one_way_memory_gbps, b.cacheline_roundtrip_us);
    add_record(rec);
  }

  // Buffers sized for the largest op.
  Buffers buffers;
  const size_t cap = options.max_bytes + 64;
  TESSERA_RETURN_IF_ERROR(buffers.Allocate(comm, cap, options.shared_buffers));
  if (options.check) buffers.expected.assign(cap, 0);
  comm.mutable_ledger().Reset();

  bool first_size = true;
  for (const std::string& op : ops) {
    if (print) {
      std::fprintf(out, "#\n# %s\n", op.c_str());
      std::fprintf(out, "# %12s %12s %5s %6s %14s %11s %9s %9s %7s\n", "size", "count", "type",
                   "redop", "algo", "time", "algbw", "busbw", "#wrong");
      std::fprintf(out, "# %12s %12s %5s %6s %14s %11s %9s %9s %7s\n", "(B)", "(elements)", "", "",
                   "", "(us)", "(GB/s)", "(GB/s)", "");
      std::fflush(out);  // a watcher may wait for it: every rank is past its start-up
    }
    for (size_t size = options.min_bytes; size <= options.max_bytes;
         size = std::max(size * options.step_factor, size + 1)) {
      const size_t count = CountFor(op, size, esize, n);
      if (count == 0) continue;
      if (op == "sendrecv" && n == 1) continue;
      const size_t bytes = BytesFor(op, count, esize, n);
      // Warm up in rounds of `warmup` iterations until the rounds took kMinWarmupNs
      // (every rank decides on the slowest rank's time, so all run the same rounds):
      // a size measured first after a few iterations alone read up to 1.8x slow. The
      // last round sizes the timed loop.
      int64_t warm_ns = 1, warm_total_ns = 0;
      do {
        TESSERA_RETURN_IF_ERROR(comm.Barrier());
        const int64_t round_start = NowNs();
        for (int i = 0; i < options.warmup; ++i) {
          TESSERA_RETURN_IF_ERROR(bench.RunOnce(op, count, buffers));
        }
        warm_ns = std::max<int64_t>(NowNs() - round_start, 1);
        TESSERA_RETURN_IF_ERROR(
            comm.AllReduce(&warm_ns, &warm_ns, 1, DataType::kI64, ReduceOp::kMax));
        warm_total_ns += warm_ns;
      } while (options.warmup > 0 && warm_total_ns < (first_size ? kFirstWarmupNs : kMinWarmupNs));
      first_size = false;
      int iters = options.iters;
      if (iters <= 0) {
        double per = static_cast<double>(warm_ns) / std::max(options.warmup, 1);
        iters = static_cast<int>(std::clamp(options.target_ms * 1e6 / per, 3.0, 10000.0));
      }
      TESSERA_RETURN_IF_ERROR(comm.Barrier());
      const int64_t start = NowNs();
      for (int i = 0; i < iters; ++i) {
        TESSERA_RETURN_IF_ERROR(bench.RunOnce(op, count, buffers));
      }
      int64_t elapsed = NowNs() - start;
      TESSERA_RETURN_IF_ERROR(
          comm.AllReduce(&elapsed, &elapsed, 1, DataType::kI64, ReduceOp::kMax));
      const double time_us = static_cast<double>(elapsed) * 1e-3 / iters;
      const double algbw = static_cast<double>(bytes) / (time_us * 1e-6) * 1e-9;
      const double busbw = algbw * BusBandwidthFactor(op, n);
      int64_t wrong = -1;
      if (options.check) {
        TESSERA_ASSIGN_OR_RETURN(size_t local_wrong, bench.Check(op, count, buffers));
        wrong = static_cast<int64_t>(local_wrong);
        TESSERA_RETURN_IF_ERROR(comm.AllReduce(&wrong, &wrong, 1, DataType::kI64, ReduceOp::kSum));
      }
      const std::string algo = bench.AlgoName(op, count);
      if (print) {
        std::fprintf(out, "  %12zu %12zu %5s %6s %14s %11.2f %9.2f %9.2f %7s\n", bytes, count,
                     std::string(DataTypeName(options.dtype)).c_str(),
                     std::string(ReduceOpName(options.redop)).c_str(), algo.c_str(), time_us, algbw,
                     busbw, wrong < 0 ? "N/A" : std::to_string(wrong).c_str());
        std::fflush(out);
      }
      char rec[512];
      std::snprintf(rec, sizeof(rec),
                    "{\"op\":\"%s\",\"algo\":\"%s\",\"transport\":\"%s\",\"np\":%d,"
                    "\"dtype\":\"%s\",\"bytes\":%zu,\"time_us\":%.3f,\"algbw_gbps\":%.4f,"
                    "\"busbw_gbps\":%.4f,\"wrong\":%" PRId64 ",\"shared_buffers\":%s}",
                    op.c_str(), algo.c_str(), JsonEscape(transport_kind).c_str(), n,
                    std::string(DataTypeName(options.dtype)).c_str(), bytes, time_us, algbw, busbw,
                    wrong < 0 ? int64_t{0} : wrong, options.shared_buffers ? "true" : "false");
      add_record(rec);
      if (wrong > 0) total_wrong += wrong;
      if (wrong > 0 && print) {
        std::fprintf(out, "# ERROR: %" PRId64 " wrong elements in %s of %zu bytes\n", wrong,
                     op.c_str(), bytes);
      }
    }
  }
  if (print) {
    std::fprintf(out, "#\n# ledger (rank 0, this run):\n");
    std::string ledger = comm.ledger().ToString();
    size_t pos = 0;
    while (pos < ledger.size()) {
      size_t end = ledger.find('\n', pos);
      std::fprintf(out, "#   %s\n", ledger.substr(pos, end - pos).c_str());
      pos = end == std::string::npos ? ledger.size() : end + 1;
    }
  }
  if (r == 0 && !options.json_path.empty()) {
    std::ofstream file(options.json_path);
    file << json << "\n]\n";
    if (!file) return InternalError("cannot write " + options.json_path);
  }
  TESSERA_RETURN_IF_ERROR(comm.Barrier());
  if (total_wrong > 0) {
    return InternalError(std::to_string(total_wrong) + " wrong elements (see the tables)");
  }
  return Status::Ok();
}

}  // namespace tessera::comm
