#include "engine/stage_runner.h"

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/populate.h"
#include "kv/block_table.h"
#include "model/shard.h"
#include "parallel/context_shard.h"

namespace tessera::engine {

using parallel::DecodeStep;
using parallel::EncodedStep;
using parallel::EncodeStep;
using parallel::kStepHeaderBytes;
using parallel::StepKind;
using parallel::StepPayloadBytes;
using parallel::StepSequence;

namespace {

// Tags on the ctl group (step messages, reports) and the pp group (activations).
constexpr int kStepHeaderTag = 1;
constexpr int kStepPayloadTag = 2;
constexpr int kReportSizeTag = 3;
constexpr int kReportTag = 4;
constexpr int kActivationTag = 1;
constexpr int kLogitsTag = 5;
constexpr int kKvLayerTag = 7;  // a worker's share of one layer of streamed blocks, ctl group
constexpr int kKvBlockTag = 6;  // kKvRead / kKvWrite blocks, on the ctl group  // data-parallel
                                // attention: a dp rank's logits, on the ep group

std::string S(int64_t v) { return std::to_string(v); }

std::string RankName(int rank) { return "rank " + S(rank); }

void AddLedger(std::map<std::string, comm::LedgerEntry>& out, const comm::Communicator* c,
               const std::string& group) {
  if (c == nullptr) return;
  for (size_t p = 0; p < static_cast<size_t>(comm::Primitive::kCount); ++p) {
    const comm::LedgerEntry& e = c->ledger().entry(static_cast<comm::Primitive>(p));
    if (e.calls == 0) continue;
    out[group + "/" + std::string(comm::PrimitiveName(static_cast<comm::Primitive>(p)))] = e;
  }
}

}  // namespace

Result<kv::KvCache> CreateKvCache(const model::LlamaModel& model, kernels::KvType type,
                                  int32_t block_size, int64_t kv_capacity_tokens) {
  const model::ModelConfig& config = model.local_config();
  const int64_t context = kv_capacity_tokens > 0 ? kv_capacity_tokens : config.context_length;
  kv::KvCacheShape shape{.num_layers = static_cast<int32_t>(config.num_layers),
                         .num_kv_heads = static_cast<int32_t>(config.num_kv_heads),
                         .head_dim = static_cast<int32_t>(config.head_dim),
                         .block_size = block_size,
                         .type = type};
  TESSERA_RETURN_IF_ERROR(kv::ValidateKvCacheShape(shape));
  const int64_t num_blocks = kv::BlocksForTokens(context, block_size);
  if (num_blocks > INT32_MAX) return InvalidArgumentError("KV context too large");
  return kv::KvCache::Create(shape, static_cast<int32_t>(num_blocks));
}

Result<std::unique_ptr<StageRunner>> StageRunner::Create(const Partition& plan, int rank,
                                                         Groups groups, const model::GgufFile& file,
                                                         ThreadPool& pool,
                                                         const RuntimeOptions& options) {
  if (plan.world_size() > 1 &&
      (groups.tp == nullptr || groups.pp == nullptr || groups.ctl == nullptr)) {
    return InvalidArgumentError("a parallel plan of " + S(plan.world_size()) +
                                " ranks needs groups");
  }
  RuntimeOptions resolved = options;
  if (resolved.tp_prefetch_bytes < 0) {
    TESSERA_ASSIGN_OR_RETURN(resolved.tp_prefetch_bytes,
                             EnvIntOr("TESSERA_TP_PREFETCH_BYTES", kDefaultTpPrefetchBytes));
  }
  TESSERA_ASSIGN_OR_RETURN(model::LlamaModel llama,
                           model::LlamaModel::Load(file, model::ShardOf(plan, rank)));
  auto model = std::make_unique<model::LlamaModel>(std::move(llama));
  TESSERA_ASSIGN_OR_RETURN(
      kv::KvCache cache,
      CreateKvCache(*model, options.kv_type, options.block_size, options.kv_capacity_tokens));
  auto owned_cache = std::make_unique<kv::KvCache>(std::move(cache));
  std::unique_ptr<StageRunner> runner(
      new StageRunner(plan, rank, std::move(groups), pool, resolved, *model, *owned_cache));
  runner->owned_model_ = std::move(model);
  runner->file_ = &file;
  runner->owned_cache_ = std::move(owned_cache);
  return runner;
}

Result<std::unique_ptr<StageRunner>> StageRunner::CreateLocal(const model::LlamaModel& model,
                                                              kv::KvCache& cache, ThreadPool& pool,
                                                              const RuntimeOptions& options) {
  const model::ShardLayout& layout = model.layout();
  if (!layout.first_stage || !layout.last_stage || layout.tp_size != 1) {
    return InvalidArgumentError("a one-rank runner needs the whole model, not a shard");
  }
  const kv::KvCacheShape& shape = cache.shape();
  const model::ModelConfig& config = model.local_config();
  if (shape.num_layers != config.num_layers || shape.num_kv_heads != config.num_kv_heads ||
      shape.head_dim != config.head_dim) {
    return InvalidArgumentError("the KV cache's shape does not match the model");
  }
  Partition plan;
  plan.stage_layers = {{0, config.num_layers}};
  plan.stage_bytes = {model.weights().decode_bytes_per_token};
  RuntimeOptions resolved = options;
  resolved.tp_prefetch_bytes = 0;  // no tp peers
  return std::unique_ptr<StageRunner>(
      new StageRunner(plan, 0, Groups{}, pool, resolved, model, cache));
}

StageRunner::StageRunner(const Partition& plan, int rank, Groups groups, ThreadPool& pool,
                         const RuntimeOptions& options, const model::LlamaModel& model,
                         kv::KvCache& cache)
    : plan_(plan),
      rank_(rank),
      stage_(plan.StageOf(rank)),
      tp_rank_(plan.TpRankOf(rank)),
      cp_rank_(plan.CpRankOf(rank)),
      dp_rank_(plan.DpRankOf(rank)),
      groups_(std::move(groups)),
      pool_(pool),
      options_(options),
      model_(&model),
      cache_(cache) {
  for (int32_t l = 0; l < cache_.shape().num_layers; ++l) {
    kv_layers_.push_back({cache_.k_pool(l), cache_.v_pool(l)});
  }
  if (plan_.tp > 1 || plan_.cp > 1 || plan_.dp > 1) {
    tp_all_reduce_ = std::make_unique<TpAllReduce>(*groups_.tp, pool_, options_.deterministic,
                                                   options_.tp_prefetch_bytes);
    if (plan_.ep > 1) tp_all_reduce_->SetExpertGroup(groups_.ep.get());
    if (plan_.cp > 1) tp_all_reduce_->SetContextGroup(groups_.cp.get());
  }
  if (model_->config().is_moe()) {
    expert_rows_total_.assign(static_cast<size_t>(model_->config().num_experts), 0);
    if (plan_.ep > 1) {
      expert_rows_by_layer_.assign(
          static_cast<size_t>(model_->local_config().num_layers * model_->config().num_experts), 0);
    }
  }
  // Step messages name blocks of the group's pool: cp (dp) rank r's are [r, r + 1) × its own.
  limits_.num_blocks = int64_t{cache_.num_blocks()} * plan_.cp * plan_.dp;
  limits_.max_tokens = options_.max_step_tokens > 0 ? options_.max_step_tokens : cache_.num_slots();
  limits_.max_sequences = options_.max_step_sequences;
  limits_.vocab_size = model_->config().vocab_size;
  header_buf_.resize(kStepHeaderBytes);
  record_traffic_ = options_.record_traffic;
}

// Maps KV blocks' pages on its own thread, in the order asked.
class StageRunner::BlockMapper {
 public:
  explicit BlockMapper(kv::KvCache& cache) : cache_(cache), thread_([this] { Loop(); }) {}
  ~BlockMapper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Map(std::span<const int32_t> blocks) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.insert(queue_.end(), blocks.begin(), blocks.end());
    }
    cv_.notify_all();
  }

 private:
  void Loop() {
    const size_t bytes = static_cast<size_t>(cache_.shape().BytesPerBlock());
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      std::deque<int32_t> blocks;
      std::swap(blocks, queue_);
      lock.unlock();
      for (const int32_t b : blocks) PopulateForWrite(cache_.block_data(b), bytes);
      lock.lock();
    }
  }

  kv::KvCache& cache_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int32_t> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

