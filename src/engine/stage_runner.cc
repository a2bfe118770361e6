#include "engine/stage_runner.h"

#include <cstdio>
#include <cstring>
#include <optional>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/proc_status.h"
#include "engine/model_runner.h"
#include "kernels/matmul.h"
#include "model/shard.h"

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

// Reports travel as a flat list of int64 words (strings as length + bytes packed
// into words), so the driver can print every rank's figures.
class Words {
 public:
  void Put(int64_t v) { words_.push_back(v); }
  void PutString(const std::string& s) {
    Put(static_cast<int64_t>(s.size()));
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t w = 0;
      std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
      Put(w);
    }
  }
  const std::vector<int64_t>& words() const { return words_; }

 private:
  std::vector<int64_t> words_;
};

class WordReader {
 public:
  explicit WordReader(std::span<const int64_t> words) : words_(words) {}
  Result<int64_t> Get() {
    if (pos_ >= words_.size()) return InvalidArgumentError("report ends early");
    return words_[pos_++];
  }
  Result<std::string> GetString() {
    TESSERA_ASSIGN_OR_RETURN(int64_t n, Get());
    if (n < 0 || n > 4096) return InvalidArgumentError("report has a bad string length");
    std::string s(static_cast<size_t>(n), '\0');
    for (int64_t i = 0; i < n; i += 8) {
      TESSERA_ASSIGN_OR_RETURN(int64_t w, Get());
      std::memcpy(s.data() + i, &w, static_cast<size_t>(std::min<int64_t>(8, n - i)));
    }
    return s;
  }

 private:
  std::span<const int64_t> words_;
  size_t pos_ = 0;
};

void PutShare(Words& w, const TimeShare& t) {
  w.Put(t.steps);
  w.Put(t.compute_ns);
  w.Put(t.comm_ns);
  w.Put(t.wait_ns);
}

Status GetShare(WordReader& r, TimeShare& t) {
  TESSERA_ASSIGN_OR_RETURN(t.steps, r.Get());
  TESSERA_ASSIGN_OR_RETURN(t.compute_ns, r.Get());
  TESSERA_ASSIGN_OR_RETURN(t.comm_ns, r.Get());
  TESSERA_ASSIGN_OR_RETURN(t.wait_ns, r.Get());
  return Status::Ok();
}

std::vector<int64_t> EncodeReport(const RankReport& report) {
  Words w;
  for (int64_t v : {int64_t{report.rank}, int64_t{report.stage}, int64_t{report.tp_rank},
                    report.weight_bytes, report.kv_bytes, report.peak_rss_bytes}) {
    w.Put(v);
  }
  w.PutString(report.links);
  PutShare(w, report.decode);
  PutShare(w, report.prefill);
  w.Put(static_cast<int64_t>(report.traffic.size()));
  for (const StepTraffic& t : report.traffic) {
    for (int64_t v : {static_cast<int64_t>(t.step_id), int64_t{t.decode}, t.sequences, t.tokens,
                      t.context, t.logit_rows, static_cast<int64_t>(t.bytes.size())}) {
      w.Put(v);
    }
    for (const auto& [key, e] : t.bytes) {
      w.PutString(key);
      w.Put(static_cast<int64_t>(e.calls));
      w.Put(static_cast<int64_t>(e.bytes_sent));
      w.Put(static_cast<int64_t>(e.bytes_received));
    }
  }
  return w.words();
}

