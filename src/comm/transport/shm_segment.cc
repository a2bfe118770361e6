#include "comm/transport/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>
#include <utility>

#include "base/unique_fd.h"

namespace tessera::comm {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kControlBytes = kPage;

size_t RingStride(size_t ring_bytes) { return kPage + ring_bytes; }
size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }
size_t SlotStride(size_t mailbox_bytes) { return RoundUp(sizeof(ShmSlot) + mailbox_bytes, 64); }
// Control page, then the two mailbox slots, the per-peer acknowledgement lines,
// then the rings (page aligned).
size_t AcksOffset(size_t mailbox_bytes) { return kControlBytes + 2 * SlotStride(mailbox_bytes); }
size_t RingsOffset(int num_ranks, size_t mailbox_bytes) {
  return RoundUp(AcksOffset(mailbox_bytes) + 64 * static_cast<size_t>(num_ranks), kPage);
}

}  // namespace

// One mmap of a segment, unmapped when its last ShmSegment goes.
struct ShmSegment::Mapping {
  uint8_t* base;
  size_t bytes;
  Mapping(uint8_t* b, size_t n) : base(b), bytes(n) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ::munmap(base, bytes); }
};

namespace {

// The segments this process created, by name, for its other ranks to share.
struct MappingRegistry {
  std::mutex mutex;
  std::unordered_map<std::string, std::weak_ptr<void>> by_name;  // void: Mapping is private

  static MappingRegistry& Get() {
    static MappingRegistry* registry = new MappingRegistry;  // never destroyed
    return *registry;
  }
  void Add(const std::string& name, const std::shared_ptr<void>& mapping) {
    std::lock_guard lock(mutex);
    std::erase_if(by_name, [](const auto& entry) { return entry.second.expired(); });
    by_name[name] = mapping;
  }
  std::shared_ptr<void> Find(const std::string& name) {
    std::lock_guard lock(mutex);
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second.lock();
  }
};

}  // namespace

size_t ShmSegment::SizeFor(int num_ranks, size_t ring_bytes, size_t mailbox_bytes) {
  return RingsOffset(num_ranks, mailbox_bytes) +
         static_cast<size_t>(num_ranks) * RingStride(ring_bytes);
}

Result<ShmSegment> ShmSegment::Create(const std::string& name, int num_ranks, size_t ring_bytes,
                                      size_t mailbox_bytes) {
  ::shm_unlink(name.c_str());  // a stale segment of a crashed run with the same name
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return InternalError("shm_open(" + name + ") failed: " + std::strerror(errno));
  }
  ShmSegment segment;
  segment.name_ = name;
  segment.owner_ = true;
  segment.linked_ = true;
  segment.ring_bytes_ = ring_bytes;
  segment.mailbox_bytes_ = mailbox_bytes;
  segment.num_ranks_ = num_ranks;
  const size_t bytes = SizeFor(num_ranks, ring_bytes, mailbox_bytes);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ResourceExhaustedError("cannot size shared memory " + name + " to " +
                                  std::to_string(bytes) + " bytes: " + std::strerror(errno) +
                                  " (is /dev/shm full?)");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return InternalError("mmap(" + name + "): " + std::strerror(errno));
  segment.mapping_ = std::make_shared<Mapping>(static_cast<uint8_t*>(p), bytes);
  segment.base_ = segment.mapping_->base;
  MappingRegistry::Get().Add(name, segment.mapping_);
  ShmControl* control = new (segment.base_) ShmControl();
  control->doorbell.store(0);
  control->sleeping.store(0);
  control->failed.store(0);
  control->pid = static_cast<int32_t>(::getpid());
  std::random_device random;
  control->ring_salt = (static_cast<uint64_t>(random()) << 32) ^ random();
  control->failure[0] = '\0';
  for (int i = 0; i < 2; ++i) new (segment.slot(i)) ShmSlot{0};
  for (int r = 0; r < num_ranks; ++r) new (segment.copy_ack(r)) std::atomic<uint64_t>(0);
  for (int r = 0; r < num_ranks; ++r) new (segment.ring_head(r)) ShmRingHead{0};
  return segment;
}