StageRunner::~StageRunner() { mapper_.reset(); }

int StageRunner::upstream() const {
  return stage_ == 0 ? plan_.driver_rank() : plan_.RankOf(stage_ - 1, plan_.LaneOf(rank_));
}

int StageRunner::downstream() const { return plan_.RankOf(stage_ + 1, plan_.LaneOf(rank_)); }

Status StageRunner::LocalBlocks(std::span<const int32_t> blocks,
                                std::vector<int32_t>& local) const {
  const kernels::KvLayout layout = cache_.shape().layout();
  const int64_t per_rank = cache_.num_blocks();
  local.resize(blocks.size());
  for (size_t j = 0; j < blocks.size(); ++j) {
    const int owner = parallel::ContextBlockOwner(static_cast<int64_t>(j), layout.block_size,
                                                  layout.span, plan_.cp);
    if (owner != cp_rank_) {
      local[j] = -1;  // another cp rank's block: never read here
      continue;
    }
    const int64_t id = blocks[j] - int64_t{cp_rank_} * per_rank;
    if (id < 0 || id >= per_rank) {
      return InvalidArgumentError("KV block " + S(blocks[j]) + " at index " +
                                  S(static_cast<int64_t>(j)) + " is not in cp rank " + S(cp_rank_) +
                                  "'s pool [" + S(cp_rank_ * per_rank) + ", " +
                                  S((cp_rank_ + 1) * per_rank) + ")");
    }
    local[j] = static_cast<int32_t>(id);
  }
  return Status::Ok();
}

