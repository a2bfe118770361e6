#include "engine/driver.h"

#include <string>

#include "base/check.h"
#include "parallel/context_shard.h"

namespace tessera::engine {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

}  // namespace

Driver::Driver(StageRunner& runner) : runner_(runner) { TESSERA_CHECK(runner.is_driver()); }

Driver::~Driver() = default;

int64_t Driver::vocab_size() const { return runner_.model().config().vocab_size; }
// Under context parallelism (data-parallel attention) the ids cover every cp (dp)
// rank's cache, rank after rank.
int32_t Driver::num_kv_blocks() const {
  return runner_.cache().num_blocks() * kv_partitions() * attention_ranks();
}
int32_t Driver::kv_partitions() const { return runner_.plan().cp; }
int32_t Driver::attention_ranks() const { return runner_.plan().dp; }

kv::BlockPlacement Driver::kv_placement() const {
  const int cp = runner_.plan().cp;
  if (cp == 1) return {};
  const kernels::KvLayout layout = runner_.cache().shape().layout();
  const int64_t block_size = layout.block_size, span = layout.span;
  return [cp, block_size, span](int64_t index) {
    return parallel::ContextBlockOwner(index, block_size, span, cp);
  };
}
int32_t Driver::kv_block_size() const { return runner_.cache().shape().block_size; }
int Driver::max_in_flight() const { return runner_.plan().pp; }

std::string Driver::kv_cache_salt() const {
  const model::ModelConfig& c = runner_.model().config();
  const kv::KvCacheShape& kv = runner_.cache().shape();
  return c.arch + " " + c.name + " vocab=" + S(c.vocab_size) + " dim=" + S(c.dim) +
         " layers=" + S(c.num_layers) + " heads=" + S(c.num_heads) + "/" + S(c.num_kv_heads) +
         " head_dim=" + S(c.head_dim) + " ffn=" + S(c.ffn_dim) + " experts=" + S(c.num_experts) +
         " rope_theta=" + std::to_string(c.rope_theta) +
         " kv=" + (kv.type == kernels::KvType::kF16 ? "f16" : "f32") + " block=" + S(kv.block_size);
}

Status Driver::Submit(std::span<const StepEntry> entries, bool all_logits) {
  if (stopped_) return InvalidArgumentError("Submit after Shutdown");
  if (static_cast<int>(in_flight_.size()) >= max_in_flight()) {
    return InvalidArgumentError("Submit with " + S(max_in_flight()) + " steps already in flight");
  }
  const Partition& plan = runner_.plan();
  if (!runner_.kv_stream_blocks().empty() && plan.world_size() > 1) {
    // The workers send their share of these blocks' layers inside the step.
    StepMessage stream{.kind = parallel::StepKind::kKvStream,
                       .kv_blocks = std::vector<int32_t>(runner_.kv_stream_blocks().begin(),
                                                         runner_.kv_stream_blocks().end())};
    TESSERA_RETURN_IF_ERROR(SendKvMessage(stream));
  }
  StepMessage m;
  m.step_id = next_step_id_++;
  m.all_logits = all_logits;
  const int64_t block_size = kv_block_size();
  for (const StepEntry& e : entries) {
    TESSERA_CHECK(e.block_table != nullptr);
    m.tokens.insert(m.tokens.end(), e.new_tokens.begin(), e.new_tokens.end());
    parallel::StepSequence& s = m.sequences.emplace_back();
    s.start_position = e.start_position;
    s.num_tokens = static_cast<int32_t>(e.new_tokens.size());
    s.all_logits = e.all_logits;
    const int64_t end = e.start_position + s.num_tokens;
    const std::span<const int32_t> blocks = e.block_table->blocks();
    const size_t needed = static_cast<size_t>((end + block_size - 1) / block_size);
    if (blocks.size() < needed) {
      return InvalidArgumentError("a sequence's block table covers " +
                                  S(static_cast<int64_t>(blocks.size()) * block_size) +
                                  " tokens, the step needs " + S(end));
    }
    s.blocks.assign(blocks.begin(), blocks.begin() + static_cast<ptrdiff_t>(needed));
  }
  m.sequence_parallel = plan.SequenceParallelFor(static_cast<int64_t>(m.tokens.size()));
  // The first stage's ranks get the message (the driver's own stage too when pp = 1).
  for (int lane = 0; lane < plan.lanes(); ++lane) {
    const int to = plan.RankOf(0, lane);
    if (to != runner_.rank()) TESSERA_RETURN_IF_ERROR(runner_.SendStep(m, to));
  }
  if (plan.pp == 1) TESSERA_RETURN_IF_ERROR(runner_.RunStep(m, &logits_));
  in_flight_.push_back(std::move(m));
  return Status::Ok();
}