Result<RankReport> DecodeReport(std::span<const int64_t> words) {
  WordReader r(words);
  RankReport report;
  int64_t v = 0;
  TESSERA_ASSIGN_OR_RETURN(v, r.Get());
  report.rank = static_cast<int>(v);
  TESSERA_ASSIGN_OR_RETURN(v, r.Get());
  report.stage = static_cast<int>(v);
  TESSERA_ASSIGN_OR_RETURN(v, r.Get());
  report.tp_rank = static_cast<int>(v);
  TESSERA_ASSIGN_OR_RETURN(report.weight_bytes, r.Get());
  TESSERA_ASSIGN_OR_RETURN(report.kv_bytes, r.Get());
  TESSERA_ASSIGN_OR_RETURN(report.peak_rss_bytes, r.Get());
  TESSERA_ASSIGN_OR_RETURN(report.links, r.GetString());
  TESSERA_RETURN_IF_ERROR(GetShare(r, report.decode));
  TESSERA_RETURN_IF_ERROR(GetShare(r, report.prefill));
  TESSERA_ASSIGN_OR_RETURN(int64_t steps, r.Get());
  if (steps < 0 || steps > (int64_t{1} << 24)) return InvalidArgumentError("bad report");
  for (int64_t i = 0; i < steps; ++i) {
    StepTraffic& t = report.traffic.emplace_back();
    TESSERA_ASSIGN_OR_RETURN(v, r.Get());
    t.step_id = static_cast<uint64_t>(v);
    TESSERA_ASSIGN_OR_RETURN(v, r.Get());
    t.decode = v != 0;
    TESSERA_ASSIGN_OR_RETURN(t.sequences, r.Get());
    TESSERA_ASSIGN_OR_RETURN(t.tokens, r.Get());
    TESSERA_ASSIGN_OR_RETURN(t.context, r.Get());
    TESSERA_ASSIGN_OR_RETURN(t.logit_rows, r.Get());
    TESSERA_ASSIGN_OR_RETURN(int64_t keys, r.Get());
    if (keys < 0 || keys > 64) return InvalidArgumentError("bad report");
    for (int64_t k = 0; k < keys; ++k) {
      TESSERA_ASSIGN_OR_RETURN(std::string key, r.GetString());
      comm::LedgerEntry e;
      TESSERA_ASSIGN_OR_RETURN(v, r.Get());
      e.calls = static_cast<uint64_t>(v);
      TESSERA_ASSIGN_OR_RETURN(v, r.Get());
      e.bytes_sent = static_cast<uint64_t>(v);
      TESSERA_ASSIGN_OR_RETURN(v, r.Get());
      e.bytes_received = static_cast<uint64_t>(v);
      t.bytes[key] = e;
    }
  }
  return report;
}

}  // namespace

int64_t PeakRssBytes() { return ProcStatusBytes("VmHWM"); }

// The forward pass's tensor-parallel collective over the tp group.
class StageRunner::TpOps final : public model::TensorParallelOps {
 public:
  TpOps(StageRunner& runner) : runner_(runner) {}
  Status AllReduceSum(std::span<float> data, const model::WeightMatrix* next) override {
    const int64_t start = NowNs();
    comm::Communicator& tp = *runner_.groups_.tp;
    // While the peers' partial sums are on their way, pull in the start of what
    // this rank multiplies by next: the wait then saves the step some memory time.
    std::optional<kernels::MatMulPrefetcher> prefetch;
    if (next != nullptr && !next->empty() && runner_.options_.tp_prefetch_bytes > 0 &&
        tp.AnyTcpPeer()) {
      // data holds rows of next->cols (dim) floats: their count stands for the
      // tokens, which only decide whether the product splits over the pool.
      prefetch.emplace(next->view(), static_cast<int64_t>(data.size()) / next->cols, &runner_.pool_,
                       runner_.options_.tp_prefetch_bytes);
      tp.SetWaitWork([&prefetch] { return prefetch->Step(); });
    }
    Status s = tp.AllReduce(data.data(), data.data(), data.size(), comm::DataType::kF32,
                            comm::ReduceOp::kSum,
                            runner_.options_.deterministic ? comm::AllReduceAlgo::kDeterministic
                                                           : comm::AllReduceAlgo::kAuto);
    if (prefetch) tp.SetWaitWork({});
    runner_.comm_ns_ += NowNs() - start;
    return s;
  }