Result<int> StageRunner::AttentionRankOf(const StepSequence& sequence, size_t index) const {
  const int64_t per_rank = cache_.num_blocks();
  if (sequence.blocks.empty()) {
    return InvalidArgumentError("sequence " + S(static_cast<int64_t>(index)) +
                                " of the step has no KV block");
  }
  const int64_t owner = sequence.blocks[0] / per_rank;  // DecodeStep bounds every id
  for (const int32_t block : sequence.blocks) {
    if (block / per_rank != owner) {
      return InvalidArgumentError("sequence " + S(static_cast<int64_t>(index)) +
                                  " of the step has KV blocks of dp ranks " + S(owner) + " and " +
                                  S(block / per_rank) + ": a sequence lives on one dp rank");
    }
  }
  return static_cast<int>(owner);
}

Status StageRunner::SendStep(const StepMessage& message, int to) {
  const EncodedStep encoded = EncodeStep(message);
  const int64_t start = NowNs();
  TESSERA_RETURN_IF_ERROR(
      groups_.ctl->Send(encoded.header.data(), encoded.header.size(), to, kStepHeaderTag));
  if (!encoded.payload.empty()) {
    TESSERA_RETURN_IF_ERROR(
        groups_.ctl->Send(encoded.payload.data(), encoded.payload.size(), to, kStepPayloadTag));
  }
  comm_ns_ += NowNs() - start;
  return Status::Ok();
}

Result<StepMessage> StageRunner::ReceiveStep(int from, bool idle) {
  const int64_t start = NowNs();
  Result<StepMessage> message = ReceiveStepMessage(from, idle);
  pending_wait_ns_ += NowNs() - start;
  return message;
}