Result<std::span<const float>> Driver::Collect() {
  if (in_flight_.empty()) return InvalidArgumentError("Collect without a submitted step");
  StepMessage submitted = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (runner_.plan().pp > 1) {
    TESSERA_ASSIGN_OR_RETURN(StepMessage m, runner_.ReceiveStep(runner_.upstream()));
    if (m.step_id != submitted.step_id || m.kind != parallel::StepKind::kStep ||
        m.tokens != submitted.tokens) {
      return InternalError("the pipeline returned step " + S(static_cast<int64_t>(m.step_id)) +
                           " for step " + S(static_cast<int64_t>(submitted.step_id)));
    }
    TESSERA_RETURN_IF_ERROR(runner_.RunStep(m, &logits_));
  }
  return std::span<const float>(logits_);
}

double Driver::last_step_comm_seconds() const { return runner_.last_step_comm_seconds(); }

Result<std::vector<RankReport>> Driver::Shutdown() {
  if (stopped_) return InvalidArgumentError("Shutdown twice");
  if (!in_flight_.empty()) return InvalidArgumentError("Shutdown with steps in flight");
  stopped_ = true;
  return ExchangeReports({.kind = parallel::StepKind::kStop});
}

Result<std::vector<RankReport>> Driver::PollReports() {
  if (stopped_) return InvalidArgumentError("PollReports after Shutdown");
  if (!in_flight_.empty()) return InvalidArgumentError("PollReports with steps in flight");
  return ExchangeReports({.kind = parallel::StepKind::kReport});
}

Result<std::vector<RankReport>> Driver::SetExpertPlacement(
    const parallel::ExpertPlacement& placement) {
  if (stopped_) return InvalidArgumentError("SetExpertPlacement after Shutdown");
  if (!in_flight_.empty()) return InvalidArgumentError("SetExpertPlacement with steps in flight");
  const Partition& plan = runner_.plan();
  const model::ModelConfig& config = runner_.model().config();
  if (plan.ep < 2 || !config.is_moe()) {
    return InvalidArgumentError("an expert placement needs --ep 2 or more on a mixture of experts");
  }
  TESSERA_RETURN_IF_ERROR(parallel::CheckExpertPlacement(placement, config.num_experts, plan.ep,
                                                         plan.ep_redundant, config.num_layers));
  return ExchangeReports({.kind = parallel::StepKind::kPlacement, .placement = placement.ToInts()},
                         [&] { return runner_.SetExpertPlacement(placement); });
}

Result<std::vector<RankReport>> Driver::ExchangeReports(StepMessage request,
                                                        const std::function<Status()>& local) {
  const Partition& plan = runner_.plan();
  const parallel::StepKind kind = request.kind;
  request.step_id = next_step_id_++;
  for (int lane = 0; lane < plan.lanes(); ++lane) {
    const int to = plan.RankOf(0, lane);
    if (to != runner_.rank()) TESSERA_RETURN_IF_ERROR(runner_.SendStep(request, to));
  }
  if (local) TESSERA_RETURN_IF_ERROR(local());
  if (plan.pp > 1) {
    TESSERA_ASSIGN_OR_RETURN(StepMessage m, runner_.ReceiveStep(runner_.upstream()));
    if (m.kind != kind) return InternalError("the pipeline did not drain");
  }
  std::vector<RankReport> reports(static_cast<size_t>(plan.world_size()));
  reports[static_cast<size_t>(runner_.rank())] = runner_.Report();
  for (int r = 0; r < plan.world_size(); ++r) {
    if (r == runner_.rank()) continue;
    TESSERA_ASSIGN_OR_RETURN(reports[static_cast<size_t>(r)], runner_.ReceiveReport(r));
  }
  return reports;
}

Result<kv::KvCacheShape> Driver::whole_kv_shape() const { return runner_.WholeKvShape(); }

Status Driver::SendKvMessage(StepMessage& request) {
  for (const int32_t b : request.kv_blocks) {
    if (b < 0 || b >= runner_.cache().num_blocks()) {
      return InvalidArgumentError("KV block " + S(b) + " is outside the cache's " +
                                  S(runner_.cache().num_blocks()));
    }
  }
  const Partition& plan = runner_.plan();
  request.step_id = next_step_id_++;
  for (int lane = 0; lane < plan.lanes(); ++lane) {
    const int to = plan.RankOf(0, lane);
    if (to != runner_.rank()) TESSERA_RETURN_IF_ERROR(runner_.SendStep(request, to));
  }
  return Status::Ok();
}

