#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>

#include "base/clock.h"
#include "engine/sequence.h"
#include "kv/block_allocator.h"
#include "kv/block_hash.h"

namespace tessera::engine {
namespace {

// With every running request waiting for its import, the loop still wakes this
// often to notice a cancelled one (RequestHandle::Cancel only sets a flag).
constexpr int64_t kImportWaitPollMs = 20;

double Seconds(int64_t ns) { return static_cast<double>(ns) * 1e-9; }

// Where the earliest stop string starts in `text`, or npos.
size_t FindStop(std::string_view text, std::span<const std::string> stops) {
  size_t best = std::string_view::npos;
  for (const std::string& stop : stops) best = std::min(best, text.find(stop));
  return best;
}

// Length of the longest suffix of `text` that is a proper prefix of a stop
// string: text that may still become a stop string and must be held back.
size_t StopPrefixSuffix(std::string_view text, std::span<const std::string> stops) {
  size_t hold = 0;
  for (const std::string& stop : stops) {
    const size_t longest = std::min(text.size(), stop.size() - 1);
    for (size_t n = longest; n > hold; --n) {
      if (text.substr(text.size() - n) == std::string_view(stop).substr(0, n)) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

// log-softmax of `logits` at `token`, and the top `k` (token, log-probability)
// pairs, most likely first, ties to the lower id.
void LogProbs(std::span<const float> logits, int32_t token, int32_t k, TokenEvent& event) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float x : logits) max_logit = std::max(max_logit, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max_logit));
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  event.logprob =
      static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - log_z);
  if (k <= 0) return;
  const size_t n = std::min(static_cast<size_t>(k), logits.size());
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
                    [&](int32_t a, int32_t b) {
                      const float la = logits[static_cast<size_t>(a)];
                      const float lb = logits[static_cast<size_t>(b)];
                      return la != lb ? la > lb : a < b;
                    });
  event.top_logprobs.clear();
  for (size_t i = 0; i < n; ++i) {
    const float logit = logits[static_cast<size_t>(ids[i])];
    event.top_logprobs.emplace_back(ids[i], static_cast<float>(static_cast<double>(logit) - log_z));
  }
}

// Blocks one sequence may hold: the pool, or with data-parallel attention one
// rank's share of it.
int64_t MaxSequenceBlocks(const StepExecutor& executor) {
  return executor.num_kv_blocks() / std::max(executor.attention_ranks(), 1);
}

// The allocator's partitions over the executor's pool: one per data-parallel
// attention rank (each table bound to its sequence's), or per context-parallel
// rank (each table index placed by kv_placement), or one.
int32_t PoolPartitions(const StepExecutor& executor) {
  return executor.attention_ranks() > 1 ? executor.attention_ranks() : executor.kv_partitions();
}

kv::BlockAllocator MakeAllocator(const StepExecutor& executor) {
  return kv::BlockAllocator(
      executor.num_kv_blocks(), PoolPartitions(executor),
      executor.attention_ranks() > 1 ? kv::BlockPlacement() : executor.kv_placement());
}

// Where attention rank `rank`'s prefix-cache chains start: a block cached on one
// rank is of no use to a sequence on another, so their hashes differ. One rank:
// the executor's root, as without data-parallel attention.
kv::BlockHash RankRootHash(const StepExecutor& executor, int32_t rank) {
  if (executor.attention_ranks() == 1) return kv::RootBlockHash(executor.kv_cache_salt());
  return kv::RootBlockHash(executor.kv_cache_salt() + "/attention-rank/" + std::to_string(rank));
}

}  // namespace

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

Status ValidateSchedulerOptions(const SchedulerOptions& options, const StepExecutor& executor) {
  const int32_t ranks = executor.attention_ranks();
  if (ranks < 1 || executor.num_kv_blocks() % ranks != 0 ||
      (ranks > 1 && executor.kv_partitions() > 1)) {
    return InvalidArgumentError(
        "data-parallel attention over " + std::to_string(ranks) + " ranks needs a KV pool of " +
        "equal shares (" + std::to_string(executor.num_kv_blocks()) + " blocks) and no " +
        "context parallelism (" + std::to_string(executor.kv_partitions()) + " partitions)");
  }
  // A sequence's blocks all come from one attention rank's share.
  const int64_t capacity = MaxSequenceBlocks(executor) * executor.kv_block_size();
  if (options.max_num_batched_tokens <= 0 || options.max_num_seqs <= 0 ||
      options.max_waiting <= 0 || options.max_model_len < 0 || options.prefix_wait_min_tokens < 0 ||
      options.admit_prefill_tokens < 0 || options.short_prompt_tokens < 0) {
    return InvalidArgumentError(
        "max_num_batched_tokens, max_num_seqs and max_waiting must be positive, "
        "max_model_len, prefix_wait_min_tokens, admit_prefill_tokens and short_prompt_tokens "
        ">= 0");
  }
  if (options.max_num_batched_tokens < options.max_num_seqs) {
    return InvalidArgumentError(
        "max_num_batched_tokens (" + std::to_string(options.max_num_batched_tokens) +
        ") must be at least max_num_seqs (" + std::to_string(options.max_num_seqs) +
        ") so that every running sequence decodes in each step");
  }
  if (options.max_model_len > capacity) {
    return InvalidArgumentError("max_model_len " + std::to_string(options.max_model_len) +
                                " exceeds the KV cache of " + std::to_string(capacity) + " tokens" +
                                (ranks > 1 ? " that one of the " + std::to_string(ranks) +
                                                 " data-parallel attention ranks holds"
                                           : ""));
  }
  if (options.spec_tokens < 0 || options.spec_tokens > kMaxSpecTokens) {
    return InvalidArgumentError("spec_tokens must be in [0, " + std::to_string(kMaxSpecTokens) +
                                "], got " + std::to_string(options.spec_tokens));
  }
  if (options.spec_max_batch < 0) {
    return InvalidArgumentError("spec_max_batch must be >= 0, got " +
                                std::to_string(options.spec_max_batch));
  }
  if (options.spec_tokens > 0 && !options.proposer) {
    return InvalidArgumentError("spec_tokens " + std::to_string(options.spec_tokens) +
                                " needs a proposer (speculative decoding is off)");
  }
  return Status::Ok();
}

namespace {

// A speculating sequence's number of guesses, adapted to how many it gets
// accepted: one more after a fully accepted run, one more than it kept otherwise;
// after kFailuresToPause verifications in a row that kept nothing it pauses
// (guesses nothing for `backoff` decode steps, doubling up to kMaxBackoff while
// it keeps failing), then probes with one guess.
struct SpecAdapt {
  static constexpr int32_t kFailuresToPause = 3;
  static constexpr int32_t kFirstBackoff = 4;
  static constexpr int32_t kMaxBackoff = 16;

  int32_t limit = 0;  // guesses next time
  int32_t failures = 0;
  int32_t pause = 0;  // decode steps left without guessing
  int32_t backoff = kFirstBackoff;

  // The guesses this decode step may make (counts down a pause).
  int32_t Next() {
    if (pause == 0) return limit;
    --pause;
    return 0;
  }
  void Update(int32_t max_tokens, int64_t proposed, int64_t accepted) {
    if (accepted == proposed) {
      limit = std::min(max_tokens, limit + 1);
    } else {
      limit = static_cast<int32_t>(std::max<int64_t>(1, accepted + 1));
    }
    if (accepted > 0) {
      failures = 0;
      backoff = kFirstBackoff;
    } else if (++failures >= kFailuresToPause) {
      failures = 0;
      pause = backoff;
      backoff = std::min(2 * backoff, kMaxBackoff);
    }
  }
};

// One request, owned by the scheduler thread once Run has taken it in.
struct Request {
  Request(int64_t id, RequestParams p, RequestCallbacks c, const model::Tokenizer& tokenizer,
          int32_t block_size)
      : params(std::move(p)),
        callbacks(std::move(c)),
        seq(id, params.prompt, params.sampling, block_size),
        decoder(tokenizer) {}

