// Communicator (communicator.h): the typed collectives. Each checks its arguments
// (counts that overflow, overlapping buffers), starts the primitive, picks an
// algorithm (the Choose* functions) and runs it from algorithms/.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/communicator.h"
#include "comm/transport/mpi_channel.h"

namespace tessera::comm {
namespace {

bool CountOk(size_t count, DataType dtype, size_t multiplier) {
  size_t limit =
      std::numeric_limits<size_t>::max() / DataTypeSize(dtype) / std::max<size_t>(multiplier, 1);
  return count <= limit;
}

// A rank's one block of `bytes` against the `num_blocks` blocks it gathers into or
// scatters from: either apart, or exactly block `index` of them (the in-place form,
// when `index` >= 0). Any other overlap would have the rank overwrite bytes it
// still sends, or send bytes it is receiving into.
Status CheckBlockOverlap(const char* op, const void* block, const void* blocks, size_t bytes,
                         int num_blocks, int index) {
  const auto b = reinterpret_cast<uintptr_t>(block);
  const auto all = reinterpret_cast<uintptr_t>(blocks);
  const size_t all_bytes = bytes * static_cast<size_t>(num_blocks);
  if (bytes == 0 || block == nullptr || blocks == nullptr) return Status::Ok();
  if (index >= 0 && b == all + bytes * static_cast<size_t>(index)) return Status::Ok();
  if (b + bytes <= all || all + all_bytes <= b) return Status::Ok();
  std::string message = std::string(op) + ": the send and receive buffers overlap";
  if (index >= 0) {
    message += " but not in the in-place form (the single block == the " +
               std::to_string(num_blocks) + "-block buffer + " + std::to_string(index) + " blocks)";
  } else {
    message += "; use separate buffers";
  }
  return InvalidArgumentError(message);
}

}  // namespace

AllReduceAlgo Communicator::ChooseAllReduce(size_t bytes, AllReduceAlgo requested) const {
  if (requested == AllReduceAlgo::kAuto) requested = options_.allreduce_algo;
  const bool one_shot = OneShotFits(bytes);
  if (requested == AllReduceAlgo::kOneShot && !one_shot) requested = AllReduceAlgo::kAuto;
  if (requested != AllReduceAlgo::kAuto) return requested;
  if (one_shot) return AllReduceAlgo::kOneShot;
  return bytes <= options_.allreduce_small_bytes ? AllReduceAlgo::kRecursiveDoubling
                                                 : AllReduceAlgo::kRing;
}

AllGatherAlgo Communicator::ChooseAllGather(size_t bytes_per_rank, AllGatherAlgo requested) const {
  if (requested == AllGatherAlgo::kAuto) requested = options_.allgather_algo;
  if (requested != AllGatherAlgo::kAuto) return requested;
  return bytes_per_rank <= options_.allgather_small_bytes && size_ > 2 ? AllGatherAlgo::kBruck
                                                                       : AllGatherAlgo::kRing;
}

BroadcastAlgo Communicator::ChooseBroadcast(size_t bytes, BroadcastAlgo requested) const {
  if (requested == BroadcastAlgo::kAuto) requested = options_.broadcast_algo;
  if (requested != BroadcastAlgo::kAuto) return requested;
  return bytes <= options_.broadcast_small_bytes || size_ <= 2 ? BroadcastAlgo::kBinomialTree
                                                               : BroadcastAlgo::kPipelinedChain;
}

bool Communicator::OneShotFits(size_t bytes) const {
  return messenger_->mailbox_bytes() > 0 && bytes <= messenger_->mailbox_bytes();
}

bool Communicator::DeterministicUsesRecursiveDoubling(size_t bytes, DataType dtype) const {
  const bool power_of_two = (size_ & (size_ - 1)) == 0;
  const bool half = dtype == DataType::kF16 || dtype == DataType::kBf16;
  return power_of_two && !half && bytes <= options_.allreduce_small_bytes;
}

Status Communicator::AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                               ReduceOp op, AllReduceAlgo algo) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kAllReduce));
  if (!CountOk(count, dtype, 1)) return InvalidArgumentError("all_reduce: count too large");
  const size_t bytes = count * DataTypeSize(dtype);
  if (size_ == 1 || count == 0) {
    if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
    return Status::Ok();
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  switch (ChooseAllReduce(bytes, algo)) {
    case AllReduceAlgo::kRecursiveDoubling:
      return algorithms::AllReduceRecursiveDoubling(ctx, send, recv, count, dtype, op);
    case AllReduceAlgo::kOneShot:
      return algorithms::AllReduceOneShot(ctx, send, recv, count, dtype, op);
    case AllReduceAlgo::kDeterministic:
      if (OneShotFits(bytes)) {  // the same tree on every rank
        return algorithms::AllReduceOneShot(ctx, send, recv, count, dtype, op);
      }
      // Recursive doubling pairs ranks r, r^1 first, then r, r^2, … and combines
      // op(lower, upper): for a power-of-two group that is exactly the canonical
      // tree, in one exchange per level instead of two-shot's two rounds. Only
      // for native types (f16/bf16 round at every level there, once in the tree).
      if (DeterministicUsesRecursiveDoubling(bytes, dtype)) {
        return algorithms::AllReduceRecursiveDoubling(ctx, send, recv, count, dtype, op);
      }
      return algorithms::AllReduceDeterministic(ctx, send, recv, count, dtype, op);
    case AllReduceAlgo::kRing:
    case AllReduceAlgo::kAuto:
      break;
  }
  return algorithms::AllReduceRing(ctx, send, recv, count, dtype, op);
}

