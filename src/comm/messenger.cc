// Messenger (messenger.h): construction, posting, one progress pass over a peer
// (its sends, buffered messages and receives), and failure: Abort, poisoning and
// the errors that name a peer. Sends are in messenger_send.cc, receives in
// messenger_recv.cc, single copy in messenger_single_copy.cc, waiting in
// messenger_wait.cc and the mailbox in messenger_mailbox.cc.
#include "comm/messenger.h"

#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/log.h"

namespace tessera::comm {
namespace {

std::string Seconds(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(ns) * 1e-9);
  return buf;
}

int OpenPidfd(int pid) {
  if (pid <= 0) return -1;
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

}  // namespace

Messenger::Messenger(int rank, int size, std::vector<std::unique_ptr<Channel>> channels,
                     std::vector<PeerInfo> peers, ShmControl* self_control, WaitOptions options,
                     Store* failure_store)
    : rank_(rank),
      size_(size),
      channels_(std::move(channels)),
      peers_(std::move(peers)),
      state_(static_cast<size_t>(size)),
      self_control_(self_control),
      options_(options),
      failure_store_(failure_store),
      current_spin_ns_(options.spin_ns),
      abort_event_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  TESSERA_CHECK_EQ(channels_.size(), static_cast<size_t>(size));
  TESSERA_CHECK_EQ(peers_.size(), static_cast<size_t>(size));
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (peers_[p].shm_control != nullptr && peers_[p].pid != static_cast<int>(::getpid())) {
      state_[p].pidfd.Reset(OpenPidfd(peers_[p].pid));
    }
    if (peers_[p].shm_control == nullptr) any_tcp_ = true;
  }
  if (self_control_ != nullptr && options_.frozen_peer_ms > 0) {
    heartbeat_thread_ = std::thread([this] { RunHeartbeat(); });
  }
  if (any_tcp_ && failure_store_ != nullptr && options_.frozen_peer_ms > 0) {
    store_heartbeat_thread_ = std::thread([this] { RunStoreHeartbeat(); });
  }
}

Messenger::~Messenger() {
  {
    std::lock_guard lock(heartbeat_mutex_);
    heartbeat_stop_ = true;
  }
  heartbeat_cv_.notify_all();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (store_heartbeat_thread_.joinable()) store_heartbeat_thread_.join();
}

void Messenger::RunHeartbeat() {
  const auto period =
      std::chrono::milliseconds(std::clamp<int64_t>(options_.frozen_peer_ms / 10, 10, 500));
  std::unique_lock lock(heartbeat_mutex_);
  while (!heartbeat_cv_.wait_for(lock, period, [this] { return heartbeat_stop_; })) {
    self_control_->heartbeat.fetch_add(1, std::memory_order_relaxed);
  }
}

void Messenger::RunStoreHeartbeat() {
  const auto period =
      std::chrono::milliseconds(std::clamp<int64_t>(options_.frozen_peer_ms / 10, 10, 500));
  const std::string key = "heartbeat/" + std::to_string(rank_);
  std::unique_lock lock(heartbeat_mutex_);
  while (!heartbeat_cv_.wait_for(lock, period, [this] { return heartbeat_stop_; })) {
    lock.unlock();
    (void)failure_store_->Add(key, 1);  // a store in trouble fails the job by other ways
    lock.lock();
  }
}

std::string Messenger::DescribePeer(int peer) const {
  std::string text = "rank " + std::to_string(peer);
  if (peer < 0 || peer >= size_ || peer == rank_) return text;
  const PeerInfo& info = peers_[peer];
  if (info.shm_control != nullptr) {
    text += " (shm, pid " + std::to_string(info.pid) + ")";
  } else {
    text += " (" + info.address + ")";
  }
  return text;
}

Status Messenger::Begin(Primitive primitive, bool count_call) {
  if (!poison_.ok()) {
    return PoisonedError();
  }
  if (aborted_.load()) {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    return Poison(AbortedError("communicator aborted: " + abort_reason_));
  }
  primitive_ = primitive;
  if (count_call) ledger_.mutable_entry(primitive).calls++;
  op_start_ns_ = NowNs();
  deadline_ = options_.timeout_ms <= 0 ? Deadline::Never() : Deadline::AfterMs(options_.timeout_ms);
  return Status::Ok();
}

