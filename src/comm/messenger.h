// Messenger: the message layer of one communicator. It frames tagged messages on
// each peer's Channel ({magic, tag, size} header, payload, padding to 8 bytes),
// matches them to posted receives (in order per peer and tag), delivers payloads
// by copy or by reduction straight out of the transport, and waits: spin while
// progress is likely, then sleep (futex for shared memory, poll for TCP), checking
// peer liveness, the deadline and Abort(). The first error poisons the messenger.
// Layer: comm; used by the communicator (communicator*.cc) and algorithms/. One
// thread drives a Messenger; only Abort() may be called from another thread.
//
// Defined by job: messenger.cc (construction, posting, a progress pass, failure),
// messenger_send.cc, messenger_recv.cc, messenger_single_copy.cc, messenger_wait.cc
// (with messenger_wait_loop.h) and messenger_mailbox.cc; the frames they exchange
// are in message_frame.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "comm/copy.h"
#include "comm/ledger.h"
#include "comm/message_ops.h"
#include "comm/rendezvous/store.h"
#include "comm/transport/channel.h"
#include "comm/transport/shm_segment.h"
#include "comm/types.h"
#include "comm/window_table.h"

namespace tessera::comm {

struct PeerInfo {
  std::string address;  // "10.0.0.7:41234" (TCP) or "shm"
  int pid = -1;         // same-host peers: their pid (liveness via pidfd)
  ShmControl* shm_control = nullptr;
  // The rank's two mailbox slots (its segment's), ours included; null without.
  ShmSlot* mailbox[2] = {nullptr, nullptr};
  // Single copy (same host): the peer can read our memory (process_vm_readv), so a
  // large collective message goes as a descriptor it reads straight from our buffer.
  bool reads_us = false;
  // In our segment: how many of our single-copy messages the peer has read.
  std::atomic<uint64_t>* copy_acks_from = nullptr;
  // In the peer's segment: how many of its single-copy messages we have read.
  std::atomic<uint64_t>* copy_acks_to = nullptr;
};

struct WaitOptions {
  int64_t spin_ns = 50'000;           // spin this long after the last progress
  bool yield_while_spinning = false;  // sched_yield() in the spin (oversubscribed)
  int64_t timeout_ms = 300'000;       // default deadline of every operation
  int64_t liveness_check_ms = 20;     // how often sleepers check that peers live
  // A peer in another process whose heartbeat stands still this long while we wait
  // on it is frozen: an error (0 = never). Our own heartbeat beats every
  // frozen_peer_ms / 10 (10-500 ms) on its own thread: in our shm control block for
  // same-host peers (ShmControl::heartbeat), and, when some peer is over TCP, as a
  // counter in the communicator's store ("heartbeat/<rank>", read by waiters at
  // most every frozen_peer_ms / 5) on a second thread, so that a slow store never
  // stalls the shm beat.
  int64_t frozen_peer_ms = 5'000;
  size_t unexpected_limit_bytes = size_t{64} << 20;
  // Sends that allow it (SendOp::Copy) of [single_copy_bytes, single_copy_max_bytes), to a peer
  // that reads us, go as single copy (0 = never). Point-to-point sends always stream: a single-copy
  // send completes only once the receiver has read it, which would take away the ring's buffering
  // that user code may rely on; and a reducing receive is better fed through the ring (the sender's
  // copy into it runs on the sender's core, in parallel with the receiver's reduction).
  size_t single_copy_bytes = 0;                              // CommOptions::shm_single_copy_bytes
  size_t single_copy_max_bytes = size_t{8} << 20;            // larger ones stream
  size_t single_copy_allreduce_max_bytes = size_t{1} << 20;  // ... within an all-reduce
  // A message of at least this many bytes from one of our shared buffers goes as a
  // descriptor to a same-host peer (WindowTable); smaller ones stream. 0 = never.
  size_t window_copy_bytes = size_t{64} << 10;
  // Copying receives and local blocks of at least this many bytes store past the cache
  // (CopyBypassingCache); 0 = never.
  size_t bypass_cache_bytes = size_t{8} << 20;
};

class Messenger {
 public:
  // channels[r] is null for r == rank. `self_control` (may be null) is our shm
  // control block (sleep/wake, failure flag). `failure_store` (may be null)
  // records why we failed and tells us why peers failed.
  Messenger(int rank, int size, std::vector<std::unique_ptr<Channel>> channels,
            std::vector<PeerInfo> peers, ShmControl* self_control, WaitOptions options,
            Store* failure_store);
  ~Messenger();

