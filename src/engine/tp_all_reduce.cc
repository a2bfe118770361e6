#include "engine/tp_all_reduce.h"

#include <optional>

#include "base/check.h"
#include "base/clock.h"
#include "kernels/matmul.h"

namespace tessera::engine {

Status TpAllReduce::AllReduceSum(std::span<float> data, const model::WeightMatrix* next) {
  const int64_t start = NowNs();
  // While the peers' partial sums are on their way, pull in the start of what
  // this rank multiplies by next: the wait then saves the step some memory time.
  std::optional<kernels::MatMulPrefetcher> prefetch;
  if (next != nullptr && !next->empty() && prefetch_bytes_ > 0 && tp_.AnyTcpPeer()) {
    // data holds rows of next->cols (dim) floats: their count stands for the
    // tokens, which only decide whether the product splits over the pool.
    prefetch.emplace(next->view(), static_cast<int64_t>(data.size()) / next->cols, &pool_,
                     prefetch_bytes_);
    tp_.SetWaitWork([&prefetch] { return prefetch->Step(); });
  }
  Status s = tp_.AllReduce(
      data.data(), data.data(), data.size(), comm::DataType::kF32, comm::ReduceOp::kSum,
      deterministic_ ? comm::AllReduceAlgo::kDeterministic : comm::AllReduceAlgo::kAuto);
  if (prefetch) tp_.SetWaitWork({});
  comm_ns_ += NowNs() - start;
  return s;
}

Status TpAllReduce::ReduceScatterSum(std::span<const float> full, std::span<float> piece) {
  const int64_t start = NowNs();
  TESSERA_CHECK_EQ(full.size(), piece.size() * static_cast<size_t>(tp_.size()));
  Status s = tp_.ReduceScatter(
      full.data(), piece.data(), piece.size(), comm::DataType::kF32, comm::ReduceOp::kSum,
      deterministic_ ? comm::ReduceScatterAlgo::kDeterministic : comm::ReduceScatterAlgo::kAuto);
  comm_ns_ += NowNs() - start;
  return s;
}

Status TpAllReduce::ExpertAllToAllv(std::span<const float> send, std::span<const size_t> rows_to,
                                    std::span<float> recv, std::span<const size_t> rows_from,
                                    int64_t row_floats) {
  if (ep_ == nullptr) return InternalError("expert parallelism without an EP group");
  const int64_t start = NowNs();
  const size_t n = rows_to.size(), w = static_cast<size_t>(row_floats);
  counts_.resize(n);
  displs_.resize(n);
  recv_counts_.resize(n);
  recv_displs_.resize(n);
  size_t send_at = 0, recv_at = 0;
  for (size_t p = 0; p < n; ++p) {
    counts_[p] = rows_to[p] * w;
    displs_[p] = send_at;
    send_at += counts_[p];
    recv_counts_[p] = rows_from[p] * w;
    recv_displs_[p] = recv_at;
    recv_at += recv_counts_[p];
  }
  TESSERA_CHECK(send_at <= send.size() && recv_at <= recv.size());
  Status s = ep_->AllToAllv(send.data(), counts_, displs_, recv.data(), recv_counts_, recv_displs_,
                            comm::DataType::kF32);
  comm_ns_ += NowNs() - start;
  return s;
}

Status TpAllReduce::ExpertAllToAllCounts(std::span<const int64_t> send, std::span<int64_t> recv) {
  if (ep_ == nullptr) return InternalError("data-parallel attention without an EP group");
  const size_t ranks = static_cast<size_t>(ep_->size());
  TESSERA_CHECK(send.size() == recv.size() && send.size() % ranks == 0);
  const int64_t start = NowNs();
  Status s = ep_->AllToAll(send.data(), recv.data(), send.size() / ranks, comm::DataType::kI64);
  comm_ns_ += NowNs() - start;
  return s;
}

Status TpAllReduce::AllGatherBlocks(std::span<float> data, size_t block) {
  const int64_t start = NowNs();
  TESSERA_CHECK_EQ(data.size(), block * static_cast<size_t>(tp_.size()));
  Status s = tp_.AllGather(data.data() + block * static_cast<size_t>(tp_.rank()), data.data(),
                           block, comm::DataType::kF32);
  comm_ns_ += NowNs() - start;
  return s;
}

Status TpAllReduce::ContextRingStart(std::span<const float> send, std::span<float> recv) {
  if (cp_ == nullptr) return InternalError("context parallelism without a cp group");
  constexpr int kRingTag = 1;  // the cp group's only point-to-point traffic
  const int64_t start = NowNs();
  const int n = cp_->size(), me = cp_->rank();
  ring_expected_ = recv.size_bytes();
  Result<comm::Request> r = cp_->Irecv(recv.data(), recv.size_bytes(), (me + n - 1) % n, kRingTag);
  Status status = r.status();
  if (r.ok()) {
    ring_[1] = std::move(*r);
    Result<comm::Request> s = cp_->Isend(send.data(), send.size_bytes(), (me + 1) % n, kRingTag);
    status = s.status();
    if (s.ok()) ring_[0] = std::move(*s);
  }
  comm_ns_ += NowNs() - start;
  return status;
}

Status TpAllReduce::ContextRingProgress() {
  const int64_t start = NowNs();
  Status status;
  for (comm::Request& r : ring_) {
    if (!r.valid()) continue;
    Result<bool> done = r.Test();
    if (!done.ok()) {
      status = done.status();
      break;
    }
  }
  comm_ns_ += NowNs() - start;
  return status;
}

Status TpAllReduce::ContextRingWait() {
  const int64_t start = NowNs();
  Status s = cp_->WaitAll(ring_);
  comm_ns_ += NowNs() - start;
  TESSERA_RETURN_IF_ERROR(s);
  if (ring_[1].received_bytes() != ring_expected_) {
    return InvalidArgumentError(
        "context-parallel ring: " + std::to_string(ring_[1].received_bytes()) +
        " bytes from the previous cp rank, the step needs " + std::to_string(ring_expected_));
  }
  ring_[0] = {};
  ring_[1] = {};
  return Status::Ok();
}

Status TpAllReduce::ContextAllGatherBlocks(std::span<float> data, size_t block) {
  TESSERA_CHECK(cp_ != nullptr) << "context all-gather without a cp group";
  const int64_t start = NowNs();
  TESSERA_CHECK_EQ(data.size(), block * static_cast<size_t>(cp_->size()));
  Status s = cp_->AllGather(data.data() + block * static_cast<size_t>(cp_->rank()), data.data(),
                            block, comm::DataType::kF32);
  comm_ns_ += NowNs() - start;
  return s;
}

}  // namespace tessera::engine