 private:
  StageRunner& runner_;
};

Result<std::unique_ptr<StageRunner>> StageRunner::Create(const ParallelPlan& plan, int rank,
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
  return std::unique_ptr<StageRunner>(new StageRunner(plan, rank, std::move(groups), pool, resolved,
                                                      std::move(model), std::move(cache)));
}

StageRunner::StageRunner(const ParallelPlan& plan, int rank, Groups groups, ThreadPool& pool,
                         const RuntimeOptions& options, std::unique_ptr<model::LlamaModel> model,
                         kv::KvCache cache)
    : plan_(plan),
      rank_(rank),
      stage_(plan.StageOf(rank)),
      tp_rank_(plan.TpRankOf(rank)),
      groups_(std::move(groups)),
      pool_(pool),
      options_(options),
      model_(std::move(model)),
      cache_(std::move(cache)) {
  for (int32_t l = 0; l < cache_.shape().num_layers; ++l) {
    kv_layers_.push_back({cache_.k_pool(l), cache_.v_pool(l)});
  }
  if (plan_.tp > 1) tp_ops_ = std::make_unique<TpOps>(*this);
  limits_.num_blocks = cache_.num_blocks();
  limits_.max_tokens = options_.max_step_tokens > 0 ? options_.max_step_tokens : cache_.num_slots();
  limits_.max_sequences = options_.max_step_sequences;
  limits_.vocab_size = model_->config().vocab_size;
  header_buf_.resize(kStepHeaderBytes);
  record_traffic_ = options_.record_traffic;
}

StageRunner::~StageRunner() = default;

int StageRunner::upstream() const {
  return stage_ == 0 ? plan_.driver_rank() : plan_.RankOf(stage_ - 1, tp_rank_);
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
  return out;
}