  int rank() const { return rank_; }
  // Whether a message of `bytes` is copied past the cache (WaitOptions).
  bool BypassesCache(size_t bytes) const {
    return options_.bypass_cache_bytes > 0 && bytes >= options_.bypass_cache_bytes;
  }
  // A collective's local block (this rank's own share): memcpy, or past the cache
  // when it is as large as BypassesCache says. `whole` is the block's size when
  // these bytes are one piece of it (the choice is the block's, not the piece's).
  void CopyLocal(void* dst, const void* src, size_t bytes, size_t whole = 0) const {
    if (BypassesCache(std::max(bytes, whole))) {
      CopyBypassingCache(dst, src, bytes);
    } else if (bytes > 0) {
      std::memcpy(dst, src, bytes);
    }
  }
  int size() const { return size_; }
  const WaitOptions& options() const { return options_; }
  void set_timeout_ms(int64_t ms) { options_.timeout_ms = ms; }
  void set_spin_ns(int64_t ns) { options_.spin_ns = current_spin_ns_ = ns; }
  // Single copy for messages of [min_bytes, max_bytes) (min 0 = never): set by the
  // communicator once the copy mode is resolved, and switched by the calibration
  // between its streamed and single-copy samples. Applies to sends posted later.
  void set_single_copy_window(size_t min_bytes, size_t max_bytes) {
    options_.single_copy_bytes = min_bytes;
    options_.single_copy_max_bytes = max_bytes;
  }
  // The spin budget now in use: options().spin_ns, or when oversubscribed
  // (yield_while_spinning) adapting between 2 µs and it.
  int64_t current_spin_ns() const { return current_spin_ns_; }
  bool any_tcp() const { return any_tcp_; }
  // See Communicator::SetWaitWork.
  void set_wait_work(std::function<bool()> work) { wait_work_ = std::move(work); }

  // Starts a primitive: sets the deadline (now + timeout) and the ledger entry
  // that bytes are charged to. Fails if the messenger is poisoned or aborted.
  Status Begin(Primitive primitive, bool count_call = true);
  Primitive current_primitive() const { return primitive_; }

  // Posting never blocks; ops must stay alive until done (or the messenger fails).
  void PostSend(SendOp* op);
  void PostRecv(RecvOp* op);
  // Drives all peers until every op is done. On any error: poisons and returns it.
  Status WaitAll(std::span<Op* const> ops);
  Status WaitAll(std::initializer_list<Op*> ops) {
    return WaitAll(std::span<Op* const>(ops.begin(), ops.size()));
  }
  // Waits until `done()` says true — an operation that runs outside the messenger
  // (MPI's own collectives) — under the messenger's deadline, abort and
  // frozen-peer checks, every peer counting as waited on. On any error: poisons
  // and returns it.
  Status WaitExternal(const std::function<Result<bool>()>& done);
  // One nonblocking pass (Progress); true when every op is done. On any error:
  // poisons and returns it.
  Result<bool> Test(std::span<Op* const> ops);
  // One nonblocking pass over every peer, so posted sends start (a single-copy
  // descriptor goes out, a ring fills) before the caller does local work. On any
  // error: poisons and returns it.
  Status Progress();

  // The mailbox: a one-shot exchange through shared memory, there when every
  // rank is on this host (every PeerInfo has its slots). Exchange number s: each
  // rank fills its slot s % 2 (MailboxSlot()), publishes it and waits for all the
  // others' (MailboxExchange), then reads them in place. A slot is not rewritten
  // while a peer may still read it: a rank starts exchange s + 2 only after every
  // peer published s + 1, which each did only after it finished reading s. Every
  // rank must make the same sequence of exchanges.
  size_t mailbox_bytes() const { return mailbox_bytes_; }
  void EnableMailbox(size_t bytes);
  // Our slot of the next exchange (mailbox_bytes() long).
  uint8_t* MailboxSlot();
  // Publishes our slot, counts `bytes` to and from each peer in the ledger, waits
  // until every peer published the same exchange; slots[p] = rank p's data (ours
  // at slots[rank]), valid until our next exchange.
  Status MailboxExchange(size_t bytes, std::span<const void*> slots);