  std::shared_ptr<RequestHandle> handle;
  RequestParams params;
  RequestCallbacks callbacks;
  Sequence seq;  // prompt + generated tokens, KV blocks, sampler
  model::IncrementalDecoder decoder;
  std::string held_text;  // decoded, not yet emitted: may be the start of a stop string
  RequestResult result;
  int64_t submitted_ns = 0;
  int64_t scheduled_ns = 0;    // first scheduled; 0 before
  int64_t first_token_ns = 0;  // 0 before the first token
  // Prefix cache: the chained hash of each full block of seq's tokens computed so
  // far ([i] covers tokens [i * block_size, (i + 1) * block_size)), and how many of
  // the block table's leading blocks are cached or were offered to the cache.
  std::vector<kv::BlockHash> block_hashes;
  int64_t num_registered_blocks = 0;
  // KV streaming (RequestCallbacks::on_layer_kv): blocks whose layers were reported.
  int64_t layer_kv_blocks = 0;
  // Data-parallel attention: the rank whose cache holds its blocks (and whose
  // root its block hashes chain from), chosen at each admission. 0 on one rank.
  int32_t attention_rank = 0;
  // Speculative decoding: guesses per step at most (0: none), the adaptive
  // limit, and the step in flight's entry — its pending token then its guesses —
  // with the guesses' draft distributions ([guesses, vocab]; empty when
  // deterministic).
  int32_t spec_max = 0;
  SpecAdapt spec;
  std::vector<int32_t> verify_tokens;
  std::vector<float> draft_probs;
  bool in_step = false;  // in a submitted step not yet collected: not to be touched
  // Prefill/decode disaggregation: a KvImporter is filling the blocks of its
  // first import_tokens tokens (not to be scheduled, preempted or freed until
  // ImportDone); an import is tried at its first admission only.
  bool importing = false;
  bool import_tried = false;
  bool import_cancelled = false;  // KvImporter::Cancel was called for it
  int64_t prefix_wait_step = -1;  // the last step whose build counted it waiting for blocks
  int64_t import_tokens = 0;
  int64_t prefilled_ns = 0;  // when the prefill instance finished its prompt (0: not imported)
  bool finished = false;
};

}  // namespace

struct Scheduler::Impl {
  Impl(StepExecutor& e, const model::Tokenizer& t, const SchedulerOptions& o)
      : executor(&e),
        vocab_size(e.vocab_size()),
        block_size(e.kv_block_size()),
        attention_ranks(e.attention_ranks()),
        tokenizer(t),
        options(o),
        allocator(MakeAllocator(e)),
        root_hash(kv::RootBlockHash(e.kv_cache_salt())) {
    if (options.enable_prefix_cache) allocator.SetEventLog(&cache_events);
    if (options.max_model_len == 0) {
      options.max_model_len = MaxSequenceBlocks(e) * e.kv_block_size();
    }
    for (int32_t rank = 0; rank < attention_ranks; ++rank) {
      rank_roots.push_back(RankRootHash(e, rank));
    }
  }

  // Scheduler thread only.
  void TakeIncoming(std::deque<std::unique_ptr<Request>>& incoming);
  void ReapCancelled();
  void FinishAll(FinishReason reason, const Status& error);
  void Finish(Request& r, FinishReason reason);
  void Preempt(Request& victim);
  Request* NewestIdleRunning(int32_t attention_rank);
  bool ReserveOrPreempt(Request& r, int64_t count);
  void HashFullBlocks(Request& r, int64_t num_blocks);
  void ExtendHashes(const Request& r, const kv::BlockHash& root, int64_t num_blocks,
                    std::vector<kv::BlockHash>& hashes) const;
  std::vector<kv::BlockId> CachedPrefix(const Request& r, const kv::BlockHash& root,
                                        std::span<const kv::BlockHash> hashes) const;
  void ChooseAttentionRank(Request& r, int64_t full_blocks);
  int32_t FreeBlocksFor(const Request& r) const;
  std::span<const int32_t> BlockTokens(const Request& r, int64_t block_idx) const;
  int64_t BlocksBeingComputed(const Request& r, int64_t first, int64_t end) const;
  bool CanAdmit() const;
  bool InBuiltStep(const Request& r) const;
  void AdmitShortPrompts();
  bool AdmitWaiting(size_t index);
  bool AdmitImport(size_t index, const std::vector<kv::BlockId>& hits, int64_t hits_without_owner,
                   int64_t full_blocks);
  void RegisterFullBlocks(Request& r);
  int64_t StepSequenceCap() const;
  Status BuildStep();
  Status ProposeGuesses();
  void Verify(Request& r, std::span<const float> logits, int64_t num_guesses);
  void DropGuesses(Request& r);
  Status SubmitStep();
  Status CollectStep(bool emit);
  Status DrainInFlight();
  void LoseEngineState();
  Status Recover(const Status& failure);
  void Emit(Request& r, std::span<const float> logits);
  void EmitToken(Request& r, int32_t token, std::span<const float> logits);
  void EraseFinished();
  void Publish();
  void TakeImports();

  StepExecutor* executor;    // replaced only by Recover, on the scheduler thread
  const int64_t vocab_size;  // the executor's (any replacement has the same)
  const int32_t block_size;
  const int32_t attention_ranks;  // data-parallel attention's ranks (1: none)
  const model::Tokenizer& tokenizer;
  SchedulerOptions options;
  ExecutorRecovery recover;  // empty: an executor error ends Run
  int64_t unavailable_after_ns = 0;

  // Shared with other threads, under `mu`.
  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Request>> incoming;
  bool stopping = false;
  bool cancel_in_flight = false;
  Status recovery_request;  // RequestRecovery's reason until Run takes it
  struct ImportResult {
    int64_t id;
    Status status;
    int64_t bytes;
    int64_t prefilled_ns;
    int64_t done_ns;
    int64_t streamed_bytes;
  };
  std::deque<ImportResult> imports_done;  // ImportDone's reports until Run takes them
  SchedulerStats stats;
  int64_t next_id = 0;

  kv::CacheEventLog cache_events;  // thread-safe; declared before the allocator that writes it

  // Scheduler thread only.
  kv::BlockAllocator allocator;
  kv::BlockHash root_hash;  // the executor's salt's: prefix_cache_root()
  // Where the prefix cache's chains start, per attention rank ([attention_ranks]);
  // on one rank, root_hash.
  std::vector<kv::BlockHash> rank_roots;
  std::deque<std::unique_ptr<Request>> waiting;   // FIFO; preempted ones go to the front
  std::vector<std::unique_ptr<Request>> running;  // admission order: newest last
  struct Scheduled {
    Request* request;
    int64_t num_tokens;       // new tokens in the step, guesses included
    int64_t num_guesses = 0;  // speculative guesses after its pending token
  };
  std::vector<Scheduled> step;  // the step being built
  int64_t budget = 0;           // tokens left in it
  bool preempted = false;       // in building it (then nothing new is admitted)
  int64_t admitted_tokens = 0;  // prompt tokens of the requests it admitted
  int64_t steps_built = 0;      // BuildStep calls (a waiting request counts once a step)
  std::vector<StepEntry> entries;
  std::vector<int32_t> stream_blocks;  // KV streaming: the step's blocks whose layers go
  std::vector<ProposalRequest> proposal_requests;  // ProposeGuesses' scratch
  std::vector<Proposal> proposals;
  std::vector<size_t> proposal_entries;  // step index of each proposal request
  // Submitted steps not yet collected, oldest first (at most max_in_flight); their
  // requests are marked in_step and belong to no other step until collected.
  std::deque<std::vector<Scheduled>> steps_in_flight;
  SchedulerStats counters;  // the *_total fields
};

Scheduler::Scheduler(StepExecutor& executor, const model::Tokenizer& tokenizer,
                     const SchedulerOptions& options) {
  const Status valid = ValidateSchedulerOptions(options, executor);
  TESSERA_CHECK(valid.ok()) << valid.ToString();
  impl_ = std::make_unique<Impl>(executor, tokenizer, options);
  impl_->stats.kv_blocks_total = executor.num_kv_blocks();
}