Result<StepMessage> StageRunner::ReceiveStepMessage(int from, bool idle) {
  size_t received = 0;
  comm::Communicator& ctl = *groups_.ctl;
  const int64_t timeout_ms = ctl.options().timeout_ms;
  if (idle) ctl.set_timeout_ms(0);
  Status header = ctl.Recv(header_buf_.data(), header_buf_.size(), from, kStepHeaderTag, &received);
  if (idle) ctl.set_timeout_ms(timeout_ms);
  TESSERA_RETURN_IF_ERROR(header);
  header_buf_.resize(received);
  const std::string who = RankName(from);
  TESSERA_ASSIGN_OR_RETURN(size_t payload_bytes, StepPayloadBytes(header_buf_, limits_, who));
  payload_buf_.resize(payload_bytes);
  if (payload_bytes > 0) {
    TESSERA_RETURN_IF_ERROR(
        groups_.ctl->Recv(payload_buf_.data(), payload_bytes, from, kStepPayloadTag, &received));
    if (received != payload_bytes) {
      return InvalidArgumentError("step payload from " + who + " is " + S(received) +
                                  " bytes, its header says " + S(payload_bytes));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(StepMessage message,
                           DecodeStep(header_buf_, payload_buf_, limits_, who));
  header_buf_.resize(kStepHeaderBytes);
  if (message.step_id != expected_step_id_) {
    return InvalidArgumentError("step message " + S(static_cast<int64_t>(message.step_id)) +
                                " from " + who + " out of order: expected " +
                                S(static_cast<int64_t>(expected_step_id_)));
  }
  ++expected_step_id_;
  return message;
}

std::map<std::string, comm::LedgerEntry> StageRunner::LedgerSnapshot() const {
  std::map<std::string, comm::LedgerEntry> out;
  AddLedger(out, groups_.tp.get(), "tp");
  AddLedger(out, groups_.pp.get(), "pp");
  AddLedger(out, groups_.ep.get(), "ep");
  AddLedger(out, groups_.cp.get(), "cp");
  return out;
}

Status StageRunner::RunStep(const StepMessage& m, std::vector<float>* logits) {
  // A worker streams one step's layers (a kKvStream message names the blocks before each).
  struct ClearStream {
    StageRunner* runner;
    ~ClearStream() {
      if (!runner->is_driver()) runner->kv_stream_blocks_.clear();
    }
  } clear_stream{this};
  const int64_t start = NowNs();
  comm_ns_ = 0;
  int64_t wait_ns = 0;
  const auto before =
      record_traffic_ ? LedgerSnapshot() : std::map<std::string, comm::LedgerEntry>();

  std::vector<model::ForwardSequence> sequences;
  sequences.reserve(m.sequences.size());
  bool decode = true;
  int64_t context = 0;
  if (plan_.cp > 1 || plan_.dp > 1) {
    local_tables_.resize(std::max(local_tables_.size(), m.sequences.size()));
  }
  dp_owner_.clear();
  dp_tokens_.clear();
  size_t token_at = 0;  // the sequence's first new token in m.tokens
  for (size_t i = 0; i < m.sequences.size(); ++i) {
    const StepSequence& s = m.sequences[i];
    token_at += static_cast<size_t>(s.num_tokens);
    std::span<const int32_t> blocks = s.blocks;
    if (plan_.cp > 1) {
      TESSERA_RETURN_IF_ERROR(LocalBlocks(s.blocks, local_tables_[i]));
      blocks = local_tables_[i];
    } else if (plan_.dp > 1) {
      // Only this rank's sequences run here, over its own cache.
      TESSERA_ASSIGN_OR_RETURN(const int owner, AttentionRankOf(s, i));
      dp_owner_.push_back(owner);
      if (owner != dp_rank_) continue;
      const int32_t base = cache_.num_blocks() * dp_rank_;
      std::vector<int32_t>& local = local_tables_[i];
      local.resize(s.blocks.size());
      for (size_t j = 0; j < s.blocks.size(); ++j) local[j] = s.blocks[j] - base;
      blocks = local;
      const auto first = m.tokens.begin() + static_cast<ptrdiff_t>(token_at - s.num_tokens);
      dp_tokens_.insert(dp_tokens_.end(), first, first + s.num_tokens);
    }
    sequences.push_back({.num_tokens = s.num_tokens,
                         .start_position = s.start_position,
                         .block_table = blocks,
                         .all_logits = s.all_logits});
    decode = decode && s.num_tokens == 1;
    context += s.start_position;
    cache_.PrepareWrite(blocks, s.start_position, s.num_tokens);
  }
  if (m.sequence_parallel && !plan_.sp) {
    return InvalidArgumentError("step " + S(static_cast<int64_t>(m.step_id)) +
                                " asks for sequence parallelism, which this plan does not run");
  }
  const model::ForwardBatch batch{
      .tokens =
          plan_.dp > 1 ? std::span<const int32_t>(dp_tokens_) : std::span<const int32_t>(m.tokens),
      .sequences = sequences,
      .all_logits = m.all_logits,
      .sequence_parallel = m.sequence_parallel,
      .on_layer_kv = kv_stream_blocks_.empty() ? nullptr : &kv_layer_hook_};
  const model::KvView kv{
      .layers = kv_layers_, .layout = cache_.shape().layout(), .num_blocks = cache_.num_blocks()};
  TESSERA_RETURN_IF_ERROR(model_->BeginStep(batch, kv, scratch_));
  const size_t activation_bytes = model_->ActivationBytes(batch, scratch_);
  if (stage_ == 0) {
    TESSERA_RETURN_IF_ERROR(model_->Embed(batch, scratch_, tp_all_reduce_.get()));
  } else {
    const int64_t t = NowNs();
    size_t received = 0;
    TESSERA_RETURN_IF_ERROR(groups_.pp->Recv(scratch_.x.data(), activation_bytes, stage_ - 1,
                                             kActivationTag, &received));
    if (received != activation_bytes) {
      return InvalidArgumentError("activations from " + RankName(upstream()) + " are " +
                                  S(received) + " bytes, the step needs " + S(activation_bytes));
    }
    wait_ns += NowNs() - t;
  }
  std::fill(scratch_.expert_rows_step.begin(), scratch_.expert_rows_step.end(), 0);
  std::fill(scratch_.expert_rows_layer_step.begin(), scratch_.expert_rows_layer_step.end(), 0);
  scratch_.ep_rows_sent_step = scratch_.ep_rows_received_step = 0;
  scratch_.expert_rows_computed_step = 0;
  TESSERA_RETURN_IF_ERROR(model_->RunLayers(batch, kv, scratch_, pool_, tp_all_reduce_.get()));
  expert_rows_computed_ += scratch_.expert_rows_computed_step;
  for (size_t e = 0; e < scratch_.expert_rows_step.size() && e < expert_rows_total_.size(); ++e) {
    expert_rows_total_[e] += scratch_.expert_rows_step[e];
  }
  for (size_t i = 0; i < scratch_.expert_rows_layer_step.size() && i < expert_rows_by_layer_.size();
       ++i) {
    expert_rows_by_layer_[i] += scratch_.expert_rows_layer_step[i];
  }
  if (stage_ < plan_.pp - 1) {
    TESSERA_RETURN_IF_ERROR(SendStep(m, downstream()));
    const int64_t t = NowNs();
    TESSERA_RETURN_IF_ERROR(
        groups_.pp->Send(scratch_.x.data(), activation_bytes, stage_ + 1, kActivationTag));
    comm_ns_ += NowNs() - t;
  } else {
    TESSERA_RETURN_IF_ERROR(
        model_->Head(batch, scratch_, pool_, head_logits_, tp_all_reduce_.get()));
    TESSERA_RETURN_IF_ERROR(plan_.dp > 1 ? GatherLogitsByRank(m, logits) : GatherLogits(logits));
  }

  if (tp_all_reduce_ != nullptr) comm_ns_ += tp_all_reduce_->TakeCommNs();
  const int64_t total = NowNs() - start + pending_wait_ns_;
  wait_ns += pending_wait_ns_;
  pending_wait_ns_ = 0;
  TimeShare& share = decode ? decode_ : prefill_;
  ++share.steps;
  share.comm_ns += comm_ns_;
  last_comm_ns_ = comm_ns_;
  share.wait_ns += wait_ns;
  share.compute_ns += total - comm_ns_ - wait_ns;
  if (record_traffic_) {
    // Under data-parallel attention: this rank's share of the step.
    StepTraffic t{.step_id = m.step_id,
                  .decode = decode,
                  .sequences = static_cast<int64_t>(sequences.size()),
                  .tokens = static_cast<int64_t>(batch.tokens.size()),
                  .context = context,
                  .logit_rows = static_cast<int64_t>(scratch_.logit_rows.size())};
    for (const auto& [key, after] : LedgerSnapshot()) {
      comm::LedgerEntry delta = after;
      if (auto it = before.find(key); it != before.end()) {
        delta.calls -= it->second.calls;
        delta.bytes_sent -= it->second.bytes_sent;
        delta.bytes_received -= it->second.bytes_received;
      }
      if (delta.calls > 0) t.bytes[key] = delta;
    }
    t.ep_rows_sent = scratch_.ep_rows_sent_step;
    t.expert_rows_computed = scratch_.expert_rows_computed_step;
    t.ep_rows_received = scratch_.ep_rows_received_step;
    t.expert_rows = scratch_.expert_rows_step;
    traffic_.push_back(std::move(t));
  }
  return Status::Ok();
}

Status StageRunner::GatherLogits(std::vector<float>* logits) {
  const model::ShardLayout& layout = model_->layout();
  const size_t rows = scratch_.logit_rows.size();
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  if (plan_.tp == 1) {
    if (logits != nullptr) logits->swap(head_logits_);
    return Status::Ok();
  }
  // Each rank's rows padded to the common vocab block, gathered to tp rank 0.
  const size_t block = static_cast<size_t>(layout.vocab_block);
  const size_t held = static_cast<size_t>(layout.vocab.size());
  std::vector<float>& padded = scratch_.head_in;  // free after Head
  padded.assign(rows * block, 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    std::copy_n(head_logits_.data() + r * held, held, padded.data() + r * block);
  }
  if (tp_rank_ == 0) gathered_.resize(static_cast<size_t>(plan_.tp) * rows * block);
  const int64_t start = NowNs();
  Status s = groups_.tp->Gather(padded.data(), tp_rank_ == 0 ? gathered_.data() : nullptr,
                                rows * block, comm::DataType::kF32, 0);
  comm_ns_ += NowNs() - start;
  TESSERA_RETURN_IF_ERROR(s);
  if (logits == nullptr) return Status::Ok();
  logits->resize(rows * vocab);
  for (int t = 0; t < plan_.tp; ++t) {
    const size_t begin = std::min(vocab, block * static_cast<size_t>(t));
    const size_t len = std::min(vocab, block * static_cast<size_t>(t + 1)) - begin;
    for (size_t r = 0; r < rows; ++r) {
      std::copy_n(gathered_.data() + (static_cast<size_t>(t) * rows + r) * block, len,
                  logits->data() + r * vocab + begin);
    }
  }
  return Status::Ok();
}

Status StageRunner::GatherLogitsByRank(const StepMessage& m, std::vector<float>* logits) {
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  comm::Communicator& group = *groups_.ep;  // the stage's dp ranks, by dp rank
  const int64_t start = NowNs();
  if (dp_rank_ != 0) {
    Status s =
        head_logits_.empty()
            ? Status::Ok()
            : group.Send(head_logits_.data(), head_logits_.size() * sizeof(float), 0, kLogitsTag);
    comm_ns_ += NowNs() - start;
    return s;
  }
  // Each sequence's logits rows, and where each rank's rows start in gathered_.
  std::vector<size_t> rows_of(m.sequences.size()), rank_rows(static_cast<size_t>(plan_.dp), 0);
  for (size_t i = 0; i < m.sequences.size(); ++i) {
    const StepSequence& s = m.sequences[i];
    rows_of[i] = m.all_logits || s.all_logits ? static_cast<size_t>(s.num_tokens) : 1;
    rank_rows[static_cast<size_t>(dp_owner_[i])] += rows_of[i];
  }
  std::vector<size_t> cursor(static_cast<size_t>(plan_.dp), 0);
  size_t total = 0;
  for (int r = 0; r < plan_.dp; ++r) {
    cursor[static_cast<size_t>(r)] = total;
    total += rank_rows[static_cast<size_t>(r)];
  }
  if (head_logits_.size() != rank_rows[0] * vocab) {
    return InternalError("the driver computed " + S(static_cast<int64_t>(head_logits_.size())) +
                         " logits, its sequences want " +
                         S(static_cast<int64_t>(rank_rows[0] * vocab)));
  }
  gathered_.resize(total * vocab);
  std::copy(head_logits_.begin(), head_logits_.end(), gathered_.begin());
  for (int r = 1; r < plan_.dp; ++r) {
    const size_t bytes = rank_rows[static_cast<size_t>(r)] * vocab * sizeof(float);
    if (bytes == 0) continue;
    size_t received = 0;
    TESSERA_RETURN_IF_ERROR(group.Recv(gathered_.data() + cursor[static_cast<size_t>(r)] * vocab,
                                       bytes, r, kLogitsTag, &received));
    if (received != bytes) {
      return InvalidArgumentError("dp rank " + S(r) + " sent " + S(static_cast<int64_t>(received)) +
                                  " bytes of logits, the step needs " +
                                  S(static_cast<int64_t>(bytes)));
    }
  }
  comm_ns_ += NowNs() - start;
  if (logits == nullptr) return Status::Ok();
  logits->resize(total * vocab);
  size_t out = 0;
  for (size_t i = 0; i < m.sequences.size(); ++i) {
    size_t& at = cursor[static_cast<size_t>(dp_owner_[i])];
    std::copy_n(gathered_.data() + at * vocab, rows_of[i] * vocab, logits->data() + out * vocab);
    at += rows_of[i];
    out += rows_of[i];
  }
  return Status::Ok();
}

Status StageRunner::SetExpertPlacement(const parallel::ExpertPlacement& placement) {
  if (owned_model_ == nullptr || plan_.ep < 2) {
    return InvalidArgumentError("an expert placement needs a runner of an --ep plan");
  }
  TESSERA_RETURN_IF_ERROR(owned_model_->SetExpertPlacement(*file_, placement)
                              .WithContext("rank " + S(rank_) + " re-placing its experts"));
  plan_.expert_placement = placement;
  return Status::Ok();
}

RankReport StageRunner::Report() const {
  RankReport report;
  report.rank = rank_;
  report.stage = stage_;
  report.tp_rank = tp_rank_;
  report.weight_bytes = model_->weights().total_bytes;
  report.kv_bytes = cache_.size_bytes();
  report.peak_rss_bytes = PeakRssBytes();
  report.activation_bytes = scratch_.CapacityBytes();
  if (groups_.ctl != nullptr) {
    for (int r = 0; r < groups_.ctl->size(); ++r) {
      const std::string link = groups_.ctl->TransportTo(r);
      if (r > 0) report.links += ' ';
      report.links += link.substr(0, link.find(' '));
    }
  }
  report.decode = decode_;
  report.prefill = prefill_;
  report.expert_rows_total = expert_rows_total_;
  report.expert_rows_by_layer = expert_rows_by_layer_;
  report.expert_rows_computed = expert_rows_computed_;
  report.traffic = traffic_;
  report.ledger = LedgerSnapshot();
  AddLedger(report.ledger, groups_.ctl.get(), "ctl");
  return report;
}

Status StageRunner::SendReport(int to) {
  const std::vector<int64_t> words = EncodeRankReport(Report());
  const uint64_t size = words.size();
  comm::Communicator& ctl = *groups_.ctl;
  TESSERA_RETURN_IF_ERROR(ctl.Send(&size, sizeof(size), to, kReportSizeTag));
  return ctl.Send(words.data(), words.size() * sizeof(int64_t), to, kReportTag);
}

Result<RankReport> StageRunner::ReceiveReport(int from) {
  comm::Communicator& ctl = *groups_.ctl;
  uint64_t size = 0;
  TESSERA_RETURN_IF_ERROR(ctl.Recv(&size, sizeof(size), from, kReportSizeTag));
  if (size > (uint64_t{1} << 26))
    return InvalidArgumentError("oversized report from rank " + S(from));
  std::vector<int64_t> words(size);
  size_t received = 0;
  TESSERA_RETURN_IF_ERROR(
      ctl.Recv(words.data(), size * sizeof(int64_t), from, kReportTag, &received));
  if (received != size * sizeof(int64_t)) {
    return InvalidArgumentError("short report from rank " + S(from));
  }
  return DecodeRankReport(words);
}

kv::KvCacheShape StageRunner::WholeKvShape() const {
  const model::ModelConfig& config = model_->config();
  kv::KvCacheShape whole = cache_.shape();
  whole.num_layers = static_cast<int32_t>(config.num_layers);
  whole.num_kv_heads = static_cast<int32_t>(config.num_kv_heads);
  return whole;
}

Result<kv::KvShardSlice> StageRunner::KvSliceOf(int rank) const {
  if (rank < 0 || rank >= plan_.world_size()) {
    return InvalidArgumentError("no rank " + S(rank) + " in " + plan_.ToString());
  }
  const model::ModelShard shard = model::ShardOf(plan_, rank);
  if (shard.cp_size > 1 || shard.dp_attention) {
    return InvalidArgumentError(
        "KV blocks cannot be moved whole under context parallelism or data-parallel attention "
        "(a rank's blocks hold other positions): " +
        plan_.ToString());
  }
  TESSERA_ASSIGN_OR_RETURN(model::ShardLayout layout, model::ResolveShard(model_->config(), shard));
  kv::KvShardSlice slice;
  slice.shape = cache_.shape();
  slice.shape.num_layers = static_cast<int32_t>(layout.layers.size());
  slice.shape.num_kv_heads = static_cast<int32_t>(layout.kv_heads.size());
  slice.layer_begin = static_cast<int32_t>(layout.layers.begin);
  slice.kv_head_begin = static_cast<int32_t>(layout.kv_heads.begin);
  TESSERA_RETURN_IF_ERROR(kv::CheckShardSlice(WholeKvShape(), slice));
  return slice;
}

Status StageRunner::SendKvBlock(const uint8_t* data, size_t bytes, int to) {
  const int64_t start = NowNs();
  Status sent = groups_.ctl->Send(data, bytes, to, kKvBlockTag);
  comm_ns_ += NowNs() - start;
  return sent;
}

Status StageRunner::ReceiveKvBlock(uint8_t* data, size_t bytes, int from) {
  const int64_t start = NowNs();
  size_t received = 0;
  Status status = groups_.ctl->Recv(data, bytes, from, kKvBlockTag, &received);
  comm_ns_ += NowNs() - start;
  TESSERA_RETURN_IF_ERROR(status);
  if (received != bytes) {
    return InvalidArgumentError("a KV block from " + RankName(from) + " of " + S(received) +
                                " bytes where " + S(bytes) + " were due");
  }
  return Status::Ok();
}

Status StageRunner::SendKvBlocks(std::span<const int32_t> blocks, int to) {
  const size_t bytes = static_cast<size_t>(cache_.shape().BytesPerBlock());
  for (const int32_t b : blocks) {
    if (b < 0 || b >= cache_.num_blocks()) {
      return InvalidArgumentError("KV block " + S(b) + " is outside this rank's cache");
    }
    TESSERA_RETURN_IF_ERROR(SendKvBlock(cache_.block_data(b), bytes, to));
  }
  return Status::Ok();
}

Status StageRunner::ReceiveKvBlocks(std::span<const int32_t> blocks, int from) {
  const size_t bytes = static_cast<size_t>(cache_.shape().BytesPerBlock());
  for (const int32_t b : blocks) {
    if (b < 0 || b >= cache_.num_blocks()) {
      return InvalidArgumentError("KV block " + S(b) + " is outside this rank's cache");
    }
  }
  PrepareKvBlocks(blocks);
  for (const int32_t b : blocks) {
    TESSERA_RETURN_IF_ERROR(ReceiveKvBlock(cache_.block_data(b), bytes, from));
  }
  return Status::Ok();
}

Status StageRunner::PrepareKvBlocksAhead(std::span<const int32_t> blocks) {
  for (const int32_t b : blocks) {
    if (b < 0 || b >= cache_.num_blocks()) {
      return InvalidArgumentError("KV block " + S(b) + " is outside this rank's cache");
    }
  }
  if (!mapper_) mapper_ = std::make_unique<BlockMapper>(cache_);
  mapper_->Map(blocks);
  return Status::Ok();
}

void StageRunner::StreamKvLayers(std::span<const int32_t> blocks, KvLayerObserver observer) {
  kv_stream_blocks_.assign(blocks.begin(), blocks.end());
  kv_layer_observer_ = std::move(observer);
  if (!kv_layer_observer_) kv_stream_blocks_.clear();
}

Status StageRunner::StreamKvLayersNextStep(std::span<const int32_t> blocks) {
  for (const int32_t b : blocks) {
    if (b < 0 || b >= cache_.num_blocks()) {
      return InvalidArgumentError("KV block " + S(b) + " is outside this rank's cache");
    }
  }
  kv_stream_blocks_.assign(blocks.begin(), blocks.end());
  return Status::Ok();
}

Status StageRunner::StreamKvLayer(int64_t layer) {
  const kv::KvCacheShape& own = cache_.shape();
  const int64_t local = layer - model_->layout().layers.begin;
  const size_t own_bytes = static_cast<size_t>(own.BytesPerBlock() / own.num_layers);
  auto own_piece = [&](int32_t block) {
    return cache_.block_data(block) + static_cast<size_t>(local) * own_bytes;
  };
  const size_t n = kv_stream_blocks_.size();
  if (!is_driver()) {  // this rank's share of the layer, one message
    kv_layer_share_.resize(n * own_bytes);
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(kv_layer_share_.data() + i * own_bytes, own_piece(kv_stream_blocks_[i]),
                  own_bytes);
    }
    const int64_t t = NowNs();
    Status sent = groups_.ctl->Send(kv_layer_share_.data(), kv_layer_share_.size(),
                                    plan_.driver_rank(), kKvLayerTag);
    comm_ns_ += NowNs() - t;
    return sent;
  }
  kv_layer_pieces_.resize(n);
  if (plan_.world_size() == 1) {  // the cache is the whole model's: its own bytes
    for (size_t i = 0; i < n; ++i) kv_layer_pieces_[i] = own_piece(kv_stream_blocks_[i]);
    kv_layer_observer_(static_cast<int32_t>(layer), kv_layer_pieces_);
    return Status::Ok();
  }
  // Every rank's heads placed into one layer of the whole model's blocks.
  kv::KvCacheShape whole = WholeKvShape();
  whole.num_layers = 1;
  const size_t whole_bytes = static_cast<size_t>(whole.BytesPerBlock());
  if (kv_layer_slices_.empty()) {
    for (int r = 0; r < plan_.world_size(); ++r) {
      TESSERA_ASSIGN_OR_RETURN(kv::KvShardSlice slice, KvSliceOf(r));
      slice.shape.num_layers = 1;
      slice.layer_begin = 0;
      kv_layer_slices_.push_back(slice);
    }
  }
  kv_layer_whole_.resize(n * whole_bytes);
  for (int r = 0; r < plan_.world_size(); ++r) {
    const kv::KvShardSlice& slice = kv_layer_slices_[static_cast<size_t>(r)];
    const size_t bytes = static_cast<size_t>(slice.shape.BytesPerBlock());
    const uint8_t* share = nullptr;
    if (r != rank_) {
      kv_layer_share_.resize(n * bytes);
      const int64_t t = NowNs();
      size_t received = 0;
      Status got = groups_.ctl->Recv(kv_layer_share_.data(), kv_layer_share_.size(), r, kKvLayerTag,
                                     &received);
      comm_ns_ += NowNs() - t;
      TESSERA_RETURN_IF_ERROR(got);
      if (received != kv_layer_share_.size()) {
        return InvalidArgumentError("layer " + S(layer) + " of " + S(static_cast<int64_t>(n)) +
                                    " KV blocks from " + RankName(r) + ": " + S(received) +
                                    " bytes where " + S(kv_layer_share_.size()) + " were due");
      }
      share = kv_layer_share_.data();
    }
    for (size_t i = 0; i < n; ++i) {
      // A KV head replicated over ranks (tp > KV heads) is written once a rank: equal.
      kv::ShardBlockToWhole(whole, slice,
                            share != nullptr ? share + i * bytes : own_piece(kv_stream_blocks_[i]),
                            kv_layer_whole_.data() + i * whole_bytes);
    }
  }
  for (size_t i = 0; i < n; ++i) kv_layer_pieces_[i] = kv_layer_whole_.data() + i * whole_bytes;
  kv_layer_observer_(static_cast<int32_t>(layer), kv_layer_pieces_);
  return Status::Ok();
}

void StageRunner::PrepareKvBlocks(std::span<const int32_t> blocks) {
  cache_.PrepareWrite(blocks, 0, static_cast<int64_t>(blocks.size()) * cache_.shape().block_size);
}

}  // namespace tessera::engine