void Messenger::PostSend(SendOp* op) {
  TESSERA_CHECK(op->peer >= 0 && op->peer < size_ && op->peer != rank_) << op->peer;
  op->done = false;
  op->progress = 0;
  op->primitive = primitive_;
  state_[op->peer].sends.push_back(op);
}

void Messenger::PostRecv(RecvOp* op) {
  TESSERA_CHECK(op->peer >= 0 && op->peer < size_ && op->peer != rank_) << op->peer;
  op->done = false;
  op->received = 0;
  op->primitive = primitive_;
  PeerState& ps = state_[op->peer];
  // An earlier message with this tag that arrived before its receive was posted.
  for (Unexpected& u : ps.unexpected) {
    if (u.tag == op->tag && u.waiting == nullptr && !u.delivered) {
      u.waiting = op;
      return;
    }
  }
  ps.recvs.push_back(op);
}

void Messenger::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "Abort() called" : reason;
  }
  aborted_.store(true);
  if (self_control_ != nullptr) {
    self_control_->doorbell.fetch_add(1);
    FutexWake(&self_control_->doorbell);
  }
  uint64_t one = 1;
  if (abort_event_.valid()) (void)!::write(abort_event_.get(), &one, sizeof(one));
}

Status Messenger::PoisonedError() const {
  return Status(poison_.code(),
                "communicator unusable after an earlier error: " + poison_.message());
}

Status Messenger::Poison(Status status) {
  if (!poison_.ok()) return status;
  poison_ = status;
  std::string text = DescribePeer(rank_) + ": " + status.ToString();
  if (self_control_ != nullptr) {
    std::snprintf(self_control_->failure, sizeof(self_control_->failure), "%s", text.c_str());
    self_control_->failed.store(1, std::memory_order_release);
  }
  if (failure_store_ != nullptr) {
    (void)failure_store_->SetString("failed/" + std::to_string(rank_), text);
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (peers_[p].shm_control != nullptr) {
      peers_[p].shm_control->doorbell.fetch_add(1);
      FutexWake(&peers_[p].shm_control->doorbell);
    }
    channels_[p]->Shutdown();
  }
  TLOG_DEBUG("comm", "poisoned: %s", status.ToString().c_str());
  return status;
}

Status Messenger::PeerError(int peer, const Status& cause) {
  std::string text = DescribePeer(peer) + " " + cause.message() + " during " +
                     std::string(PrimitiveName(primitive_)) + " after " +
                     Seconds(NowNs() - op_start_ns_);
  // If the peer failed first, say why (it recorded the reason).
  std::string reason;
  if (peers_[peer].shm_control != nullptr &&
      peers_[peer].shm_control->failed.load(std::memory_order_acquire) != 0) {
    reason.assign(
        peers_[peer].shm_control->failure,
        strnlen(peers_[peer].shm_control->failure, sizeof(peers_[peer].shm_control->failure)));
  } else if (failure_store_ != nullptr) {
    auto stored =
        failure_store_->GetString("failed/" + std::to_string(peer), Deadline::AfterMs(200));
    if (stored.ok()) reason = *stored;
  }
  if (!reason.empty()) text += "; it had failed: " + reason;
  return Poison(Status(cause.code(), text));
}

Result<bool> Messenger::ProgressPeer(int peer) {
  PeerState& ps = state_[peer];
  bool progressed = !ps.copy_sends.empty() && CompleteCopies(peer, ps);
  if (!ps.sends.empty()) {
    auto sent = ProgressSends(peer, ps);
    if (!sent.ok()) return PeerError(peer, sent.status());
    progressed |= *sent;
  }
  // Buffered messages whose receive was posted after they completed.
  const size_t buffered = ps.unexpected.size();
  if (Status s = DeliverBuffered(peer, ps); !s.ok()) return PeerError(peer, s);
  progressed |= ps.unexpected.size() != buffered;
  auto received = ProgressRecvs(peer, ps);
  if (!received.ok()) return PeerError(peer, received.status());
  progressed |= *received;
  return progressed;
}

Status Messenger::Progress() {
  if (!poison_.ok()) return PoisonedError();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !state_[p].active()) continue;
    Result<bool> progressed = ProgressPeer(p);
    if (!progressed.ok()) return Poison(progressed.status());
  }
  return Status::Ok();
}

Result<bool> Messenger::Test(std::span<Op* const> ops) {
  TESSERA_RETURN_IF_ERROR(Progress());
  for (Op* op : ops) {
    if (!op->done) return false;
  }
  return true;
}

}  // namespace tessera::comm