Scheduler::~Scheduler() = default;

Result<std::shared_ptr<RequestHandle>> Scheduler::Submit(RequestParams params,
                                                         RequestCallbacks callbacks) {
  Impl& s = *impl_;
  const int64_t num_prompt = static_cast<int64_t>(params.prompt.size());
  if (num_prompt == 0) return InvalidArgumentError("the prompt has no tokens");
  const int64_t vocab = s.vocab_size;
  for (int32_t token : params.prompt) {
    if (token < 0 || token >= vocab) {
      return InvalidArgumentError("prompt token " + std::to_string(token) +
                                  " is outside the vocabulary of " + std::to_string(vocab));
    }
  }
  if (params.max_tokens < 0) return InvalidArgumentError("max_tokens must be >= 0");
  if (num_prompt >= s.options.max_model_len ||
      num_prompt + params.max_tokens > s.options.max_model_len) {
    return InvalidArgumentError("prompt of " + std::to_string(num_prompt) + " tokens + " +
                                std::to_string(params.max_tokens) +
                                " new tokens exceed the model length of " +
                                std::to_string(s.options.max_model_len) + " tokens");
  }
  TESSERA_RETURN_IF_ERROR(model::ValidateSamplingParams(params.sampling));
  for (const std::string& stop : params.stop) {
    if (stop.empty()) return InvalidArgumentError("empty stop string");
  }
  if (params.top_logprobs < 0) return InvalidArgumentError("top_logprobs must be >= 0");
  if (params.spec_tokens < -1 || params.spec_tokens > kMaxSpecTokens) {
    return InvalidArgumentError("spec_tokens must be -1 (the default) or in [0, " +
                                std::to_string(kMaxSpecTokens) + "], got " +
                                std::to_string(params.spec_tokens));
  }
  if (params.spec_tokens > 0 && !s.options.proposer) {
    return InvalidArgumentError(
        "spec_tokens asks for speculative decoding, which is off here (no proposer)");
  }

  std::lock_guard<std::mutex> lock(s.mu);
  if (s.stopping) return ResourceExhaustedError("the scheduler is stopping");
  if (s.stats.recovering && NowNs() - s.stats.recovering_since_ns > s.unavailable_after_ns) {
    return UnavailableError("the engine is restarting after a failure (for " +
                            std::to_string((NowNs() - s.stats.recovering_since_ns) / 1'000'000) +
                            " ms)");
  }
  const int64_t queued = static_cast<int64_t>(s.incoming.size()) + s.stats.waiting;
  if (queued >= s.options.max_waiting) {
    return ResourceExhaustedError(std::to_string(queued) +
                                  " requests are already waiting (max_waiting " +
                                  std::to_string(s.options.max_waiting) + ")");
  }
  const int64_t id = s.next_id++;
  auto request = std::make_unique<Request>(id, std::move(params), std::move(callbacks), s.tokenizer,
                                           s.block_size);
  // The constructor is private to Scheduler, so make_shared cannot reach it.
  request->handle = std::shared_ptr<RequestHandle>(new RequestHandle(id));
  request->submitted_ns = NowNs();
  request->result.prompt_tokens = num_prompt;
  request->spec_max =
      request->params.spec_tokens < 0 ? s.options.spec_tokens : request->params.spec_tokens;
  request->spec.limit = request->spec_max;
  std::shared_ptr<RequestHandle> handle = request->handle;
  s.incoming.push_back(std::move(request));
  s.wake.notify_one();
  return handle;
}

void Scheduler::Stop(bool cancel_in_flight) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->stopping = true;
  impl_->cancel_in_flight = impl_->cancel_in_flight || cancel_in_flight;
  impl_->wake.notify_all();
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  SchedulerStats stats = impl_->stats;
  stats.waiting += static_cast<int64_t>(impl_->incoming.size());
  return stats;
}

int64_t Scheduler::max_model_len() const { return impl_->options.max_model_len; }

const kv::CacheEventLog& Scheduler::cache_events() const { return impl_->cache_events; }

kv::BlockHash Scheduler::prefix_cache_root() const { return impl_->root_hash; }

int64_t Scheduler::kv_block_size() const { return impl_->block_size; }

void Scheduler::SetRecovery(ExecutorRecovery recover, int64_t unavailable_after_ms) {
  impl_->recover = std::move(recover);
  impl_->unavailable_after_ns = unavailable_after_ms * 1'000'000;
}

void Scheduler::RequestRecovery(Status reason) {
  TESSERA_CHECK(!reason.ok());
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->recovery_request = std::move(reason);
  impl_->wake.notify_all();
}

void Scheduler::ImportDone(int64_t transfer_id, Status status, int64_t bytes, int64_t prefilled_ns,
                           int64_t streamed_bytes) {
  const int64_t now = NowNs();
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->imports_done.push_back(
      {transfer_id, std::move(status), bytes, prefilled_ns, now, streamed_bytes});
  impl_->wake.notify_all();
}

// Applies the importers' reports: an imported prompt's blocks count as computed
// (and enter the prefix cache); a failed import leaves them to be computed here.
void Scheduler::Impl::TakeImports() {
  std::deque<ImportResult> done;
  {
    std::lock_guard<std::mutex> lock(mu);
    std::swap(done, imports_done);
  }
  for (ImportResult& d : done) {
    Request* r = nullptr;
    for (auto& candidate : running) {
      if (candidate->importing && candidate->seq.id() == d.id) r = candidate.get();
    }
    if (r == nullptr) {  // ended meanwhile (the scheduler stopped)
      if (d.status.ok()) Status dropped = options.kv_importer->Land(d.id, nullptr);
      continue;
    }
    r->importing = false;
    if (d.status.ok()) d.status = options.kv_importer->Land(d.id, executor);
    if (d.status.ok()) {
      r->seq.MarkCached(r->import_tokens - r->seq.num_cached_tokens());
      RegisterFullBlocks(*r);
      r->result.kv_imported_tokens += r->import_tokens - r->result.cached_tokens;
      r->result.kv_transfer_bytes += d.bytes;
      r->result.kv_streamed_bytes += d.streamed_bytes;
      if (d.prefilled_ns > 0) {
        r->prefilled_ns = d.prefilled_ns;
        r->result.timing.kv_transfer_s = Seconds(d.done_ns - d.prefilled_ns);
      }
      counters.kv_import_tokens_total += r->import_tokens - r->result.cached_tokens;
      counters.kv_import_bytes_total += d.bytes;
      counters.kv_import_streamed_bytes_total += d.streamed_bytes;
    } else {
      ++counters.kv_import_failures_total;
    }
  }
}

