// Communicator::AllocateShared (communicator.h): a collective that gives this rank
// memory every same-host peer maps read-only (shared_buffer.h), registered with
// the messenger so collectives whose bytes lie in it go as descriptors.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace tessera::comm {

Result<SharedBuffer> Communicator::AllocateShared(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  const uint64_t id = ++shared_buffers_;
  SharedBuffer buffer;
  buffer.size_ = bytes;
  buffer.id_ = id;
  std::vector<int> peers;
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && segments_.size() > static_cast<size_t>(p) && segments_[p].control()) {
      peers.push_back(p);
    }
  }
  if (size_ == 1) {  // nothing to share, nothing to agree on
    TESSERA_ASSIGN_OR_RETURN(buffer.region_, MappedRegion::Anonymous(mapped));
    return buffer;
  }
  // Every rank creates its part (plain memory when no peer shares its host: it still
  // takes part in the agreement below, which every rank must run), then says whether
  // it could and how large it is.
  const bool shared = !peers.empty();
  auto name_of = [&](int rank) {
    return shm_prefix_ + "-r" + std::to_string(rank) + "-w" + std::to_string(id);
  };
  auto mine =
      shared ? MappedRegion::CreateShared(name_of(rank_), mapped) : MappedRegion::Anonymous(mapped);
  // The name goes when this returns, whichever way: by then every peer has mapped
  // the object (the all-reduce below), or the allocation failed everywhere.
  struct Unlink {
    std::string name;
    ~Unlink() {
      if (!name.empty()) ::shm_unlink(name.c_str());
    }
  } unlink{shared ? name_of(rank_) : std::string()};
  std::vector<int64_t> sizes(static_cast<size_t>(size_));
  const int64_t announced = mine.ok() ? static_cast<int64_t>(mapped) : -1;
  TESSERA_RETURN_IF_ERROR(AllGather(&announced, sizes.data(), 1, DataType::kI64));
  auto fail = [&](const std::string& what) {
    return Status(mine.ok() ? StatusCode::kUnavailable : mine.status().code(),
                  "allocating shared buffer " + std::to_string(id) + " of " +
                      std::to_string(bytes) + " bytes: " + what);
  };
  std::string failed;
  for (int p = 0; p < size_; ++p) {
    if (sizes[p] < 0) failed += (failed.empty() ? "rank " : ", rank ") + std::to_string(p);
  }
  if (!mine.ok()) return fail(mine.status().message());
  if (!failed.empty()) return fail(failed + " could not create its part");
  // Map every same-host peer's, then agree that all did before the names go.
  std::vector<MappedRegion> theirs;
  Status mapping = Status::Ok();
  for (int p : peers) {
    auto region = MappedRegion::OpenShared(name_of(p), static_cast<size_t>(sizes[p]));
    if (!region.ok()) {
      mapping = region.status().WithContext("rank " + std::to_string(p) + "'s part");
      break;
    }
    theirs.push_back(std::move(*region));
  }
  const int32_t ok = mapping.ok() ? 1 : 0;
  int32_t all_ok = 0;
  TESSERA_RETURN_IF_ERROR(AllReduce(&ok, &all_ok, 1, DataType::kI32, ReduceOp::kMin));
  if (!mapping.ok()) return fail(mapping.message());
  if (all_ok == 0) return fail("a peer could not map this rank's or another's part");
  for (size_t i = 0; i < peers.size(); ++i) {
    messenger_->AddPeerWindow(peers[i], id, theirs[i].data(), theirs[i].bytes());
    peer_windows_.push_back(std::move(theirs[i]));
  }
  buffer.region_ = std::move(*mine);
  if (shared) {
    buffer.shared_ = true;
    buffer.table_ = messenger_->windows();
    messenger_->windows()->Add(id, buffer.data(), mapped);
  }
  return buffer;
}

}  // namespace tessera::comm
