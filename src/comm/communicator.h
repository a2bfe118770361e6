// Communicator: a group of ranks and the collectives between them (tessera's
// MPI_Comm / ProcessGroup). Create() rendezvouses through a Store, connects each
// pair by shared memory (same host) or TCP (otherwise, or when forced), and
// Split() carves sub-groups (TP/PP/EP/DP) out of it.
//
// Every operation takes its deadline from options().timeout_ms. Failure policy:
// the first error — a dead or misbehaving peer, a timeout, Abort() — POISONS the
// communicator: that operation and every later one return an error (the later
// ones say "unusable after an earlier error: …"); peers waiting on this rank are
// woken and fail too, naming it. A poisoned communicator cannot be repaired:
// destroy it and create a new one. Errors name the peer ("rank 3 (10.0.0.7:41234)
// closed the connection during all_reduce after 2.1 s").
//
// Layer: comm. Thread safety: one thread at a time calls a communicator's
// operations; Abort() may be called from any thread at any time.
//
// Defined by job: communicator.cc (Create, Split, accessors), communicator_connect.cc,
// communicator_point_to_point.cc, communicator_collectives.cc and
// communicator_shared_buffer.cc (AllocateShared), communicator_calibration.cc (the
// same-host copy mode: calibration at first use).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/calibration.h"
#include "comm/ledger.h"
#include "comm/messenger.h"
#include "comm/options.h"
#include "comm/rendezvous/store.h"
#include "comm/shared_buffer.h"
#include "comm/transport/shm_segment.h"
#include "comm/types.h"

namespace tessera::comm {

class Communicator;
class MpiGroup;

// A pending Isend/Irecv. Wait() (or Communicator::Wait) completes it; destroying
// an unfinished request poisons nothing but must not outlive its communicator.
class Request {
 public:
  Request() = default;
  Request(Request&& other) noexcept = default;
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      ForgetSelfReceive();
      comm_ = other.comm_;
      send_ = std::move(other.send_);
      recv_ = std::move(other.recv_);
      other.comm_ = nullptr;
    }
    return *this;
  }
  ~Request() { ForgetSelfReceive(); }
  bool valid() const { return comm_ != nullptr; }
  // Bytes received (Irecv) once complete.
  size_t received_bytes() const { return recv_ ? recv_->received : 0; }
  Status Wait();
  Result<bool> Test();

 private:
  friend class Communicator;
  // An unmatched receive from its own rank is withdrawn when the request goes.
  void ForgetSelfReceive();
  Communicator* comm_ = nullptr;
  std::unique_ptr<SendOp> send_;
  std::unique_ptr<RecvOp> recv_;
};

class Communicator {
 public:
  // Joins the group of `size` ranks that all call Create with the same `comm_id`
  // and a store they share. Blocks until every pair is connected (or the deadline).
  static Result<std::unique_ptr<Communicator>> Create(std::shared_ptr<Store> store, int rank,
                                                      int size, CommOptions options,
                                                      std::string comm_id = "world");
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& id() const { return id_; }
  const CommOptions& options() const { return options_; }
  void set_timeout_ms(int64_t timeout_ms);
  // "shm" / "tcp 10.0.0.7:41234 (x4)" / "self" for each peer.
  std::string TransportTo(int peer) const;
  // Whether some peer is reached over TCP (on another host, or TCP was forced).
  bool AnyTcpPeer() const { return messenger_->any_tcp(); }
  // The single-copy window in force for same-host peers and where it came from
  // (env, calibrated, cached or default), with the calibration behind it.
  const CopyModeReport& copy_mode() const { return copy_mode_; }

  // Collective: every rank calls it. Ranks with the same `color` form a new
  // communicator, ordered by (key, old rank); color < 0 joins none (returns null).
  Result<std::unique_ptr<Communicator>> Split(int color, int key);