Status Scheduler::Run() {
  Impl& s = *impl_;
  // On an executor error every request ends with it, and Submit refuses from then on.
  auto fail = [&s](const Status& status) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.stopping = true;
      s.TakeIncoming(s.incoming);
    }
    s.steps_in_flight.clear();  // the executor is broken: nothing more comes back
    s.FinishAll(FinishReason::kError, status);
    s.Publish();
    return status;
  };
  for (;;) {
    bool stop = false;
    bool cancel = false;
    Status requested;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      if (s.running.empty() && s.waiting.empty()) {
        s.wake.wait(lock, [&] {
          return !s.incoming.empty() || s.stopping || !s.recovery_request.ok() ||
                 !s.imports_done.empty();
        });
      }
      s.TakeIncoming(s.incoming);
      stop = s.stopping;
      cancel = s.cancel_in_flight;
      std::swap(requested, s.recovery_request);
    }
    if (!requested.ok() && s.recover && !cancel) {
      // The steps in flight may still come back (the executor may be intact);
      // their results are dropped either way.
      if (Status drained = s.DrainInFlight(); !drained.ok()) s.steps_in_flight.clear();
      if (Status again = s.Recover(requested); !again.ok()) return fail(again);
    }
    if (cancel) {
      if (Status drained = s.DrainInFlight(); !drained.ok()) return fail(drained);
      s.FinishAll(FinishReason::kCancelled, Status::Ok());
      s.Publish();
      return Status::Ok();
    }
    s.TakeImports();
    s.ReapCancelled();
    if (s.running.empty() && s.waiting.empty()) {
      s.Publish();
      if (stop) return Status::Ok();
      continue;
    }
    // Keep the executor full: a pipeline works on up to max_in_flight steps at once,
    // each over sequences no other outstanding step holds.
    const size_t max_in_flight = static_cast<size_t>(std::max(s.executor->max_in_flight(), 1));
    bool recovered = false;
    while (s.steps_in_flight.size() < max_in_flight) {
      Status submitted = s.BuildStep();
      if (submitted.ok() && s.step.empty()) break;  // every schedulable sequence is in a step
      if (submitted.ok()) submitted = s.SubmitStep();
      if (!submitted.ok()) {
        if (!s.recover) return fail(submitted);
        if (Status again = s.Recover(submitted); !again.ok()) return fail(again);
        recovered = true;  // build the steps anew, on the new executor
        break;
      }
    }
    if (recovered) continue;
    if (s.steps_in_flight.empty()) {
      // Every running sequence waits for its imported K/V (and no waiting request
      // fits beside them): sleep until an import or anything else arrives, or a
      // while (a cancelled request's transfer is given up: ReapCancelled).
      std::unique_lock<std::mutex> lock(s.mu);
      s.wake.wait_for(lock, std::chrono::milliseconds(kImportWaitPollMs), [&] {
        return !s.imports_done.empty() || !s.incoming.empty() || s.stopping ||
               !s.recovery_request.ok();
      });
      continue;
    }
    // With nothing outstanding the oldest running sequence can always preempt the
    // others of its rank, and a waiting request alone fits its rank's share of the
    // cache (max_model_len <= capacity).
    TESSERA_CHECK(!s.steps_in_flight.empty());
    if (Status collected = s.CollectStep(/*emit=*/true); !collected.ok()) {
      if (!s.recover) return fail(collected);
      if (Status again = s.Recover(collected); !again.ok()) return fail(again);
    }
    s.Publish();
  }
}

void Scheduler::Impl::TakeIncoming(std::deque<std::unique_ptr<Request>>& queue) {
  while (!queue.empty()) {
    waiting.push_back(std::move(queue.front()));
    queue.pop_front();
  }
  stats.waiting = static_cast<int64_t>(waiting.size());
}

void Scheduler::Impl::Finish(Request& r, FinishReason reason) {
  TESSERA_CHECK(!r.finished);
  r.finished = true;
  r.seq.block_table().Release(allocator);
  if (options.proposer) options.proposer->Forget(r.seq.id());
  const int64_t now = NowNs();
  RequestTiming& t = r.result.timing;
  if (r.scheduled_ns == 0) {
    t.queue_s = Seconds(now - r.submitted_ns);
  } else {
    t.queue_s = Seconds(r.scheduled_ns - r.submitted_ns);
    if (r.first_token_ns == 0) {
      t.prefill_s = Seconds(now - r.scheduled_ns);
    } else {
      t.prefill_s = Seconds(r.first_token_ns - r.scheduled_ns);
      t.decode_s = Seconds(now - r.first_token_ns);
    }
  }
  r.result.reason = reason;
  ++counters.requests_finished_total;
  if (r.callbacks.on_done) r.callbacks.on_done(r.result);
}

void Scheduler::Impl::FinishAll(FinishReason reason, const Status& error) {
  for (auto& r : running) {
    r->result.error = error;
    Finish(*r, reason);
  }
  for (auto& r : waiting) {
    r->result.error = error;
    Finish(*r, reason);
  }
  running.clear();
  waiting.clear();
}

// A cancelled request in a step still in flight ends when that step is collected
// (its blocks are being written until then).
void Scheduler::Impl::ReapCancelled() {
  for (auto& r : running) {
    if (r->handle->cancelled() && r->importing && !r->import_cancelled) {
      r->import_cancelled = true;  // it ends once the importer reports
      options.kv_importer->Cancel(r->seq.id());
    }
    if (r->handle->cancelled() && !r->in_step && !r->importing)
      Finish(*r, FinishReason::kCancelled);
  }
  for (auto& r : waiting) {
    if (r->handle->cancelled()) Finish(*r, FinishReason::kCancelled);
  }
  EraseFinished();
}

void Scheduler::Impl::EraseFinished() {
  auto finished = [](const std::unique_ptr<Request>& r) { return r->finished; };
  running.erase(std::remove_if(running.begin(), running.end(), finished), running.end());
  waiting.erase(std::remove_if(waiting.begin(), waiting.end(), finished), waiting.end());
}

// Frees the victim's blocks and queues it first among the waiting requests; it
// keeps its tokens (prompt and generated) and its sampler, so it recomputes its KV
// and continues exactly where it was.
void Scheduler::Impl::Preempt(Request& victim) {
  TESSERA_CHECK(!victim.in_step);
  for (size_t i = 0; i < step.size(); ++i) {
    if (step[i].request == &victim) {
      budget += step[i].num_tokens;
      step.erase(step.begin() + static_cast<ptrdiff_t>(i));
      break;
    }
  }
  victim.seq.block_table().Release(allocator);  // its full blocks stay cached
  victim.seq.ForgetCached();
  victim.num_registered_blocks = 0;
  victim.layer_kv_blocks = 0;  // reported again as it is recomputed (a transfer skips copies)
  auto it = std::find_if(running.begin(), running.end(),
                         [&](const std::unique_ptr<Request>& r) { return r.get() == &victim; });
  TESSERA_CHECK(it != running.end());
  waiting.push_front(std::move(*it));
  running.erase(it);
  preempted = true;
  ++counters.preemptions_total;
}

// The most recently admitted running request on `attention_rank` that no
// outstanding step holds.
Request* Scheduler::Impl::NewestIdleRunning(int32_t attention_rank) {
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    if (!(*it)->in_step && !(*it)->importing && (*it)->attention_rank == attention_rank) {
      return it->get();
    }
  }
  return nullptr;
}

// Reserves blocks for `count` more tokens of running request `r`, preempting the
// newest idle running requests of its attention rank (only theirs free blocks of
// its share) until they fit. False when `r` could not get them: it was preempted
// itself, or, with steps in flight, it is the newest idle one and waits for them
// instead (their sequences may finish and free blocks).
bool Scheduler::Impl::ReserveOrPreempt(Request& r, int64_t count) {
  const int64_t needed = r.seq.num_cached_tokens() + count;
  while (!r.seq.block_table().Reserve(allocator, needed).ok()) {
    Request* victim = NewestIdleRunning(r.attention_rank);
    TESSERA_CHECK(victim != nullptr);  // r itself is idle
    if (victim == &r && !steps_in_flight.empty()) return false;
    Preempt(*victim);
    if (victim == &r) return false;
  }
  return true;
}

// How many sequences one step may carry: all of them when steps run one at a
// time; with a pipeline of k steps in flight, an even k-th of the live ones, so
// that every stage gets a micro-batch (16 streams on 2 stages: 8 and 8).
int64_t Scheduler::Impl::StepSequenceCap() const {
  const int64_t k = std::max(executor->max_in_flight(), 1);
  const int64_t live =
      std::min(static_cast<int64_t>(running.size() + waiting.size()), options.max_num_seqs);
  return std::max<int64_t>(1, (live + k - 1) / k);
}