Status StageRunner::RunStep(const StepMessage& m, std::vector<float>* logits) {
  const int64_t start = NowNs();
  comm_ns_ = 0;
  int64_t wait_ns = 0;
  const auto before =
      record_traffic_ ? LedgerSnapshot() : std::map<std::string, comm::LedgerEntry>();

  std::vector<model::ForwardSequence> sequences;
  sequences.reserve(m.sequences.size());
  bool decode = true;
  int64_t context = 0;
  for (const StepSequence& s : m.sequences) {
    sequences.push_back(
        {.num_tokens = s.num_tokens, .start_position = s.start_position, .block_table = s.blocks});
    decode = decode && s.num_tokens == 1;
    context += s.start_position;
    cache_.PrepareWrite(s.blocks, s.start_position, s.num_tokens);
  }
  const model::ForwardBatch batch{
      .tokens = m.tokens, .sequences = sequences, .all_logits = m.all_logits};
  const model::KvView kv{
      .layers = kv_layers_, .layout = cache_.shape().layout(), .num_blocks = cache_.num_blocks()};
  TESSERA_RETURN_IF_ERROR(model_->BeginStep(batch, kv, scratch_));
  const size_t activation_bytes = m.tokens.size() * static_cast<size_t>(model_->config().dim) * 4;
  if (stage_ == 0) {
    TESSERA_RETURN_IF_ERROR(model_->Embed(batch, scratch_, tp_ops_.get()));
  } else {
    const int64_t t = NowNs();
    size_t received = 0;
    TESSERA_RETURN_IF_ERROR(groups_.pp->Recv(scratch_.x.data(), activation_bytes, stage_ - 1,
                                             kActivationTag, &received));
    if (received != activation_bytes) {
      return InvalidArgumentError("activations from " +
                                  RankName(plan_.RankOf(stage_ - 1, tp_rank_)) + " are " +
                                  S(received) + " bytes, the step needs " + S(activation_bytes));
    }
    wait_ns += NowNs() - t;
  }
  TESSERA_RETURN_IF_ERROR(model_->RunLayers(batch, kv, scratch_, pool_, tp_ops_.get()));
  if (stage_ < plan_.pp - 1) {
    TESSERA_RETURN_IF_ERROR(SendStep(m, plan_.RankOf(stage_ + 1, tp_rank_)));
    const int64_t t = NowNs();
    TESSERA_RETURN_IF_ERROR(
        groups_.pp->Send(scratch_.x.data(), activation_bytes, stage_ + 1, kActivationTag));
    comm_ns_ += NowNs() - t;
  } else {
    model_->Head(scratch_, pool_, head_logits_);
    TESSERA_RETURN_IF_ERROR(GatherLogits(logits));
  }

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
    StepTraffic t{.step_id = m.step_id,
                  .decode = decode,
                  .sequences = static_cast<int64_t>(m.sequences.size()),
                  .tokens = static_cast<int64_t>(m.tokens.size()),
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

RankReport StageRunner::Report() const {
  RankReport report;
  report.rank = rank_;
  report.stage = stage_;
  report.tp_rank = tp_rank_;
  report.weight_bytes = model_->weights().total_bytes;
  report.kv_bytes = cache_.size_bytes();
  report.peak_rss_bytes = PeakRssBytes();
  if (groups_.ctl != nullptr) {
    for (int r = 0; r < groups_.ctl->size(); ++r) {
      const std::string link = groups_.ctl->TransportTo(r);
      if (r > 0) report.links += ' ';
      report.links += link.substr(0, link.find(' '));
    }
  }
  report.decode = decode_;
  report.prefill = prefill_;
  report.traffic = traffic_;
  return report;
}

Status ServeWorker(StageRunner& runner) {
  TESSERA_CHECK(!runner.is_driver());
  const ParallelPlan& plan = runner.plan();
  for (;;) {
    const int64_t t = NowNs();
    TESSERA_ASSIGN_OR_RETURN(StepMessage m, runner.ReceiveStep(runner.upstream(), /*idle=*/true));
    runner.pending_wait_ns_ += NowNs() - t;
    if (m.kind == StepKind::kStop) {
      if (runner.stage() < plan.pp - 1) {
        TESSERA_RETURN_IF_ERROR(
            runner.SendStep(m, plan.RankOf(runner.stage() + 1, runner.tp_rank())));
      }
      const std::vector<int64_t> words = EncodeReport(runner.Report());
      const uint64_t size = words.size();
      comm::Communicator& ctl = *runner.groups().ctl;
      TESSERA_RETURN_IF_ERROR(ctl.Send(&size, sizeof(size), plan.driver_rank(), kReportSizeTag));
      return ctl.Send(words.data(), words.size() * sizeof(int64_t), plan.driver_rank(), kReportTag);
    }
    TESSERA_RETURN_IF_ERROR(runner.RunStep(m, nullptr));
  }
}

Driver::Driver(StageRunner& runner) : runner_(runner) { TESSERA_CHECK(runner.is_driver()); }

Driver::~Driver() = default;

int64_t Driver::vocab_size() const { return runner_.model().config().vocab_size; }
int32_t Driver::num_kv_blocks() const { return runner_.cache().num_blocks(); }
int32_t Driver::kv_block_size() const { return runner_.cache().shape().block_size; }
int Driver::max_in_flight() const { return runner_.plan().pp; }

Status Driver::Submit(std::span<const StepEntry> entries, bool all_logits) {
  if (stopped_) return InvalidArgumentError("Submit after Shutdown");
  if (static_cast<int>(in_flight_.size()) >= max_in_flight()) {
    return InvalidArgumentError("Submit with " + S(max_in_flight()) + " steps already in flight");
  }
  StepMessage m;
  m.step_id = next_step_id_++;
  m.all_logits = all_logits;
  const int64_t block_size = kv_block_size();
  for (const StepEntry& e : entries) {
    TESSERA_CHECK(e.block_table != nullptr);
    m.tokens.insert(m.tokens.end(), e.new_tokens.begin(), e.new_tokens.end());
    StepSequence& s = m.sequences.emplace_back();
    s.start_position = e.start_position;
    s.num_tokens = static_cast<int32_t>(e.new_tokens.size());
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
  const ParallelPlan& plan = runner_.plan();
  // The first stage's ranks get the message (the driver's own stage too when pp = 1).
  for (int t = 0; t < plan.tp; ++t) {
    const int to = plan.RankOf(0, t);
    if (to != runner_.rank()) TESSERA_RETURN_IF_ERROR(runner_.SendStep(m, to));
  }
  if (plan.pp == 1) {
    runner_.expected_step_id_ = m.step_id + 1;
    TESSERA_RETURN_IF_ERROR(runner_.RunStep(m, &logits_));
  }
  in_flight_.push_back(std::move(m));
  return Status::Ok();
}

Result<std::span<const float>> Driver::Collect() {
  if (in_flight_.empty()) return InvalidArgumentError("Collect without a submitted step");
  StepMessage submitted = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (runner_.plan().pp > 1) {
    const int64_t t = NowNs();
    TESSERA_ASSIGN_OR_RETURN(StepMessage m, runner_.ReceiveStep(runner_.upstream()));
    runner_.pending_wait_ns_ += NowNs() - t;
    if (m.step_id != submitted.step_id || m.kind != StepKind::kStep ||
        m.tokens != submitted.tokens) {
      return InternalError("the pipeline returned step " + S(static_cast<int64_t>(m.step_id)) +
                           " for step " + S(static_cast<int64_t>(submitted.step_id)));
    }
    TESSERA_RETURN_IF_ERROR(runner_.RunStep(m, &logits_));
  }
  return std::span<const float>(logits_);
}

double Driver::last_step_comm_seconds() const {
  return static_cast<double>(runner_.last_comm_ns_) * 1e-9;
}

Result<std::vector<RankReport>> Driver::Shutdown() {
  if (stopped_) return InvalidArgumentError("Shutdown twice");
  if (!in_flight_.empty()) return InvalidArgumentError("Shutdown with steps in flight");
  stopped_ = true;
  const ParallelPlan& plan = runner_.plan();
  StepMessage stop;
  stop.kind = StepKind::kStop;
  stop.step_id = next_step_id_++;
  for (int t = 0; t < plan.tp; ++t) {
    const int to = plan.RankOf(0, t);
    if (to != runner_.rank()) TESSERA_RETURN_IF_ERROR(runner_.SendStep(stop, to));
  }
  if (plan.pp > 1) {
    TESSERA_ASSIGN_OR_RETURN(StepMessage m, runner_.ReceiveStep(runner_.upstream()));
    if (m.kind != StepKind::kStop) return InternalError("the pipeline did not drain");
  }
  std::vector<RankReport> reports(static_cast<size_t>(plan.world_size()));
  reports[static_cast<size_t>(runner_.rank())] = runner_.Report();
  for (int r = 0; r < plan.world_size(); ++r) {
    if (r == runner_.rank()) continue;
    comm::Communicator& ctl = *runner_.groups().ctl;
    uint64_t size = 0;
    TESSERA_RETURN_IF_ERROR(ctl.Recv(&size, sizeof(size), r, kReportSizeTag));
    if (size > (uint64_t{1} << 26))
      return InvalidArgumentError("oversized report from rank " + S(r));
    std::vector<int64_t> words(size);
    size_t received = 0;
    TESSERA_RETURN_IF_ERROR(
        ctl.Recv(words.data(), size * sizeof(int64_t), r, kReportTag, &received));
    if (received != size * sizeof(int64_t))
      return InvalidArgumentError("short report from rank " + S(r));
    TESSERA_ASSIGN_OR_RETURN(reports[static_cast<size_t>(r)], DecodeReport(words));
  }
  return reports;
}

}  // namespace tessera::engine