  // Thread-safe: makes current and future waits fail with Aborted.
  void Abort(const std::string& reason);
  bool poisoned() const { return !poison_.ok(); }
  const Status& poison_status() const { return poison_; }
  // Records `status` as fatal (used by the communicator for local errors too).
  Status Poison(Status status);

  Ledger& ledger() { return ledger_; }
  std::string DescribePeer(int peer) const;

  // Our shared buffers; the communicator adds and removes them.
  const std::shared_ptr<WindowTable>& windows() const { return windows_; }
  // Messages sent so far as shared-buffer descriptors (read in place by the peer).
  uint64_t in_place_sends() const { return in_place_sends_; }
  // Peer `peer`'s shared buffer `id` as mapped here (read only), `bytes` long; its
  // descriptors name bytes inside it. The mapping must outlive the messenger.
  void AddPeerWindow(int peer, uint64_t id, const uint8_t* base, size_t bytes);

 private:
  struct Unexpected {
    int32_t tag = 0;
    uint64_t size = 0;
    std::vector<uint8_t> data;
    bool complete = false;
    RecvOp* waiting = nullptr;
    bool delivered = false;  // handed to its receive; popped once it reaches the front
  };
  struct PeerState {
    std::deque<SendOp*> sends;
    std::deque<RecvOp*> recvs;
    std::deque<Unexpected> unexpected;
    // Outgoing head message.
    uint8_t out_header[32];
    // Single-copy sends written as descriptors, waiting for the peer's read.
    std::deque<SendOp*> copy_sends;
    uint64_t copy_sent = 0;  // descriptors written
    uint64_t copy_read = 0;  // the peer's descriptors we have read
    bool in_copy = false;    // the incoming message is a descriptor
    uint64_t in_copy_addr = 0;
    const uint8_t* in_copy_src = nullptr;  // ... of bytes in a mapped shared buffer
    struct Window {
      uint64_t id;
      const uint8_t* base;
      size_t bytes;
    };
    std::vector<Window> windows;  // the peer's shared buffers, as mapped here
    // Incoming message.
    enum class In { kHeader, kParked, kPayload, kPad } in = In::kHeader;
    uint8_t in_header[32];
    size_t in_header_have = 0;
    int32_t in_tag = 0;
    uint64_t in_size = 0;
    uint64_t in_done = 0;
    size_t in_pad = 0;
    RecvOp* in_op = nullptr;
    Unexpected* in_unexpected = nullptr;
    UniqueFd pidfd;
    uint64_t seen_heartbeat = 0;    // the peer's count when it last changed
    int64_t heartbeat_seen_ns = 0;  // when we saw it change (0: not yet)
    int64_t heartbeat_read_ns = 0;  // TCP peers: when we last read it from the store
    bool active() const {
      return !sends.empty() || !copy_sends.empty() || !recvs.empty() || in != In::kHeader ||
             in_header_have > 0 ||
             (!unexpected.empty() &&
              (!unexpected.back().complete ||
               std::any_of(unexpected.begin(), unexpected.end(),
                           [](const Unexpected& u) { return u.waiting != nullptr; })));
    }
  };