// Decodes first (one token for each running sequence that has sampled), then
// waiting requests whose whole prompt is short (AdmitShortPrompts), then the
// prefill chunks of running sequences still computing their prompt (oldest
// first), then newly admitted requests (FIFO) while the budget, max_num_seqs, the
// step's sequence cap and the free blocks allow. Sequences held by a step in
// flight are skipped. Admission never preempts, and a step that had to preempt
// admits nothing (the victim would only take its blocks back).
Status Scheduler::Impl::BuildStep() {
  step.clear();
  budget = options.max_num_batched_tokens;
  preempted = false;
  admitted_tokens = 0;
  ++steps_built;
  const size_t cap = static_cast<size_t>(StepSequenceCap());
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      TESSERA_RETURN_IF_ERROR(ProposeGuesses());  // after the decodes, before prefills
      AdmitShortPrompts();
    }
    for (size_t i = 0; i < running.size() && budget > 0 && step.size() < cap; ++i) {
      Request& r = *running[i];
      const int64_t uncached = r.seq.num_uncached_tokens();
      const bool decode = uncached == 1;
      if (r.in_step || r.importing || decode != (pass == 0) || uncached == 0 ||
          InBuiltStep(r)) {  // the last: a short prompt admitted just now
        continue;
      }
      const int64_t count = std::min(uncached, budget);
      if (!ReserveOrPreempt(r, count)) break;  // r was the newest idle one
      step.push_back({&r, count});
      budget -= count;
    }
  }
  while (CanAdmit() && AdmitWaiting(0)) {
  }
  return Status::Ok();
}

// Whether the step being built already carries r.
bool Scheduler::Impl::InBuiltStep(const Request& r) const {
  return std::any_of(step.begin(), step.end(), [&](const Scheduled& s) { return s.request == &r; });
}

// Whether the step being built may admit another waiting request.
bool Scheduler::Impl::CanAdmit() const {
  return !preempted && !waiting.empty() && budget > 0 &&
         step.size() < static_cast<size_t>(StepSequenceCap()) &&
         static_cast<int64_t>(running.size()) < options.max_num_seqs &&
         (options.admit_prefill_tokens == 0 || admitted_tokens < options.admit_prefill_tokens);
}

// Admits, in queue order, the waiting requests whose whole prompt (all its
// tokens: a preempted one's output too) fits in what is left of
// short_prompt_tokens, capped at half the step's budget. They finish their
// prefill in this step, ahead of a long prompt's next chunk, which takes the rest.
void Scheduler::Impl::AdmitShortPrompts() {
  int64_t room =
      std::min({options.short_prompt_tokens, options.max_num_batched_tokens / 2, budget});
  for (size_t i = 0; i < waiting.size() && room > 0 && CanAdmit();) {
    const int64_t tokens = waiting[i]->seq.num_tokens();
    if (tokens > room || !AdmitWaiting(i)) {
      ++i;
      continue;
    }
    room -= tokens;  // waiting[i] is now the next one
  }
}

// Extends the step's decode entries of speculating sequences with their
// proposer's guesses, as far as the token budget, the request's limits (a guess
// past max_tokens or the model length could never be kept) and the free KV blocks
// allow: guesses never preempt anyone.
Status Scheduler::Impl::ProposeGuesses() {
  if (!options.proposer) return Status::Ok();
  proposal_requests.clear();
  proposal_entries.clear();
  if (options.spec_max_batch > 0) {
    int64_t decoding = 0;
    for (const Scheduled& entry : step) {
      decoding += entry.num_tokens == 1 && entry.request->seq.num_uncached_tokens() == 1;
    }
    if (decoding > options.spec_max_batch) return Status::Ok();
  }
  for (size_t i = 0; i < step.size() && budget > 0; ++i) {
    Request& r = *step[i].request;
    if (r.spec_max == 0 || step[i].num_tokens != 1 || r.seq.num_uncached_tokens() != 1) continue;
    int64_t k = options.spec_adaptive ? r.spec.Next() : r.spec_max;
    if (r.params.max_tokens > 0) {
      k = std::min(k, r.params.max_tokens - r.result.completion_tokens - 1);
    }
    k = std::min({k, options.max_model_len - r.seq.num_tokens(), budget});
    if (k <= 0) continue;
    proposal_requests.push_back({.sequence_id = r.seq.id(),
                                 .tokens = r.seq.tokens(),
                                 .max_tokens = static_cast<int32_t>(k),
                                 .sampling = &r.params.sampling,
                                 .num_prompt_tokens = r.seq.num_prompt_tokens()});
    proposal_entries.push_back(i);
  }
  if (proposal_requests.empty()) return Status::Ok();
  proposals.resize(proposal_requests.size());
  TESSERA_RETURN_IF_ERROR(options.proposer->Propose(proposal_requests, proposals));
  for (size_t p = 0; p < proposals.size() && budget > 0; ++p) {
    Scheduled& entry = step[proposal_entries[p]];
    Request& r = *entry.request;
    const Proposal& proposal = proposals[p];
    const int64_t k = std::min({static_cast<int64_t>(proposal.tokens.size()),
                                int64_t{proposal_requests[p].max_tokens}, budget});
    if (k == 0) continue;
    if (!r.seq.block_table().Reserve(allocator, r.seq.num_tokens() + k).ok()) continue;
    const size_t vocab = static_cast<size_t>(vocab_size);
    r.verify_tokens.assign(1, r.seq.tokens().back());
    for (int64_t g = 0; g < k; ++g) {
      const int32_t guess = proposal.tokens[static_cast<size_t>(g)];
      TESSERA_CHECK(guess >= 0 && guess < vocab_size) << "proposed token " << guess;
      r.verify_tokens.push_back(guess);
    }
    if (proposal.probs.empty()) {
      r.draft_probs.clear();
    } else {
      TESSERA_CHECK_EQ(proposal.probs.size(), proposal.tokens.size() * vocab);
      r.draft_probs.assign(proposal.probs.begin(),
                           proposal.probs.begin() + static_cast<ptrdiff_t>(k * vocab_size));
    }
    entry.num_tokens += k;
    entry.num_guesses = k;
    budget -= k;
  }
  return Status::Ok();
}

// Extends r's block hashes to its first `num_blocks` full blocks.
void Scheduler::Impl::HashFullBlocks(Request& r, int64_t num_blocks) {
  ExtendHashes(r, rank_roots[static_cast<size_t>(r.attention_rank)], num_blocks, r.block_hashes);
}

// Extends `hashes`, a chain of r's full blocks from `root`, to its first `num_blocks`.
void Scheduler::Impl::ExtendHashes(const Request& r, const kv::BlockHash& root, int64_t num_blocks,
                                   std::vector<kv::BlockHash>& hashes) const {
  for (int64_t i = static_cast<int64_t>(hashes.size()); i < num_blocks; ++i) {
    const kv::BlockHash& parent = i == 0 ? root : hashes[static_cast<size_t>(i - 1)];
    hashes.push_back(kv::HashBlock(parent, BlockTokens(r, i)));
  }
}

// The blocks of the longest run of r's leading full blocks (hashed `hashes`, a
// chain from `root`) that the prefix cache holds.
std::vector<kv::BlockId> Scheduler::Impl::CachedPrefix(
    const Request& r, const kv::BlockHash& root, std::span<const kv::BlockHash> hashes) const {
  std::vector<kv::BlockId> hits;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const kv::BlockHash& parent = i == 0 ? root : hashes[i - 1];
    std::optional<kv::BlockId> hit =
        allocator.Lookup(parent, hashes[i], BlockTokens(r, static_cast<int64_t>(i)));
    if (!hit) break;
    hits.push_back(*hit);
  }
  return hits;
}