Result<std::vector<kv::KvShardSlice>> Driver::BeginKvMove(StepMessage request) {
  if (stopped_) return InvalidArgumentError("KV blocks moved after Shutdown");
  if (!in_flight_.empty()) return InvalidArgumentError("KV blocks moved with steps in flight");
  const Partition& plan = runner_.plan();
  std::vector<kv::KvShardSlice> slices;
  for (int r = 0; r < plan.world_size(); ++r) {
    TESSERA_ASSIGN_OR_RETURN(slices.emplace_back(), runner_.KvSliceOf(r));
  }
  TESSERA_RETURN_IF_ERROR(SendKvMessage(request));
  if (plan.pp > 1) {  // the last stage before the driver's forwards it to the driver too
    TESSERA_ASSIGN_OR_RETURN(StepMessage m, runner_.ReceiveStep(runner_.upstream()));
    if (m.kind != request.kind) return InternalError("the pipeline did not drain");
  }
  return slices;
}

Status Driver::PrepareKvBlocks(std::span<const int32_t> blocks) {
  const Partition& plan = runner_.plan();
  if (stopped_ || !in_flight_.empty() || plan.pp > 1 || plan.cp > 1 || plan.dp > 1) {
    return Status::Ok();
  }
  StepMessage m{.kind = parallel::StepKind::kKvPrepare,
                .kv_blocks = std::vector<int32_t>(blocks.begin(), blocks.end())};
  TESSERA_RETURN_IF_ERROR(SendKvMessage(m));
  return runner_.PrepareKvBlocksAhead(blocks);
}

bool Driver::ObserveKvLayers(std::span<const int32_t> blocks, KvLayerObserver observer) {
  const Partition& plan = runner_.plan();
  if (plan.pp > 1 || plan.cp > 1 || plan.dp > 1) return false;
  if (observer) {
    runner_.StreamKvLayers(blocks, std::move(observer));
  } else {
    runner_.StreamKvLayers({}, nullptr);
  }
  return true;
}

Status Driver::ReadKvBlocks(std::span<const int32_t> blocks, uint8_t* out) {
  TESSERA_ASSIGN_OR_RETURN(
      const std::vector<kv::KvShardSlice> slices,
      BeginKvMove({.kind = parallel::StepKind::kKvRead,
                   .kv_blocks = std::vector<int32_t>(blocks.begin(), blocks.end())}));
  const kv::KvCacheShape whole = runner_.WholeKvShape();
  const size_t whole_bytes = static_cast<size_t>(whole.BytesPerBlock());
  for (int r = 0; r < static_cast<int>(slices.size()); ++r) {
    const kv::KvShardSlice& slice = slices[static_cast<size_t>(r)];
    const size_t bytes = static_cast<size_t>(slice.shape.BytesPerBlock());
    for (size_t i = 0; i < blocks.size(); ++i) {
      const uint8_t* from = nullptr;
      if (r == runner_.rank()) {
        from = runner_.mutable_cache().block_data(blocks[i]);
      } else {
        kv_scratch_.resize(bytes);
        TESSERA_RETURN_IF_ERROR(runner_.ReceiveKvBlock(kv_scratch_.data(), bytes, r));
        from = kv_scratch_.data();
      }
      // A KV head replicated over ranks (tp > KV heads) is written once a rank: equal.
      kv::ShardBlockToWhole(whole, slice, from, out + i * whole_bytes);
    }
  }
  return Status::Ok();
}

Status Driver::WriteKvBlocks(std::span<const int32_t> blocks, const uint8_t* in) {
  TESSERA_ASSIGN_OR_RETURN(
      const std::vector<kv::KvShardSlice> slices,
      BeginKvMove({.kind = parallel::StepKind::kKvWrite,
                   .kv_blocks = std::vector<int32_t>(blocks.begin(), blocks.end())}));
  const kv::KvCacheShape whole = runner_.WholeKvShape();
  const size_t whole_bytes = static_cast<size_t>(whole.BytesPerBlock());
  runner_.PrepareKvBlocks(blocks);
  for (int r = 0; r < static_cast<int>(slices.size()); ++r) {
    const kv::KvShardSlice& slice = slices[static_cast<size_t>(r)];
    const size_t bytes = static_cast<size_t>(slice.shape.BytesPerBlock());
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (r == runner_.rank()) {
        kv::WholeBlockToShard(whole, slice, in + i * whole_bytes,
                              runner_.mutable_cache().block_data(blocks[i]));
        continue;
      }
      kv_scratch_.resize(bytes);
      kv::WholeBlockToShard(whole, slice, in + i * whole_bytes, kv_scratch_.data());
      TESSERA_RETURN_IF_ERROR(runner_.SendKvBlock(kv_scratch_.data(), bytes, r));
    }
  }
  return Status::Ok();
}

}  // namespace tessera::engine