  struct PollResult {
    bool done = false;
    bool progressed = false;
  };
  // The waiting loop of WaitAll and MailboxExchange (messenger_wait_loop.h): poll()
  // until it reports done, spinning while progress is likely, then sleeping; checks
  // abort, the deadline and peer liveness.
  template <typename Poll>
  Status WaitLoop(Poll&& poll, std::span<Op* const> ops);
  Result<bool> ProgressPeer(int peer);
  // The peer has not yet published the exchange we wait for.
  bool MailboxPending(int peer) const {
    return mailbox_waiting_ != 0 && peers_[peer].mailbox[mailbox_waiting_ & 1]->seq.load(
                                        std::memory_order_acquire) < mailbox_waiting_;
  }
  Result<bool> ProgressSends(int peer, PeerState& ps);
  // Copies the payload bytes that stream positions [from, to) of `op` carried to op.tee.
  void TeePayload(const SendOp& op, size_t from, size_t to) const;
  // Completes single-copy sends the peer has read.
  bool CompleteCopies(int peer, PeerState& ps);
  // Copies `size` bytes at `addr` in the peer's address space into `dst`.
  Status ReadPeerMemory(int peer, void* dst, uint64_t addr, size_t size);
  // Where `size` bytes at `offset` of the peer's shared buffer `id` are mapped here;
  // an error when it shared no such buffer or they do not lie inside it.
  Result<const uint8_t*> PeerWindowBytes(const PeerState& ps, uint64_t id, uint64_t offset,
                                         uint64_t size) const;
  // Delivers every completed buffered message whose receive is posted, in any
  // order (a later tag's receive need not wait for an earlier tag's).
  Status DeliverBuffered(int peer, PeerState& ps);
  Result<bool> ProgressRecvs(int peer, PeerState& ps);
  Status MatchParked(int peer, PeerState& ps);
  Status Deliver(int peer, RecvOp* op, const uint8_t* data, size_t size);
  // A reducing receive's bytes [offset, offset + bytes) from `in`:
  // data = op(reduce_base or data, in), whole elements.
  void ReduceIntoOp(RecvOp* op, uint64_t offset, const uint8_t* in, size_t bytes);
  // The error every call gets once the messenger is poisoned.
  Status PoisonedError() const;
  Status PeerError(int peer, const Status& cause);
  Status CheckLiveness();
  // The peer's heartbeat has stood still for frozen_peer_ms while we watched.
  bool PeerFrozen(int peer, int64_t now_ns);
  // Whether heartbeat `beat` of `peer` has stood still for frozen_peer_ms while
  // the peer was waited on (state in PeerState).
  bool HeartbeatStill(int peer, uint64_t beat, int64_t now_ns);
  void RunStoreHeartbeat();
  void RunHeartbeat();
  void Sleep(int64_t max_us);
  bool AnyShm() const { return self_control_ != nullptr; }
  std::string PendingSummary(std::span<Op* const> ops) const;

  const int rank_;
  const int size_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<PeerInfo> peers_;
  std::vector<PeerState> state_;
  ShmControl* self_control_;
  WaitOptions options_;
  Store* failure_store_;
  Ledger ledger_;
  Primitive primitive_ = Primitive::kBarrier;
  Deadline deadline_ = Deadline::Never();
  int64_t op_start_ns_ = 0;
  int64_t last_liveness_ns_ = 0;
  // Adaptive spin (oversubscribed only): doubled when a wait ends while spinning,
  // halved when the wait had to sleep anyway (the spin was wasted CPU, and sleeping
  // at once also earns the scheduler's wake-up preference).
  int64_t current_spin_ns_ = 0;
  std::function<bool()> wait_work_;  // Communicator::SetWaitWork
  // The heartbeat thread (self_control_ and frozen_peer_ms > 0), stopped by the
  // destructor.
  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_cv_;
  bool heartbeat_stop_ = false;
  std::thread heartbeat_thread_;
  std::thread store_heartbeat_thread_;  // any_tcp_ with a failure store
  size_t unexpected_bytes_ = 0;
  Status poison_;
  std::atomic<bool> aborted_{false};
  std::mutex abort_mutex_;
  std::string abort_reason_;
  UniqueFd abort_event_;  // eventfd: wakes poll() sleepers on Abort
  bool any_tcp_ = false;
  bool external_wait_ = false;         // inside WaitExternal
  std::vector<uint8_t> copy_scratch_;  // single-copy reads into a reducing receive
  std::shared_ptr<WindowTable> windows_ = std::make_shared<WindowTable>();
  uint64_t in_place_sends_ = 0;
  size_t mailbox_bytes_ = 0;
  uint64_t mailbox_seq_ = 0;      // exchanges started
  uint64_t mailbox_waiting_ = 0;  // the exchange being waited for (0 = none)
  int mailbox_arrived_ = 0;       // ranks that published it (ourselves included)
};

}  // namespace tessera::comm