// Data-parallel attention: picks the rank that runs r's attention and holds its
// blocks — among the ranks with room for r's first chunk now (all of them when none
// has), the one whose prefix cache holds the longest run of r's leading
// `full_blocks` blocks, then the one with the fewest running sequences, the most
// free blocks, the lowest index — and binds r's block table to it. A preempted
// request may move: its KV is recomputed anyway (or found in its old rank's
// cache, which then wins).
void Scheduler::Impl::ChooseAttentionRank(Request& r, int64_t full_blocks) {
  std::vector<int64_t> running_on(static_cast<size_t>(attention_ranks), 0);
  for (const auto& other : running) ++running_on[static_cast<size_t>(other->attention_rank)];
  int32_t best = 0;
  std::tuple<int64_t, int64_t, int64_t, int64_t> best_key;
  std::vector<kv::BlockHash> best_hashes;
  for (int32_t rank = 0; rank < attention_ranks; ++rank) {
    const kv::BlockHash& root = rank_roots[static_cast<size_t>(rank)];
    std::vector<kv::BlockHash> hashes;
    int64_t hits = 0, hits_without_owner = 0;
    if (options.enable_prefix_cache) {
      ExtendHashes(r, root, full_blocks, hashes);
      for (const kv::BlockId hit : CachedPrefix(r, root, hashes)) {
        ++hits;
        hits_without_owner += allocator.RefCount(hit) == 0 ? 1 : 0;
      }
    }
    // Whether the rank has room for the first chunk now (AdmitWaiting's test): a rank
    // that caches the prefix but is full would keep the request, and the queue
    // behind it, waiting while another could run it.
    const int64_t hit_tokens = hits * block_size;
    const int64_t count = std::min(r.seq.num_tokens() - hit_tokens, budget);
    const int64_t new_blocks = kv::BlocksForTokens(hit_tokens + count, block_size) - hits;
    const int64_t no_room =
        new_blocks + hits_without_owner > allocator.num_free_blocks(rank) ? 1 : 0;
    // Smaller is better: room now, more cached blocks, fewer running sequences, more
    // free blocks.
    const std::tuple<int64_t, int64_t, int64_t, int64_t> key(
        no_room, -hits, running_on[static_cast<size_t>(rank)],
        -int64_t{allocator.num_free_blocks(rank)});
    if (rank == 0 || key < best_key) {
      best = rank;
      best_key = key;
      best_hashes = std::move(hashes);
    }
  }
  r.attention_rank = best;
  r.block_hashes = std::move(best_hashes);  // from the chosen rank's root
  r.seq.block_table().set_partition(best);
}

// Blocks r's next reservation may take: its attention rank's share of the pool, or
// the pool.
int32_t Scheduler::Impl::FreeBlocksFor(const Request& r) const {
  return attention_ranks > 1 ? allocator.num_free_blocks(r.attention_rank)
                             : allocator.num_free_blocks();
}

std::span<const int32_t> Scheduler::Impl::BlockTokens(const Request& r, int64_t block_idx) const {
  return r.seq.tokens().subspan(static_cast<size_t>(block_idx * block_size),
                                static_cast<size_t>(block_size));
}

// How many of r's full blocks [first, end) — hashed — a running request is
// computing now (its prompt has the same leading blocks and it has not computed
// them yet), counted from `first` and for the running request that covers most.
// Such a request is in the step being built or in one in flight, or will be in
// the next (running prompts are scheduled oldest first), so the blocks enter the
// cache within a few steps; one that is preempted meanwhile stops counting.
// Chained hashes alone decide: a collision would only cost a step's wait, since
// the cache lookup after it compares tokens.
int64_t Scheduler::Impl::BlocksBeingComputed(const Request& r, int64_t first, int64_t end) const {
  int64_t most = 0;
  for (const std::unique_ptr<Request>& other : running) {
    if (other->importing) continue;
    // One that computed block `first` already registered it: then it was a hit.
    if (other->seq.num_cached_tokens() / block_size > first) continue;
    const int64_t hashed = static_cast<int64_t>(other->block_hashes.size());
    int64_t i = first;
    while (i < end && i < hashed &&
           other->block_hashes[static_cast<size_t>(i)] == r.block_hashes[static_cast<size_t>(i)]) {
      ++i;
    }
    most = std::max(most, i - first);
  }
  return most;
}

// Admits waiting request `index` with its first prefill chunk, after attaching
// the longest run of cached full blocks its tokens start with (at least one token
// is left to compute, so the step yields its logits). False, admitting nothing,
// when the chunk's new blocks do not fit the free ones (admission never preempts).
bool Scheduler::Impl::AdmitWaiting(size_t index) {
  Request& r = *waiting[index];
  TESSERA_CHECK_EQ(r.seq.num_cached_tokens(), 0);
  const int64_t full_blocks = (r.seq.num_tokens() - 1) / block_size;  // leaves >= 1 token
  if (attention_ranks > 1) ChooseAttentionRank(r, full_blocks);
  std::vector<kv::BlockId> hits;
  int64_t hits_without_owner = 0;  // leave the evictable list when taken
  if (options.enable_prefix_cache) {
    HashFullBlocks(r, full_blocks);
    hits = CachedPrefix(
        r, rank_roots[static_cast<size_t>(r.attention_rank)],
        std::span<const kv::BlockHash>(r.block_hashes).first(static_cast<size_t>(full_blocks)));
    for (kv::BlockId hit : hits) hits_without_owner += allocator.RefCount(hit) == 0 ? 1 : 0;
  }
  const int64_t num_hit_tokens = static_cast<int64_t>(hits.size()) * block_size;
  if (options.kv_importer != nullptr && !r.import_tried &&
      full_blocks > static_cast<int64_t>(hits.size())) {
    return AdmitImport(index, hits, hits_without_owner, full_blocks);
  }
  if (options.enable_prefix_cache && options.prefix_wait_min_tokens > 0 &&
      BlocksBeingComputed(r, static_cast<int64_t>(hits.size()), full_blocks) * block_size >=
          options.prefix_wait_min_tokens) {
    if (r.prefix_wait_step != steps_built) ++counters.prefix_cache_waits_total;  // tried twice
    r.prefix_wait_step = steps_built;
    return false;
  }
  const int64_t count = std::min(r.seq.num_tokens() - num_hit_tokens, budget);
  const int64_t new_blocks =
      kv::BlocksForTokens(num_hit_tokens + count, block_size) - static_cast<int64_t>(hits.size());
  if (new_blocks + hits_without_owner > FreeBlocksFor(r)) return false;
  kv::BlockTable& table = r.seq.block_table();
  for (kv::BlockId block : hits) table.AppendCached(allocator, block);
  // A partitioned pool (context parallelism) may lack one partition's share.
  if (!table.Reserve(allocator, num_hit_tokens + count).ok()) {
    table.Release(allocator);
    return false;
  }
  r.seq.MarkCached(num_hit_tokens);
  r.num_registered_blocks = static_cast<int64_t>(hits.size());
  r.result.attention_rank = r.attention_rank;
  if (options.enable_prefix_cache) {
    ++counters.prefix_cache_queries_total;
    counters.prefix_cache_query_tokens_total += r.seq.num_tokens();
    counters.prefix_cache_hit_tokens_total += num_hit_tokens;
    counters.prefix_cache_hit_blocks_total += static_cast<int64_t>(hits.size());
  }
  if (r.scheduled_ns == 0) {
    r.scheduled_ns = NowNs();
    r.result.cached_tokens = num_hit_tokens;
  }
  running.push_back(std::move(waiting[index]));
  waiting.erase(waiting.begin() + static_cast<ptrdiff_t>(index));
  step.push_back({&r, count});
  budget -= count;
  admitted_tokens += count;
  return true;
}