Status Communicator::Broadcast(void* buffer, size_t count, DataType dtype, int root,
                               BroadcastAlgo algo) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kBroadcast));
  TESSERA_RETURN_IF_ERROR(CheckPeer(root, "broadcast root"));
  if (!CountOk(count, dtype, 1)) return InvalidArgumentError("broadcast: count too large");
  const size_t bytes = count * DataTypeSize(dtype);
  if (size_ == 1) return Status::Ok();
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  if (ChooseBroadcast(bytes, algo) == BroadcastAlgo::kPipelinedChain) {
    return algorithms::BroadcastPipelinedChain(ctx, buffer, bytes, root,
                                               options_.broadcast_chunk_bytes);
  }
  return algorithms::BroadcastBinomialTree(ctx, buffer, bytes, root);
}

Status Communicator::Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                            int root) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kReduce));
  TESSERA_RETURN_IF_ERROR(CheckPeer(root, "reduce root"));
  if (!CountOk(count, dtype, 1)) return InvalidArgumentError("reduce: count too large");
  if (rank_ == root && recv == nullptr && count > 0) {
    return InvalidArgumentError("reduce: the root needs a receive buffer");
  }
  if (size_ == 1) {
    if (send != recv && count > 0) std::memmove(recv, send, count * DataTypeSize(dtype));
    return Status::Ok();
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::ReduceBinomialTree(ctx, send, recv, count, dtype, op, root);
}

Status Communicator::Gather(const void* send, void* recv, size_t count, DataType dtype, int root) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kGather));
  TESSERA_RETURN_IF_ERROR(CheckPeer(root, "gather root"));
  if (!CountOk(count, dtype, size_)) return InvalidArgumentError("gather: count too large");
  if (rank_ == root) {
    TESSERA_RETURN_IF_ERROR(
        CheckBlockOverlap("gather", send, recv, count * DataTypeSize(dtype), size_, root));
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::GatherDirect(ctx, send, recv, count * DataTypeSize(dtype), root);
}

Status Communicator::Scatter(const void* send, void* recv, size_t count, DataType dtype, int root) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kScatter));
  TESSERA_RETURN_IF_ERROR(CheckPeer(root, "scatter root"));
  if (!CountOk(count, dtype, size_)) return InvalidArgumentError("scatter: count too large");
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::ScatterDirect(ctx, send, recv, count * DataTypeSize(dtype), root);
}

Status Communicator::AllGather(const void* send, void* recv, size_t count, DataType dtype,
                               AllGatherAlgo algo) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kAllGather));
  if (!CountOk(count, dtype, size_)) return InvalidArgumentError("all_gather: count too large");
  const size_t bytes = count * DataTypeSize(dtype);
  TESSERA_RETURN_IF_ERROR(CheckBlockOverlap("all_gather", send, recv, bytes, size_, rank_));
  if (size_ == 1) {
    if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
    return Status::Ok();
  }
  if (UsesMpi(kMpiAllGather) && bytes <= static_cast<size_t>(INT32_MAX)) {
    const uint64_t moved = static_cast<uint64_t>(size_ - 1) * bytes;
    return RunOnMpi([&] { return mpi_group_->StartAllGather(send, recv, bytes); }, moved, moved);
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  if (ChooseAllGather(bytes, algo) == AllGatherAlgo::kBruck) {
    return algorithms::AllGatherBruck(ctx, send, recv, bytes);
  }
  return algorithms::AllGatherRing(ctx, send, recv, bytes);
}

