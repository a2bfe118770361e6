// MpiChannel: the byte stream to a peer carried by MPI point-to-point messages,
// so that a cluster's own MPI (its RDMA fabric, its tuned transports) moves
// tessera's bytes. Each Write becomes one MPI_Isend of a copy of the accepted bytes
// (at most kMaxMessageBytes, at most kMaxInFlightBytes outstanding per channel:
// back-pressure as a full ring gives); the reader takes messages with
// MPI_Improbe/MPI_Mrecv, straight into the caller's buffer when one fits. The
// messenger frames its messages on top exactly as over shm or TCP: same ledger,
// same deadlines, same error reporting. MPI arrivals cannot wake poll(2), so a
// waiting rank naps briefly (WakesPoll() is false).
//
// A stream is (peer's MPI world rank, tag) on a duplicate of MPI_COMM_WORLD; the
// receiver picks the tag (from AllocateMpiTags: a block of its own, one tag per
// sending rank), so communicators and their sub-groups never mix their bytes, even
// when several tessera ranks share one MPI process (ranks as threads in tests).
//
// MPI is initialised once per process (MpiRuntime below: the one process-wide
// object in comm, because MPI_Init is). Every MPI call is made under its mutex, so
// MPI_THREAD_SERIALIZED is enough and communicators driven by different threads
// stay safe. Layer: comm. An MpiChannel is driven by one thread at a time.
//
// Built only when CMake finds MPI (TESSERA_HAVE_MPI); otherwise InitMpi() says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/transport/channel.h"

namespace tessera::comm {

// Whether this build has the MPI transport.
bool MpiBuilt();
// Initialises MPI for this process (idempotent, thread-safe): under mpirun/srun
// the launcher's world, alone a singleton world of one. Registers the shutdown
// at exit (ShutdownMpi(0)).
Status InitMpi();
// Whether InitMpi has succeeded (and ShutdownMpi not yet run).
bool MpiActive();
int MpiWorldRank();
int MpiWorldSize();
// The first of `count` consecutive tags no other stream into this process uses.
int AllocateMpiTags(int count);
// MPI_Bcast of a string from `root` (collective over the MPI world; ranks other
// than the root pass anything). Used to bootstrap the rendezvous store.
Result<std::string> MpiBroadcastString(const std::string& value, int root);
// Ends MPI: MPI_Finalize when `exit_code` is 0; otherwise MPI_Abort with it, so
// that a failed rank ends the whole MPI job at once instead of leaving its peers
// in MPI_Finalize's fence. A no-op when MPI is not active. Call it before exit.
void ShutdownMpi(int exit_code);

// MPI's own collectives over a tessera communicator whose every pair is on MPI
// (CommOptions::mpi_collectives): an MPI communicator of the same ranks in the
// same order, and one nonblocking collective at a time, started and then tested
// (so tessera's deadline, abort and frozen-peer checks keep running beside it).
// Only data-moving collectives: their bytes are the same whoever moves them.
class MpiGroup {
 public:
  // Collective over the members (each passes the same world ranks, in tessera
  // rank order; no world rank twice).
  static Result<std::unique_ptr<MpiGroup>> Create(const std::vector<int>& world_ranks);
  ~MpiGroup();
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  // `recv` holds one block of `block_bytes` per rank; `send` may be our block of it.
  Status StartAllGather(const void* send, void* recv, size_t block_bytes);
  // Byte counts and offsets per rank.
  Status StartAllToAllv(const void* send, std::span<const size_t> send_bytes,
                        std::span<const size_t> send_offsets, void* recv,
                        std::span<const size_t> recv_bytes, std::span<const size_t> recv_offsets);
  // Whether the started collective has completed.
  Result<bool> Test();

 private:
  struct State;
  explicit MpiGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

#ifdef TESSERA_HAVE_MPI
class MpiChannel : public Channel {
 public:
  static constexpr size_t kMaxMessageBytes = size_t{1} << 20;
  static constexpr size_t kMaxInFlightBytes = size_t{8} << 20;

  // Sends to `peer_world_rank` with `send_tag` (the peer's receive tag); receives
  // from it with `recv_tag` (ours, from AllocateMpiTags).
  MpiChannel(int peer_world_rank, int send_tag, int recv_tag);
  ~MpiChannel() override;

  Result<size_t> Write(const void* data, size_t size) override;
  Result<std::span<const uint8_t>> Peek() override;
  void Consume(size_t size) override;
  Result<size_t> ReadInto(void* dst, size_t size, bool bypass_cache) override;
  bool HasRoom() const override;
  bool WakesPoll() const override { return false; }
  std::string Describe() const override;

  // One MPI_Isend and its bytes (public for the runtime, which keeps those of
  // channels destroyed before their peer took them).
  struct PendingSend;

 private:
  // Completes finished sends; an MPI error is the channel's error.
  Status ReapSends() const;
  // Receives the next message, if one has arrived, behind the staged bytes.
  Result<bool> ReceiveIntoStaging();
  size_t staged() const { return staging_.size() - staging_begin_; }

  int peer_;
  int send_tag_;
  int recv_tag_;
  mutable std::deque<std::unique_ptr<PendingSend>> sends_;
  // Buffers of completed sends, reused: a fresh megabyte would cost its page faults
  // (~1 ms on a VM) on every Write.
  mutable std::vector<std::unique_ptr<PendingSend>> spare_sends_;
  mutable size_t in_flight_bytes_ = 0;
  mutable Status send_error_;
  std::vector<uint8_t> staging_;  // received bytes; [staging_begin_, size()) unread
  size_t staging_begin_ = 0;
  uint64_t received_ = 0;  // stream bytes taken out of MPI
};
#endif

}  // namespace tessera::comm
