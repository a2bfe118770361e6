#include "comm/transport/mpi_channel.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/log.h"

#ifdef TESSERA_HAVE_MPI
#include <mpi.h>
#endif

namespace tessera::comm {

#ifndef TESSERA_HAVE_MPI

bool MpiBuilt() { return false; }
Status InitMpi() {
  return InvalidArgumentError(
      "this tessera was built without MPI (install libopenmpi-dev and rebuild): transport mpi "
      "is not available");
}
bool MpiActive() { return false; }
int MpiWorldRank() { return 0; }
int MpiWorldSize() { return 1; }
int AllocateMpiTags(int) { return 0; }
Result<std::string> MpiBroadcastString(const std::string&, int) { return InitMpi(); }
void ShutdownMpi(int) {}

struct MpiGroup::State {};
MpiGroup::MpiGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
MpiGroup::~MpiGroup() = default;
Result<std::unique_ptr<MpiGroup>> MpiGroup::Create(const std::vector<int>&) { return InitMpi(); }
Status MpiGroup::StartAllGather(const void*, void*, size_t) { return InitMpi(); }
Status MpiGroup::StartAllToAllv(const void*, std::span<const size_t>, std::span<const size_t>,
                                void*, std::span<const size_t>, std::span<const size_t>) {
  return InitMpi();
}
Result<bool> MpiGroup::Test() { return InitMpi(); }

#else

struct MpiChannel::PendingSend {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<uint8_t> bytes;
};

namespace {

// The process's MPI: initialised once, then shared by every channel (MPI_Init is
// per process). `mutex` serialises every MPI call.
struct MpiRuntime {
  std::mutex mutex;
  bool active = false;
  bool we_initialised = false;
  MPI_Comm comm = MPI_COMM_NULL;  // our duplicate of MPI_COMM_WORLD
  int world_rank = 0;
  int world_size = 1;
  int tag_ub = 32767;
  int next_tag = 0;
  // Sends of channels destroyed before their peer took the bytes: kept (with
  // their buffers) until they complete or MPI ends.
  std::vector<std::unique_ptr<MpiChannel::PendingSend>> orphans;
};

MpiRuntime& Runtime() {
  static MpiRuntime* runtime = new MpiRuntime;  // never destroyed: used at exit
  return *runtime;
}

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

// Completes what has finished of `sends` (under the runtime's mutex), in order;
// their buffers go to `spare` (when given) for reuse.
int TestSends(std::deque<std::unique_ptr<MpiChannel::PendingSend>>* sends, size_t* freed,
              std::vector<std::unique_ptr<MpiChannel::PendingSend>>* spare) {
  while (!sends->empty()) {
    int done = 0;
    int rc = MPI_Test(&sends->front()->request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return rc;
    if (!done) break;
    *freed += sends->front()->bytes.size();
    if (spare != nullptr) spare->push_back(std::move(sends->front()));
    sends->pop_front();
  }
  return MPI_SUCCESS;
}

void DrainOrphans(MpiRuntime& rt, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!rt.orphans.empty()) {
    std::erase_if(rt.orphans, [](const std::unique_ptr<MpiChannel::PendingSend>& send) {
      int done = 0;
      return MPI_Test(&send->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done != 0;
    });
    if (rt.orphans.empty() || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void ShutdownAtExit() { ShutdownMpi(0); }

}  // namespace

bool MpiBuilt() { return true; }

Status InitMpi() {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (rt.active) return Status::Ok();
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return UnavailableError("MPI_Init_thread failed: " + MpiErrorText(rc));
    if (provided < MPI_THREAD_SERIALIZED) {
      return UnavailableError("this MPI offers no MPI_THREAD_SERIALIZED (level " +
                              std::to_string(provided) + "): transport mpi needs it");
    }
    rt.we_initialised = true;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &rt.comm);
  // Errors come back as codes (a channel's error, with the peer named), never an abort.
  MPI_Comm_set_errhandler(rt.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(rt.comm, &rt.world_rank);
  MPI_Comm_size(rt.comm, &rt.world_size);
  void* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  if (found) rt.tag_ub = *static_cast<int*>(ub);
  rt.active = true;
  if (rt.we_initialised) std::atexit(ShutdownAtExit);
  TLOG_DEBUG("comm", "MPI initialised: world rank %d of %d", rt.world_rank, rt.world_size);
  return Status::Ok();
}

bool MpiActive() {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  return rt.active;
}

int MpiWorldRank() {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  return rt.world_rank;
}

int MpiWorldSize() {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  return rt.world_size;
}

int AllocateMpiTags(int count) {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (rt.next_tag < 1 || rt.next_tag > rt.tag_ub - count) rt.next_tag = 1;  // wrap
  const int first = rt.next_tag;
  rt.next_tag += count;
  return first;
}

Result<std::string> MpiBroadcastString(const std::string& value, int root) {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (!rt.active) return UnavailableError("MPI is not initialised");
  uint64_t size = value.size();
  int rc = MPI_Bcast(&size, 1, MPI_UINT64_T, root, rt.comm);
  if (rc != MPI_SUCCESS || size > (uint64_t{1} << 20)) {
    return UnavailableError("MPI_Bcast of the rendezvous record failed: " +
                            (rc != MPI_SUCCESS ? MpiErrorText(rc) : "oversized"));
  }
  std::string out = rt.world_rank == root ? value : std::string(size, '\0');
  rc = MPI_Bcast(out.data(), static_cast<int>(size), MPI_CHAR, root, rt.comm);
  if (rc != MPI_SUCCESS) {
    return UnavailableError("MPI_Bcast of the rendezvous record failed: " + MpiErrorText(rc));
  }
  return out;
}

void ShutdownMpi(int exit_code) {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (!rt.active) return;
  rt.active = false;
  if (!rt.we_initialised) return;
  if (exit_code != 0) {
    // Our peers may be blocked in a collective with us: end the job now.
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    return;
  }
  // Bytes still on their way to a peer that has not taken them yet: give it time.
  DrainOrphans(rt, std::chrono::seconds(30));
  if (!rt.orphans.empty()) {
    TLOG_WARN("comm", "MPI: %zu sends never completed; aborting the MPI job", rt.orphans.size());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return;
  }
  MPI_Comm_free(&rt.comm);
  MPI_Finalize();
}

struct MpiGroup::State {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<int> counts[2], displs[2];  // send, receive (alltoallv)
};

MpiGroup::MpiGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}

MpiGroup::~MpiGroup() {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (!rt.active || state_->comm == MPI_COMM_NULL) return;
  if (state_->request != MPI_REQUEST_NULL) return;  // unfinished (after an error): MPI ends soon
  MPI_Comm_free(&state_->comm);
}

Result<std::unique_ptr<MpiGroup>> MpiGroup::Create(const std::vector<int>& world_ranks) {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (!rt.active) return UnavailableError("MPI is not initialised");
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(rt.comm, &world_group);
  int rc =
      MPI_Group_incl(world_group, static_cast<int>(world_ranks.size()), world_ranks.data(), &group);
  auto state = std::make_unique<State>();
  // Members only (MPI-3); the tag tells concurrent creations apart, and within a
  // process creations are sequential.
  if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(rt.comm, group, 7, &state->comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS) {
    return UnavailableError("MPI_Comm_create_group failed: " + MpiErrorText(rc));
  }
  MPI_Comm_set_errhandler(state->comm, MPI_ERRORS_RETURN);
  return std::unique_ptr<MpiGroup>(new MpiGroup(std::move(state)));
}

Status MpiGroup::StartAllGather(const void* send, void* recv, size_t block_bytes) {
  if (block_bytes > static_cast<size_t>(INT32_MAX)) {
    return InvalidArgumentError("all_gather block too large for MPI");
  }
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  int rank = 0;
  MPI_Comm_rank(state_->comm, &rank);
  const bool in_place = send == static_cast<const uint8_t*>(recv) + rank * block_bytes;
  const int n = static_cast<int>(block_bytes);
  int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE,
                          state_->comm, &state_->request);
  if (rc != MPI_SUCCESS) return UnavailableError("MPI_Iallgather failed: " + MpiErrorText(rc));
  return Status::Ok();
}

Status MpiGroup::StartAllToAllv(const void* send, std::span<const size_t> send_bytes,
                                std::span<const size_t> send_offsets, void* recv,
                                std::span<const size_t> recv_bytes,
                                std::span<const size_t> recv_offsets) {
  std::span<const size_t> from[4] = {send_bytes, send_offsets, recv_bytes, recv_offsets};
  for (int k = 0; k < 4; ++k) {
    std::vector<int>& to = k % 2 == 0 ? state_->counts[k / 2] : state_->displs[k / 2];
    to.resize(from[k].size());
    for (size_t i = 0; i < from[k].size(); ++i) {
      if (from[k][i] > static_cast<size_t>(INT32_MAX)) {
        return InvalidArgumentError("all_to_allv counts too large for MPI");
      }
      to[i] = static_cast<int>(from[k][i]);
    }
  }
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  int rc = MPI_Ialltoallv(send, state_->counts[0].data(), state_->displs[0].data(), MPI_BYTE, recv,
                          state_->counts[1].data(), state_->displs[1].data(), MPI_BYTE,
                          state_->comm, &state_->request);
  if (rc != MPI_SUCCESS) return UnavailableError("MPI_Ialltoallv failed: " + MpiErrorText(rc));
  return Status::Ok();
}

Result<bool> MpiGroup::Test() {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (!rt.active) return UnavailableError("MPI has been shut down");
  int done = 0;
  int rc = MPI_Test(&state_->request, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) return UnavailableError("MPI collective failed: " + MpiErrorText(rc));
  return done != 0;
}

MpiChannel::MpiChannel(int peer_world_rank, int send_tag, int recv_tag)
    : peer_(peer_world_rank), send_tag_(send_tag), recv_tag_(recv_tag) {}

MpiChannel::~MpiChannel() {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (!rt.active) return;  // MPI has ended: nothing more can complete
  size_t freed = 0;
  TestSends(&sends_, &freed, nullptr);
  for (auto& send : sends_) rt.orphans.push_back(std::move(send));
  DrainOrphans(rt, std::chrono::milliseconds(0));
}

Status MpiChannel::ReapSends() const {
  if (sends_.empty()) return send_error_;
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  size_t freed = 0;
  int rc = TestSends(&sends_, &freed, &spare_sends_);
  in_flight_bytes_ -= freed;
  if (rc != MPI_SUCCESS && send_error_.ok()) {
    send_error_ = UnavailableError("MPI send to world rank " + std::to_string(peer_) +
                                   " failed: " + MpiErrorText(rc));
  }
  return send_error_;
}

Result<size_t> MpiChannel::Write(const void* data, size_t size) {
  TESSERA_RETURN_IF_ERROR(ReapSends());
  if (in_flight_bytes_ >= kMaxInFlightBytes || size == 0) return size_t{0};
  const size_t n = std::min({size, kMaxMessageBytes, kMaxInFlightBytes - in_flight_bytes_});
  std::unique_ptr<PendingSend> send;
  if (!spare_sends_.empty()) {
    send = std::move(spare_sends_.back());
    spare_sends_.pop_back();
  } else {
    send = std::make_unique<PendingSend>();
  }
  send->bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
  MpiRuntime& rt = Runtime();
  {
    std::lock_guard lock(rt.mutex);
    if (!rt.active) return UnavailableError("MPI has been shut down");
    int rc = MPI_Isend(send->bytes.data(), static_cast<int>(n), MPI_BYTE, peer_, send_tag_, rt.comm,
                       &send->request);
    if (rc != MPI_SUCCESS) {
      return UnavailableError("MPI_Isend to world rank " + std::to_string(peer_) +
                              " failed: " + MpiErrorText(rc));
    }
  }
  in_flight_bytes_ += n;
  sends_.push_back(std::move(send));
  return n;
}

Result<bool> MpiChannel::ReceiveIntoStaging() {
  MpiRuntime& rt = Runtime();
  std::lock_guard lock(rt.mutex);
  if (!rt.active) return UnavailableError("MPI has been shut down");
  int found = 0;
  MPI_Message message;
  MPI_Status status;
  int rc = MPI_Improbe(peer_, recv_tag_, rt.comm, &found, &message, &status);
  if (rc != MPI_SUCCESS) {
    return UnavailableError("MPI_Improbe from world rank " + std::to_string(peer_) +
                            " failed: " + MpiErrorText(rc));
  }
  if (!found) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  if (staging_begin_ > 0) {
    staging_.erase(staging_.begin(), staging_.begin() + static_cast<ptrdiff_t>(staging_begin_));
    staging_begin_ = 0;
  }
  const size_t old_size = staging_.size();
  staging_.resize(old_size + static_cast<size_t>(count));
  rc = MPI_Mrecv(staging_.data() + old_size, count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    return UnavailableError("MPI_Mrecv from world rank " + std::to_string(peer_) +
                            " failed: " + MpiErrorText(rc));
  }
  received_ += static_cast<uint64_t>(count);
  return true;
}

Result<std::span<const uint8_t>> MpiChannel::Peek() {
  TESSERA_RETURN_IF_ERROR(ReapSends());
  // Whole 8-byte elements (Channel's contract): a message that ends mid-element
  // waits for the next one behind it.
  while (staged() < 8 && (staged() == 0 || received_ % 8 != 0)) {
    TESSERA_ASSIGN_OR_RETURN(bool got, ReceiveIntoStaging());
    if (!got) break;
  }
  return std::span<const uint8_t>(staging_.data() + staging_begin_, staged());
}

void MpiChannel::Consume(size_t size) {
  staging_begin_ += size;
  if (staging_begin_ == staging_.size()) {
    staging_.clear();
    staging_begin_ = 0;
  }
}

Result<size_t> MpiChannel::ReadInto(void* dst, size_t size, bool /*bypass_cache*/) {
  if (staged() == 0 && size > 0) {
    // A message that fits goes straight into `dst`.
    MpiRuntime& rt = Runtime();
    std::unique_lock lock(rt.mutex);
    if (!rt.active) return UnavailableError("MPI has been shut down");
    int found = 0;
    MPI_Message message;
    MPI_Status status;
    int rc = MPI_Improbe(peer_, recv_tag_, rt.comm, &found, &message, &status);
    if (rc != MPI_SUCCESS) {
      return UnavailableError("MPI_Improbe from world rank " + std::to_string(peer_) +
                              " failed: " + MpiErrorText(rc));
    }
    if (!found) return size_t{0};
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    const bool fits = static_cast<size_t>(count) <= size;
    if (!fits) staging_.resize(static_cast<size_t>(count));
    rc = MPI_Mrecv(fits ? dst : staging_.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      return UnavailableError("MPI_Mrecv from world rank " + std::to_string(peer_) +
                              " failed: " + MpiErrorText(rc));
    }
    received_ += static_cast<uint64_t>(count);
    if (fits) return static_cast<size_t>(count);
  }
  const size_t n = std::min(size, staged());
  std::memcpy(dst, staging_.data() + staging_begin_, n);
  Consume(n);
  return n;
}

bool MpiChannel::HasRoom() const {
  (void)ReapSends();
  return in_flight_bytes_ < kMaxInFlightBytes;
}

std::string MpiChannel::Describe() const {
  return "mpi (world rank " + std::to_string(peer_) + ")";
}

#endif  // TESSERA_HAVE_MPI

}  // namespace tessera::comm
