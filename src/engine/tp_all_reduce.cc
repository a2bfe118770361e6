#include "engine/tp_all_reduce.h"

#include <optional>

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

}  // namespace tessera::engine