// Admits waiting request `index`, r, for a KV import (prefill/decode
// disaggregation): its cached leading blocks are attached, blocks are allocated
// for the rest of its first `full_blocks` full blocks, and the importer is asked
// to fill them; r runs once ImportDone reports. False, admitting nothing, when
// the blocks do not fit.
bool Scheduler::Impl::AdmitImport(size_t index, const std::vector<kv::BlockId>& hits,
                                  int64_t hits_without_owner, int64_t full_blocks) {
  Request& r = *waiting[index];
  const int64_t num_hits = static_cast<int64_t>(hits.size());
  if (full_blocks - num_hits + hits_without_owner > FreeBlocksFor(r)) return false;
  kv::BlockTable& table = r.seq.block_table();
  for (kv::BlockId block : hits) table.AppendCached(allocator, block);
  if (!table.Reserve(allocator, full_blocks * block_size).ok()) {
    table.Release(allocator);
    return false;
  }
  r.seq.MarkCached(num_hits * block_size);
  r.num_registered_blocks = num_hits;
  r.result.attention_rank = r.attention_rank;
  if (options.enable_prefix_cache) {
    ++counters.prefix_cache_queries_total;
    counters.prefix_cache_query_tokens_total += r.seq.num_tokens();
    counters.prefix_cache_hit_tokens_total += num_hits * block_size;
    counters.prefix_cache_hit_blocks_total += num_hits;
  }
  if (r.scheduled_ns == 0) {
    r.scheduled_ns = NowNs();
    r.result.cached_tokens = num_hits * block_size;
  }
  r.import_tried = true;
  r.importing = true;
  r.import_tokens = full_blocks * block_size;
  ++counters.kv_imports_total;
  const std::span<const kv::BlockId> blocks = table.blocks().subspan(static_cast<size_t>(num_hits));
  std::vector<int32_t> tokens(r.seq.tokens().begin(),
                              r.seq.tokens().begin() + static_cast<ptrdiff_t>(r.import_tokens));
  running.push_back(std::move(waiting[index]));
  waiting.erase(waiting.begin() + static_cast<ptrdiff_t>(index));
  // Their memory mapped now, while the transfer runs (an error here is the
  // executor's, and fails the next step).
  Status mapped = executor->PrepareKvBlocks(blocks);
  options.kv_importer->Start(r.seq.id(), std::move(tokens), num_hits,
                             std::vector<int32_t>(blocks.begin(), blocks.end()));
  return true;
}

// Offers the cache every full block of r computed since the last call (a block
// another sequence already registered stays private to r).
void Scheduler::Impl::RegisterFullBlocks(Request& r) {
  if (!options.enable_prefix_cache) return;
  const int64_t full = r.seq.num_cached_tokens() / block_size;
  if (full <= r.num_registered_blocks) return;
  HashFullBlocks(r, full);
  const std::span<const kv::BlockId> blocks = r.seq.block_table().blocks();
  const kv::BlockHash& root = rank_roots[static_cast<size_t>(r.attention_rank)];
  for (int64_t i = r.num_registered_blocks; i < full; ++i) {
    const kv::BlockHash& parent = i == 0 ? root : r.block_hashes[static_cast<size_t>(i - 1)];
    allocator.Register(blocks[static_cast<size_t>(i)], parent,
                       r.block_hashes[static_cast<size_t>(i)], BlockTokens(r, i));
  }
  r.num_registered_blocks = full;
}

// Hands the built step to the executor; its requests are in_step until collected.
Status Scheduler::Impl::SubmitStep() {
  entries.clear();
  for (const Scheduled& s : step) {
    const int64_t begin = s.request->seq.num_cached_tokens();
    const std::span<const int32_t> tokens =
        s.num_guesses > 0 ? std::span<const int32_t>(s.request->verify_tokens)
                          : s.request->seq.tokens().subspan(static_cast<size_t>(begin),
                                                            static_cast<size_t>(s.num_tokens));
    entries.push_back({.new_tokens = tokens,
                       .start_position = begin,
                       .block_table = &s.request->seq.block_table(),
                       .all_logits = s.num_guesses > 0});
    s.request->in_step = true;
  }
  // Prefills whose transfers take each layer's K/V as soon as it is computed: the
  // blocks the step completes (and, at the first, those complete before it).
  struct LayerWatch {
    const Request* request;
    int64_t first_block;
    size_t at, count;  // its blocks in stream_blocks
  };
  std::vector<LayerWatch> watches;
  stream_blocks.clear();
  for (const Scheduled& s : step) {
    Request& r = *s.request;
    if (!r.callbacks.on_layer_kv || s.num_guesses > 0) continue;
    const int64_t end = (r.seq.num_cached_tokens() + s.num_tokens) / block_size;
    if (end <= r.layer_kv_blocks) continue;
    const std::span<const kv::BlockId> blocks = r.seq.block_table().blocks();
    watches.push_back({&r, r.layer_kv_blocks, stream_blocks.size(),
                       static_cast<size_t>(end - r.layer_kv_blocks)});
    stream_blocks.insert(stream_blocks.end(), blocks.begin() + r.layer_kv_blocks,
                         blocks.begin() + end);
    r.layer_kv_blocks = end;
  }
  const bool observed =
      !watches.empty() &&
      executor->ObserveKvLayers(
          stream_blocks, [&watches](int32_t layer, std::span<const uint8_t* const> pieces) {
            for (const LayerWatch& w : watches) {
              w.request->callbacks.on_layer_kv(w.first_block, layer, pieces.subspan(w.at, w.count));
            }
          });
  const Status submitted = executor->Submit(entries);
  if (observed) executor->ObserveKvLayers({}, {});
  TESSERA_RETURN_IF_ERROR(submitted);
  steps_in_flight.push_back(std::move(step));
  step.clear();
  return Status::Ok();
}

// Finishes the oldest step in flight: its tokens are cached now, and each
// sequence whose prompt is complete samples its next token (emit) — unless its
// request was cancelled meanwhile, which ends here.
Status Scheduler::Impl::CollectStep(bool emit) {
  std::vector<Scheduled> done = std::move(steps_in_flight.front());
  steps_in_flight.pop_front();
  for (const Scheduled& s : done) s.request->in_step = false;
  TESSERA_ASSIGN_OR_RETURN(std::span<const float> logits, executor->Collect());
  ++counters.steps_total;
  const double comm_s = executor->last_step_comm_seconds();
  int64_t step_tokens = 0;
  for (const Scheduled& s : done) step_tokens += s.num_tokens;
  const size_t vocab = static_cast<size_t>(executor->vocab_size());
  size_t row = 0;  // the entry's first logits row: one per entry, 1 + guesses for a speculating one
  for (size_t j = 0; j < done.size(); ++j) {
    Request& r = *done[j].request;
    const int64_t guesses = done[j].num_guesses;
    const size_t rows = static_cast<size_t>(guesses) + 1;
    const std::span<const float> entry_logits = logits.subspan(row * vocab, rows * vocab);
    row += rows;
    r.seq.MarkCached(done[j].num_tokens - guesses);  // guesses count once kept
    RegisterFullBlocks(r);
    r.result.timing.comm_s +=
        comm_s * static_cast<double>(done[j].num_tokens) / static_cast<double>(step_tokens);
    if (r.handle->cancelled()) {
      Finish(r, FinishReason::kCancelled);
      continue;
    }
    if (emit && r.callbacks.on_progress) {
      r.callbacks.on_progress(r.seq.block_table().blocks(), r.seq.num_cached_tokens(), *executor);
    }
    if (emit && r.callbacks.on_prefilled && r.seq.num_uncached_tokens() == 0) {
      r.callbacks.on_prefilled(r.seq.block_table().blocks());  // a prefill only: done
      ++counters.kv_exports_total;
      Finish(r, FinishReason::kStop);
      continue;
    }
    if (!emit || r.seq.num_uncached_tokens() > 0) {  // more prefill chunks to go
      if (guesses > 0) DropGuesses(r);
      continue;
    }
    if (guesses > 0) {
      Verify(r, entry_logits, guesses);
    } else {
      Emit(r, entry_logits);
    }
  }
  EraseFinished();
  return Status::Ok();
}

// Collects every step in flight without sampling from them (Stop with cancel).
Status Scheduler::Impl::DrainInFlight() {
  while (!steps_in_flight.empty()) TESSERA_RETURN_IF_ERROR(CollectStep(/*emit=*/false));
  return Status::Ok();
}