  // --- point to point (user tags >= 0) ---
  // A rank may send to itself: the message is copied at once (the send completes
  // immediately, like MPI's buffered mode) and matched, by tag in order, by a
  // receive from itself posted before or after. Waiting on a receive from itself
  // that no send has matched is an error (nothing else could ever send it).
  Status Send(const void* data, size_t bytes, int peer, int tag);
  // Receives at most `bytes`; *received_bytes (optional) gets the message size.
  Status Recv(void* data, size_t bytes, int peer, int tag, size_t* received_bytes = nullptr);
  Result<Request> Isend(const void* data, size_t bytes, int peer, int tag);
  Result<Request> Irecv(void* data, size_t bytes, int peer, int tag);
  Status Wait(Request& request);
  Status WaitAll(std::span<Request> requests);

  // --- collectives. `count` is in elements; send == recv means in place. ---
  Status Broadcast(void* buffer, size_t count, DataType dtype, int root,
                   BroadcastAlgo algo = BroadcastAlgo::kAuto);
  // recv is used on the root only (may be null elsewhere).
  Status Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root);
  Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   AllReduceAlgo algo = AllReduceAlgo::kAuto);
  // recv (root) holds size() blocks of count; send == recv + root*count*esize is in place.
  Status Gather(const void* send, void* recv, size_t count, DataType dtype, int root);
  // send (root) holds size() blocks of count.
  Status Scatter(const void* send, void* recv, size_t count, DataType dtype, int root);
  // recv holds size() blocks of count; send == recv + rank*count*esize is in place.
  Status AllGather(const void* send, void* recv, size_t count, DataType dtype,
                   AllGatherAlgo algo = AllGatherAlgo::kAuto);
  // send holds size() blocks of count; recv gets the reduced block rank().
  // recv == send + rank*count*esize is in place. kDeterministic: the bits of the
  // deterministic all-reduce's block rank() (options.h); kAuto is the ring.
  Status ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       ReduceScatterAlgo algo = ReduceScatterAlgo::kAuto);
  // send and recv hold size() blocks of count (block p goes to / came from rank p).
  Status AllToAll(const void* send, void* recv, size_t count, DataType dtype);
  // Per-peer element counts and displacements (in elements), MPI_Alltoallv style.
  // Every rank's send_counts[p] must equal rank p's recv_counts[rank].
  Status AllToAllv(const void* send, std::span<const size_t> send_counts,
                   std::span<const size_t> send_displs, void* recv,
                   std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                   DataType dtype);
  Status Barrier();

  // Collective: every rank calls it, in the same order relative to other collectives.
  // Returns `bytes` of this rank's memory that every same-host peer maps (see
  // shared_buffer.h): collectives whose buffers lie in it skip the copy through the
  // ring. An error on any rank (no room in /dev/shm, …) is an error on all.
  Result<SharedBuffer> AllocateShared(size_t bytes);
  // Messages this rank has sent as shared-buffer descriptors so far.
  uint64_t InPlaceSends() const { return messenger_->in_place_sends(); }

  // Thread-safe: makes the current and every later operation fail with Aborted
  // and wakes peers (which then fail naming this rank).
  void Abort(const std::string& reason = "");
  bool poisoned() const { return messenger_->poisoned(); }

  // Work for this thread while an operation waits on its peers, instead of spinning
  // (the inference engine warms the next layer's weights during a tensor-parallel all-reduce).
  // Each call does one short step and returns whether any is left; it runs only
  // between polls that found nothing new, so it delays a completion by one step at
  // most, and never runs once the operation is done. Kept until replaced; {} clears.
  void SetWaitWork(std::function<bool()> work) { messenger_->set_wait_work(std::move(work)); }

  const Ledger& ledger() const { return messenger_->ledger(); }
  Ledger& mutable_ledger() { return messenger_->ledger(); }

  // The algorithm the automatic choice picks (for benchmarks' tables).
  AllReduceAlgo ChooseAllReduce(size_t bytes, AllReduceAlgo requested) const;
  // Whether kDeterministic runs as recursive doubling (power-of-two group, not
  // f16/bf16, at most allreduce_small_bytes): the same bits, fewer rounds.
  bool DeterministicUsesRecursiveDoubling(size_t bytes, DataType dtype) const;
  // Whether a message of `bytes` can go one-shot (every rank on this host, and it
  // fits the mailbox).
  bool OneShotFits(size_t bytes) const;
  AllGatherAlgo ChooseAllGather(size_t bytes_per_rank, AllGatherAlgo requested) const;
  BroadcastAlgo ChooseBroadcast(size_t bytes, BroadcastAlgo requested) const;
  // Whether MPI's own collective `which` serves this communicator
  // (CommOptions::mpi_collectives, every pair on MPI).
  bool UsesMpi(MpiCollective which) const;

 private:
  friend class Request;
  Communicator() = default;
  Status Connect(Store& store);
  // Which same-host peers can read our memory (process_vm_readv) and whose memory we
  // can read, by probing; [rank], false for peers not on shared memory.
  struct SingleCopyProbe {
    std::vector<bool> reads_us;
    std::vector<bool> we_read;
  };
  Result<SingleCopyProbe> ProbeSingleCopy(Store& store, const std::vector<bool>& use_shm,
                                          const std::vector<int>& pids, const Deadline& deadline);
  // After the messenger is built: the same-host ranks agree on the single-copy
  // window (the lowest decides: its cache, or a measurement with the next one) and
  // each applies it unless its own environment set one (communicator_calibration.cc).
  Status ResolveCopyMode(Store& store, const std::vector<bool>& use_shm,
                         const SingleCopyProbe& probe, const std::vector<int>& pids,
                         const Deadline& deadline);
  // The lowest same-host rank's side: its decision, and the plan it publishes for
  // `partner` ("none", or the measurement's schedule, which it then runs with it).
  Result<CopyModeReport> DecideCopyModeAsLeader(Store& store, const std::string& key, int partner,
                                                const SingleCopyProbe& probe,
                                                const std::vector<int>& pids);
  int32_t NextTag();
  Status CheckPeer(int peer, const char* what) const;
  Status Fail(Status status) { return messenger_->Poison(std::move(status)); }
  // Runs an MPI collective begun by `start` to its end under the messenger's
  // deadline and checks, and charges the ledger what tessera's algorithm would
  // have moved (the same bytes arrive).
  Status RunOnMpi(const std::function<Status()>& start, uint64_t bytes_sent,
                  uint64_t bytes_received);
  // All-to-all(v) by MPI_Ialltoallv, in bytes.
  Status AllToAllvOnMpi(const void* send, std::span<const size_t> send_bytes,
                        std::span<const size_t> send_offsets, void* recv,
                        std::span<const size_t> recv_bytes, std::span<const size_t> recv_offsets);

  std::shared_ptr<Store> store_;
  std::unique_ptr<Store> prefix_store_;
  int rank_ = 0;
  int size_ = 1;
  std::string id_;
  CommOptions options_;
  std::vector<ShmSegment> segments_;  // [rank]: ours and same-host peers'
  std::string shm_prefix_;            // "/tessera-<job>-<comm hash>"
  uint64_t shared_buffers_ = 0;       // AllocateShared calls so far
  // Same-host peers' shared buffers, mapped read only; declared before messenger_ so
  // they outlive it.
  std::vector<MappedRegion> peer_windows_;
  std::unique_ptr<Messenger> messenger_;
  // MPI's own collectives (CommOptions::mpi_collectives) when every pair is on MPI.
  std::unique_ptr<MpiGroup> mpi_group_;
  std::vector<std::string> transport_names_;
  CopyModeReport copy_mode_;
  std::vector<uint8_t> scratch_;
  // Loopback: messages this rank sent itself, and its unmatched receives from itself.
  struct SelfMessage {
    int tag;
    std::vector<uint8_t> bytes;
  };
  std::deque<SelfMessage> self_messages_;
  std::deque<RecvOp*> self_recvs_;
  Status SendToSelf(SendOp* op);
  Status ReceiveFromSelf(RecvOp* op);
  uint32_t collective_seq_ = 0;
  uint32_t split_seq_ = 0;
};

}  // namespace tessera::comm