Status Communicator::ReduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                                   ReduceOp op, ReduceScatterAlgo algo) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kReduceScatter));
  if (!CountOk(count, dtype, size_)) {
    return InvalidArgumentError("reduce_scatter: count too large");
  }
  TESSERA_RETURN_IF_ERROR(
      CheckBlockOverlap("reduce_scatter", recv, send, count * DataTypeSize(dtype), size_, rank_));
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  if (algo == ReduceScatterAlgo::kDeterministic) {
    return algorithms::ReduceScatterDeterministic(ctx, send, recv, count, dtype, op);
  }
  return algorithms::ReduceScatterRing(ctx, send, recv, count, dtype, op);
}

Status Communicator::AllToAll(const void* send, void* recv, size_t count, DataType dtype) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kAllToAll));
  if (!CountOk(count, dtype, size_)) return InvalidArgumentError("all_to_all: count too large");
  const size_t bytes = count * DataTypeSize(dtype);
  if (size_ > 1) {  // in place is not supported
    TESSERA_RETURN_IF_ERROR(CheckBlockOverlap("all_to_all", send, recv, bytes * size_, 1, -1));
  }
  std::vector<size_t> sizes(size_, bytes), offsets(size_);
  for (int p = 0; p < size_; ++p) offsets[p] = static_cast<size_t>(p) * bytes;
  if (UsesMpi(kMpiAllToAll)) return AllToAllvOnMpi(send, sizes, offsets, recv, sizes, offsets);
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::AllToAllvPairwise(ctx, send, sizes, offsets, recv, sizes, offsets);
}

Status Communicator::AllToAllv(const void* send, std::span<const size_t> send_counts,
                               std::span<const size_t> send_displs, void* recv,
                               std::span<const size_t> recv_counts,
                               std::span<const size_t> recv_displs, DataType dtype) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kAllToAllv));
  const size_t n = static_cast<size_t>(size_);
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n ||
      recv_displs.size() != n) {
    return InvalidArgumentError("all_to_allv: counts and displacements need one entry per rank");
  }
  if (send_counts[rank_] != recv_counts[rank_]) {
    return InvalidArgumentError("all_to_allv: send_counts[rank] != recv_counts[rank]");
  }
  const size_t esize = DataTypeSize(dtype);
  std::vector<size_t> sb(n), so(n), rb(n), ro(n);
  for (size_t p = 0; p < n; ++p) {
    for (size_t v : {send_counts[p], send_displs[p], recv_counts[p], recv_displs[p]}) {
      if (!CountOk(v, dtype, 2)) return InvalidArgumentError("all_to_allv: count too large");
    }
    sb[p] = send_counts[p] * esize;
    so[p] = send_displs[p] * esize;
    rb[p] = recv_counts[p] * esize;
    ro[p] = recv_displs[p] * esize;
  }
  if (UsesMpi(kMpiAllToAllv)) return AllToAllvOnMpi(send, sb, so, recv, rb, ro);
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::AllToAllvPairwise(ctx, send, sb, so, recv, rb, ro);
}

Status Communicator::AllToAllvOnMpi(const void* send, std::span<const size_t> send_bytes,
                                    std::span<const size_t> send_offsets, void* recv,
                                    std::span<const size_t> recv_bytes,
                                    std::span<const size_t> recv_offsets) {
  uint64_t sent = 0, received = 0;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    sent += send_bytes[p];
    received += recv_bytes[p];
  }
  return RunOnMpi(
      [&] {
        return mpi_group_->StartAllToAllv(send, send_bytes, send_offsets, recv, recv_bytes,
                                          recv_offsets);
      },
      sent, received);
}

Status Communicator::Barrier() {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kBarrier));
  if (size_ == 1) return Status::Ok();
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  if (messenger_->mailbox_bytes() > 0) return algorithms::BarrierMailbox(ctx);
  return algorithms::BarrierDissemination(ctx);
}

}  // namespace tessera::comm