// The executor failed: the steps in flight never come back and the KV cache is
// gone, the prefix cache's blocks with it. Every running sequence is preempted (admission order
// kept, ahead of the waiting ones), so it recomputes its prompt and generated tokens and continues.
void Scheduler::Impl::LoseEngineState() {
  steps_in_flight.clear();
  step.clear();
  for (auto& r : running) {
    if (r->importing) {
      // Its transfer's blocks go with the engine: the prompt is computed here once
      // the request is admitted again, and the transfer is given up (its report,
      // when it comes, finds no importing request). Only a several-rank executor
      // recovers, and its importer lands blocks through it, never in place, so
      // nothing writes into the released blocks.
      r->importing = false;
      if (!r->import_cancelled) {
        r->import_cancelled = true;
        options.kv_importer->Cancel(r->seq.id());
      }
    }
    r->in_step = false;
    r->seq.block_table().Release(allocator);
    r->seq.ForgetCached();
    r->num_registered_blocks = 0;
    r->layer_kv_blocks = 0;
  }
  for (auto it = running.rbegin(); it != running.rend(); ++it) waiting.push_front(std::move(*it));
  running.clear();
  allocator.ClearCache();  // the cached blocks' K/V went with the old executor
  TESSERA_CHECK(allocator.num_used_blocks() == 0);
  TESSERA_CHECK(allocator.num_cached_blocks() == 0);
}

// Drops the failed executor's state and asks for a replacement with the same KV
// geometry; requests keep queueing meanwhile (Stats().recovering).
Status Scheduler::Impl::Recover(const Status& failure) {
  LoseEngineState();
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.recovering = true;
    stats.recovering_since_ns = NowNs();
    counters.recovering = true;
    counters.recovering_since_ns = stats.recovering_since_ns;
  }
  Publish();
  StepExecutor* const failed = executor;
  executor = nullptr;  // `recover` may destroy it
  Result<StepExecutor*> next = recover(failure);
  if (!next.ok()) return next.status().WithContext("the engine failed (" + failure.message() + ")");
  if (*next == nullptr) {  // intact after all
    executor = failed;
    counters.recovering = false;
    counters.recovering_since_ns = 0;
    Publish();
    return Status::Ok();
  }
  StepExecutor& e = **next;
  if (e.num_kv_blocks() != allocator.num_blocks() || e.kv_block_size() != block_size ||
      e.attention_ranks() != attention_ranks || PoolPartitions(e) != allocator.num_partitions() ||
      e.vocab_size() != vocab_size) {
    return InternalError("the restarted engine has another KV geometry or vocabulary");
  }
  executor = &e;
  counters.recovering = false;
  counters.recovering_since_ns = 0;
  ++counters.engine_restarts_total;
  Publish();
  return Status::Ok();
}

// Samples the next token of `r` from its logits row and emits it (EmitToken).
void Scheduler::Impl::Emit(Request& r, std::span<const float> logits) {
  EmitToken(r,
            r.seq.sampler().Sample(logits, r.seq.tokens(),
                                   static_cast<size_t>(r.seq.num_prompt_tokens())),
            logits);
}

// Verifies r's guesses against the step's logits rows for its pending token and
// each guess: the sampler keeps or replaces each guess in turn (the greedy argmax
// or the rejection rule); kept guesses' K/V are the step's, the first replaced one
// ends the run and becomes the pending token, and when all are kept the last row
// gives one more token. Each kept token is emitted as Emit would, so EOS, stop
// strings and the limits end the request at the same token as without guesses.
void Scheduler::Impl::Verify(Request& r, std::span<const float> logits, int64_t num_guesses) {
  const size_t vocab = static_cast<size_t>(vocab_size);
  const size_t num_prompt = static_cast<size_t>(r.seq.num_prompt_tokens());
  int64_t accepted = 0;
  for (int64_t g = 0; g <= num_guesses && !r.finished; ++g) {
    const std::span<const float> row = logits.subspan(static_cast<size_t>(g) * vocab, vocab);
    if (g == num_guesses) {
      Emit(r, row);
      break;
    }
    const std::span<const float> probs =
        r.draft_probs.empty()
            ? std::span<const float>()
            : std::span<const float>(r.draft_probs).subspan(static_cast<size_t>(g) * vocab, vocab);
    const model::Sampler::Verified v = r.seq.sampler().Verify(
        row, r.seq.tokens(), num_prompt, r.verify_tokens[static_cast<size_t>(g) + 1], probs);
    EmitToken(r, v.token, row);
    if (!v.accepted) break;
    ++accepted;
    if (!r.finished) r.seq.MarkCached(1);  // the guess's K/V, computed by this step
  }
  counters.spec_proposed_tokens_total += num_guesses;
  counters.spec_accepted_tokens_total += accepted;
  ++counters.spec_verifications_total;
  r.result.spec_proposed_tokens += num_guesses;
  r.result.spec_accepted_tokens += accepted;
  r.spec.Update(r.spec_max, num_guesses, accepted);
  DropGuesses(r);
}

// After a speculating step: forgets the guesses and gives back the blocks that
// only rejected guesses' K/V filled (rows past the kept tokens in a kept block
// are overwritten before the block is ever full, so never cached).
void Scheduler::Impl::DropGuesses(Request& r) {
  r.verify_tokens.clear();
  r.draft_probs.clear();
  if (r.finished) return;
  RegisterFullBlocks(r);
  r.seq.block_table().Truncate(allocator, r.seq.num_cached_tokens());
}

// Appends `token`, sampled from `logits`, to r, streams it and applies the stop
// conditions (EOS, stop strings, max_tokens, max_model_len).
void Scheduler::Impl::EmitToken(Request& r, int32_t token, std::span<const float> logits) {
  r.seq.AppendToken(token);
  if (r.first_token_ns == 0) {
    r.first_token_ns = NowNs();
    if (r.prefilled_ns > 0)
      r.result.timing.kv_handoff_s = Seconds(r.first_token_ns - r.prefilled_ns);
    counters.prompt_tokens_total += r.result.prompt_tokens;
  }
  ++r.result.completion_tokens;
  ++counters.generation_tokens_total;

  TokenEvent event;
  event.token = token;
  event.logits = logits;
  LogProbs(logits, token, r.params.top_logprobs, event);
  std::optional<FinishReason> reason;
  if (!r.params.ignore_eos && tokenizer.IsEndOfGeneration(token)) {
    reason = FinishReason::kStop;
  } else {
    r.held_text += r.decoder.Push(token);
    const std::span<const std::string> stops = r.params.stop;
    const size_t stop_at = FindStop(r.held_text, stops);
    if (stop_at != std::string::npos) {
      event.text = r.held_text.substr(0, stop_at);
      r.held_text.clear();
      if (r.callbacks.on_token) r.callbacks.on_token(event);
      Finish(r, FinishReason::kStop);
      return;
    }
    if (r.params.max_tokens > 0 && r.result.completion_tokens >= r.params.max_tokens) {
      reason = FinishReason::kLength;
    } else if (r.seq.num_tokens() >= options.max_model_len) {
      reason = FinishReason::kLength;
    }
  }
  if (reason) {
    // Nothing can complete a stop string any more: release what was held back.
    event.text = std::move(r.held_text) + r.decoder.Flush();
    r.held_text.clear();
  } else {
    const size_t hold = StopPrefixSuffix(r.held_text, r.params.stop);
    event.text = r.held_text.substr(0, r.held_text.size() - hold);
    r.held_text.erase(0, r.held_text.size() - hold);
  }
  if (r.callbacks.on_token) r.callbacks.on_token(event);
  if (reason) Finish(r, *reason);
}

void Scheduler::Impl::Publish() {
  std::lock_guard<std::mutex> lock(mu);
  SchedulerStats& out = stats;
  out = counters;
  out.running = static_cast<int64_t>(running.size());
  out.waiting = static_cast<int64_t>(waiting.size());
  out.kv_blocks_used = allocator.num_used_blocks();
  out.kv_blocks_total = allocator.num_blocks();
  out.prefix_cache_enabled = options.enable_prefix_cache;
  out.prefix_cache_evictions_total = allocator.num_evictions();
  out.kv_blocks_cached = allocator.num_cached_blocks();
  out.kv_blocks_evictable = allocator.num_evictable_blocks();
  out.spec_proposer = options.proposer ? options.proposer->name() : "";
  out.running_by_attention_rank.assign(static_cast<size_t>(attention_ranks), 0);
  for (const auto& r : running)
    ++out.running_by_attention_rank[static_cast<size_t>(r->attention_rank)];
}

}  // namespace tessera::engine
