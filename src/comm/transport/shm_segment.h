// ShmSegment: one rank's POSIX shared-memory segment, named by job, communicator
// and rank ("/tessera-<job>-<comm>-r<rank>"). It holds the rank's control block
// (doorbell futex word, sleeping flag, failure flag and text, pid), its two
// mailbox slots (the one-shot exchange every peer reads, messenger.h), one
// single-copy acknowledgement counter per peer and one inbound ring per peer. The owner creates it;
// peers map it; the owner unlinks the name as soon as every peer has mapped it (so a crash leaves
// nothing behind), and the last of them to go unmaps. Ranks that are threads of one process
// share the creator's mapping: one set of addresses for the same atomics, which is also what
// lets ThreadSanitizer see the rings' release/acquire pairs. Layer: comm. Move-only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace tessera::comm {

// Lives at offset 0 of every segment; shared by processes (address-free atomics).
struct alignas(64) ShmControl {
  std::atomic<uint32_t> doorbell;            // futex word: bumped to wake the owner
  std::atomic<uint32_t> sleeping;            // 1 while the owner sleeps on the doorbell
  alignas(64) std::atomic<uint32_t> failed;  // 1 once the owner poisoned its communicator
  // Bumped every few hundred ms by the owner's heartbeat thread (Messenger), beside
  // its compute: a count that stops while the pid lives is a frozen process
  // (SIGSTOP, a debugger, a hung kernel call), told apart from a long computation.
  alignas(64) std::atomic<uint64_t> heartbeat;
  int32_t pid;
  // Random per segment: mixed into the rings' chunk stamps so stale ring bytes
  // (old payload) can never pass for a fresh chunk header.
  uint64_t ring_salt;
  char failure[512];  // NUL-terminated reason, written before `failed`
};

// A mailbox slot: the owner writes `mailbox_bytes` of data after `seq`, then
// stores the exchange number in `seq` (release); peers read it in place. Data
// starts in seq's cache line, so a tiny exchange moves one line.
struct alignas(64) ShmSlot {
  std::atomic<uint64_t> seq;
  uint8_t* data() { return reinterpret_cast<uint8_t*>(this) + sizeof(seq); }
};

// Head (bytes consumed, written by the ring's reader) sits on its own page
// before the ring's data.
struct alignas(64) ShmRingHead {
  std::atomic<uint64_t> head;
};

class ShmSegment {
 public:
  static Result<ShmSegment> Create(const std::string& name, int num_ranks, size_t ring_bytes,
                                   size_t mailbox_bytes);
  static Result<ShmSegment> Open(const std::string& name, int num_ranks, size_t ring_bytes,
                                 size_t mailbox_bytes);

  ShmSegment() = default;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ~ShmSegment();

  // Removes the name (idempotent); the mapping stays valid.
  void Unlink();

  ShmControl* control() const { return reinterpret_cast<ShmControl*>(base_); }
  // Mailbox slot 0 or 1 (exchange number s uses slot s % 2).
  ShmSlot* slot(int index) const;
  // Single-copy acknowledgements: how many of this segment owner's single-copy
  // messages rank `from` has finished reading (written by `from`, one line each).
  std::atomic<uint64_t>* copy_ack(int from) const;
  size_t mailbox_bytes() const { return mailbox_bytes_; }
  // The ring that rank `from` writes into this segment.
  ShmRingHead* ring_head(int from) const;
  uint8_t* ring_data(int from) const;
  size_t ring_bytes() const { return ring_bytes_; }
  const std::string& name() const { return name_; }

  static size_t SizeFor(int num_ranks, size_t ring_bytes, size_t mailbox_bytes);

 private:
  struct Mapping;
  void Reset();

  std::shared_ptr<Mapping> mapping_;  // shared by the process's ShmSegments of one name
  uint8_t* base_ = nullptr;           // mapping_->base
  size_t ring_bytes_ = 0;
  size_t mailbox_bytes_ = 0;
  int num_ranks_ = 0;
  std::string name_;
  bool owner_ = false;
  bool linked_ = false;
};

// Futex helpers on a shared (non-private) futex word.
void FutexWake(std::atomic<uint32_t>* word);
// Sleeps while *word == expected, at most timeout_us.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us);
// After publishing something the owner of `control` may wait for: wakes it if it
// announced that it sleeps (it re-checks after announcing, so one of the two sees
// the other).
void WakeIfSleeping(ShmControl* control);

}  // namespace tessera::comm