Result<ShmSegment> ShmSegment::Open(const std::string& name, int num_ranks, size_t ring_bytes,
                                    size_t mailbox_bytes) {
  ShmSegment segment;
  segment.name_ = name;
  segment.ring_bytes_ = ring_bytes;
  segment.mailbox_bytes_ = mailbox_bytes;
  segment.num_ranks_ = num_ranks;
  const size_t bytes = SizeFor(num_ranks, ring_bytes, mailbox_bytes);
  const auto check_size = [&](uint64_t actual) -> Status {
    if (actual == bytes) return Status::Ok();
    return InvalidArgumentError(
        "peer shared memory " + name + " has " + std::to_string(actual) + " bytes, expected " +
        std::to_string(bytes) +
        " (ranks disagree on TESSERA_SHM_RING_BYTES or TESSERA_ALLREDUCE_ONESHOT_BYTES?)");
  };
  if (std::shared_ptr<void> shared = MappingRegistry::Get().Find(name)) {  // a rank of ours
    segment.mapping_ = std::static_pointer_cast<Mapping>(std::move(shared));
    TESSERA_RETURN_IF_ERROR(check_size(segment.mapping_->bytes));
    segment.base_ = segment.mapping_->base;
    return segment;
  }
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return UnavailableError("cannot open peer shared memory " + name + ": " + std::strerror(errno));
  }
  const off_t actual = ::lseek(fd.get(), 0, SEEK_END);
  TESSERA_RETURN_IF_ERROR(check_size(actual < 0 ? 0 : static_cast<uint64_t>(actual)));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return InternalError("mmap(" + name + "): " + std::strerror(errno));
  segment.mapping_ = std::make_shared<Mapping>(static_cast<uint8_t*>(p), bytes);
  segment.base_ = segment.mapping_->base;
  return segment;
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    mapping_ = std::move(other.mapping_);
    base_ = std::exchange(other.base_, nullptr);
    ring_bytes_ = other.ring_bytes_;
    mailbox_bytes_ = other.mailbox_bytes_;
    num_ranks_ = other.num_ranks_;
    name_ = std::move(other.name_);
    owner_ = std::exchange(other.owner_, false);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
  Unlink();
  mapping_.reset();
  base_ = nullptr;
}

void ShmSegment::Unlink() {
  if (owner_ && linked_) {
    ::shm_unlink(name_.c_str());
    linked_ = false;
  }
}

ShmSlot* ShmSegment::slot(int index) const {
  return reinterpret_cast<ShmSlot*>(base_ + kControlBytes +
                                    static_cast<size_t>(index) * SlotStride(mailbox_bytes_));
}

std::atomic<uint64_t>* ShmSegment::copy_ack(int from) const {
  return reinterpret_cast<std::atomic<uint64_t>*>(base_ + AcksOffset(mailbox_bytes_) +
                                                  64 * static_cast<size_t>(from));
}

ShmRingHead* ShmSegment::ring_head(int from) const {
  return reinterpret_cast<ShmRingHead*>(base_ + RingsOffset(num_ranks_, mailbox_bytes_) +
                                        static_cast<size_t>(from) * RingStride(ring_bytes_));
}

uint8_t* ShmSegment::ring_data(int from) const {
  return reinterpret_cast<uint8_t*>(ring_head(from)) + kPage;
}

void FutexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

void WakeIfSleeping(ShmControl* control) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (control->sleeping.load(std::memory_order_relaxed) != 0) {
    control->doorbell.fetch_add(1, std::memory_order_seq_cst);
    FutexWake(&control->doorbell);
  }
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  timespec ts{static_cast<time_t>(timeout_us / 1000000),
              static_cast<long>((timeout_us % 1000000) * 1000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace tessera::comm
