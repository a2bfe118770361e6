// Scheduler: the one generation loop — continuous batching over a StepExecutor
// (the Driver, over one rank or a tensor/pipeline-parallel plan); `tessera serve`
// submits requests as they arrive, `tessera generate` submits its batch up front.
// Requests arrive from any thread; the scheduler thread (Run) builds every step
// from the running sequences — decodes first, then prefill chunks up to the token
// budget — allocates KV blocks on demand, preempts the newest idle sequence when
// blocks run out (its blocks are freed and it is recomputed later; batch
// invariance keeps its output identical), and streams each sampled token to its
// request. With the prefix cache on, admission attaches the longest cached run of
// full blocks the sequence's tokens start with (kv::BlockAllocator's content-hashed
// blocks, shared and refcounted) and prefills only the rest; every full block a
// step computes is registered, and finished or preempted sequences leave theirs
// cached until the allocator needs them. Workers follow the driver's block ids,
// so this holds on one rank and under TP/PP alike. It keeps up to the executor's max_in_flight()
// steps outstanding, each over sequences no other outstanding step holds (an even share of them),
// so a pipeline's stages work on different micro-batches at once. With data-parallel attention
// (the executor's attention_ranks() > 1) each request is admitted to one rank — among those with
// room for its first chunk now, the one whose prefix cache holds most of its prompt, else the
// least loaded — and all its blocks come from that
// rank's share of the pool (a preempted request may move when it is admitted again). Layer:
// engine; serve/ submits requests and reads the stats for /metrics.
//
// Speculative decoding (docs/speculative.md): with a Proposer, a decoding
// sequence's entry carries its pending token and up to k guesses, verified in the
// same step as the other decodes and prefill chunks (its logits rows for all of
// them); the longest prefix of guesses the sampler keeps (Sampler::Verify) is
// accepted plus the target's own next token, and the rejected guesses' KV rows
// are dropped (blocks beyond the kept tokens freed; the prefix cache only ever
// registers blocks of kept tokens). Each sequence adapts its k to its recent
// acceptance, down to none for a while when guesses keep failing.
//
// Thread safety: Submit, Cancel (through the handle), Stop and Stats may be called
// from any thread; Run from exactly one. Callbacks run on the scheduler thread and
// must not block for long (hand the event to the HTTP thread and return).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/proposer.h"
#include "engine/step_executor.h"
#include "kv/block_hash.h"
#include "kv/cache_event_log.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

namespace tessera::engine {

class KvImporter;  // below

struct SchedulerOptions {
  int64_t max_num_batched_tokens = 512;  // new tokens per step (decodes + prefill chunks)
  int64_t max_num_seqs = 64;             // running sequences
  int64_t max_waiting = 256;             // queued requests beyond which Submit refuses
  int64_t max_model_len = 0;             // prompt + output tokens; 0 = the KV capacity
  bool enable_prefix_cache = true;       // reuse the KV of cached full blocks (--no-prefix-cache)
  // A waiting request whose next uncached full blocks — at least this many tokens
  // of them — a running request is computing right now (the same system prompt
  // admitted a step earlier, or with it) waits for them to enter the cache
  // instead of computing them a second time; admission behind it waits too (FIFO).
  // 0: never waits. Needs the prefix cache.
  int64_t prefix_wait_min_tokens = 32;
  // A step admits waiting requests until their prompt tokens in it reach this many
  // (the first is always admitted; 0: as many as the token budget allows). Prompts
  // that arrive together then start one after another instead of all finishing
  // their prefill in one long step: on compute-bound prefills the mean time to
  // first token falls (k prompts: (k + 1) / 2 prompt-times instead of k) for the
  // same work. Running prompts' later chunks are not counted.
  int64_t admit_prefill_tokens = 0;
  // Short prompts first: before running prompts' later chunks take the step's
  // budget, waiting requests whose whole prompt fits in this many tokens (at most
  // half the budget) are admitted, in queue order. A 64-token prompt arriving
  // while a 2,000-token one is being prefilled then starts at the next step
  // instead of after the long prompt's last chunk; the long one still gets the
  // rest of every step, so it is never starved. 0: strict FIFO admission.
  int64_t short_prompt_tokens = 128;
  // Speculative decoding: the proposer (none: off), the guesses per step a request
  // makes at most unless it says otherwise (RequestParams::spec_tokens; 0: only
  // requests that ask speculate), and whether each sequence adapts its number of
  // guesses to its acceptance (false: always the maximum a proposal offers).
  std::shared_ptr<Proposer> proposer;
  int32_t spec_tokens = 0;
  bool spec_adaptive = true;
  // No guesses in a step where more sequences than this decode (0: no limit):
  // verifying guesses is nearly free only while a step is memory-bound, and with
  // many sequences decoding the batch alone fills the cores (and a draft's serial
  // steps cost more than they save).
  int32_t spec_max_batch = 0;
  // Prefill/decode disaggregation: the decode side's source of prompt K/V (null:
  // every prompt is computed here). Must outlive the scheduler's Run.
  KvImporter* kv_importer = nullptr;
};

// Guesses one speculating entry verifies at most.
inline constexpr int32_t kMaxSpecTokens = 16;

// InvalidArgument unless every limit is positive, max_num_batched_tokens >=
// max_num_seqs (each running sequence's decode token fits in one step),
// max_model_len fits in the executor's KV cache (with data-parallel attention, in
// one rank's share of it; the ranks share it equally) and spec_tokens is in
// [0, kMaxSpecTokens] (> 0 only with a proposer).
Status ValidateSchedulerOptions(const SchedulerOptions& options, const StepExecutor& executor);

struct RequestParams {
  std::vector<int32_t> prompt;  // token ids (BOS included when wanted)
  int64_t max_tokens = 16;      // new tokens at most; 0 = until max_model_len
  model::SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings; matched across token boundaries
  bool ignore_eos = false;
  int32_t top_logprobs = 0;  // > 0: the log-probabilities of the top-k tokens at each step
  // Speculative guesses per step at most: -1 the scheduler's spec_tokens, 0 none,
  // up to kMaxSpecTokens (needs the scheduler's proposer). The output is the same
  // either way (greedy: token for token; sampling: in distribution).
  int32_t spec_tokens = -1;
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
std::string_view FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled", "error"

// One generated token, as the request sees it. Every sampled token gets exactly
// one event, the one that ends the request (EOS, a stop string, a limit)
// included, so completion_tokens == the number of events.
struct TokenEvent {
  int32_t token = 0;
  // The text this token completes (incomplete UTF-8 held back; text of a matched
  // stop string, and anything after it, never emitted).
  std::string text;
  // log-softmax of the model's raw logits row at `token` (before repetition
  // penalty, temperature and filtering, so it does not depend on the sampling
  // parameters).
  float logprob = 0;
  // When requested: the top_logprobs most likely tokens under the same
  // log-softmax, most likely first (ties: lower id first).
  std::vector<std::pair<int32_t, float>> top_logprobs;
  // The raw [vocab] logits row `token` was sampled from; valid during the callback only.
  std::span<const float> logits;
};

struct RequestTiming {
  double queue_s = 0;    // submitted → first scheduled
  double prefill_s = 0;  // first scheduled → first token
  double decode_s = 0;   // first token → finished
  double comm_s = 0;     // this request's share of the steps' communication time
  // Prefill/decode disaggregation (decode side; -1 when no KV was imported): from
  // the prefill's end (its last burst's frame) to the last block in — what of the
  // transfer the prefill did not hide — and to this request's first token.
  double kv_transfer_s = -1;
  double kv_handoff_s = -1;
};

struct RequestResult {
  FinishReason reason = FinishReason::kStop;
  Status error;  // when reason == kError
  int64_t prompt_tokens = 0;
  // Prompt tokens whose K/V came from the prefix cache at admission (OpenAI's
  // usage.prompt_tokens_details.cached_tokens).
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  // Speculative decoding: guesses verified and accepted for this request.
  int64_t spec_proposed_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  // Prefill/decode disaggregation: prompt tokens whose K/V a KvImporter brought,
  // and the bytes it reported for them.
  int64_t kv_imported_tokens = 0;
  int64_t kv_transfer_bytes = 0;
  int64_t kv_streamed_bytes = 0;  // of those, sent while the prefill still ran
  // Data-parallel attention: the rank that ran its attention (last admitted there).
  int32_t attention_rank = 0;
  RequestTiming timing;
};

struct RequestCallbacks {
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(const RequestResult&)> on_done;  // exactly once, last
  // Prefill/decode disaggregation, the prefill side (docs/pd.md): when set, the
  // request is a prefill only — once every prompt token's K/V is computed this is
  // called (scheduler thread, the blocks still held: copy what is needed before
  // returning) with the block table, and the request ends kStop with no token.
  std::function<void(std::span<const int32_t> blocks)> on_prefilled;
  // With on_prefilled: called after each step that computed some of the prompt
  // (scheduler thread, the blocks held), with the block table and how many of the
  // prompt's tokens have their K/V computed now (prefix-cache hits included): the
  // full blocks below that are final, so a transfer can send them while later
  // chunks are computed. The last call comes before on_prefilled. `executor`, with
  // nothing in flight, reads blocks held on several ranks (ReadKvBlocks).
  std::function<void(std::span<const int32_t> blocks, int64_t computed_tokens,
                     StepExecutor& executor)>
      on_progress;
  // With on_progress, on an executor that reports layers (StepExecutor::
  // ObserveKvLayers): called inside each step that completes some of the prompt's
  // blocks (scheduler thread) after each layer's attention, with layer `layer` of
  // the request's blocks [first_block, first_block + pieces.size()) of its table —
  // those the step completes, and at the first call those complete before it — as
  // a cache of the whole model lays them out (valid during the call), so a transfer
  // can send them while the step's later layers compute. on_progress still follows
  // the step.
  std::function<void(int64_t first_block, int32_t layer, std::span<const uint8_t* const> pieces)>
      on_layer_kv;
};

// Prefill/decode disaggregation, the decode side (docs/pd.md): where a request's
// prompt K/V comes from when it is computed on a prefill instance. The scheduler
// calls Start on its thread when it admits a request whose prompt has full blocks
// beyond what its prefix cache holds, with the blocks it allocated for them; the
// importer fills them (any thread) and reports with Scheduler::ImportDone —
// exactly once per Start, and it must not touch the blocks after that. Until
// then the request is not scheduled, cancelled or preempted.
class KvImporter {
 public:
  virtual ~KvImporter() = default;
  // Fetch the K/V of `tokens` (whole blocks: blocks.size() · block size after
  // first_block blocks) into `blocks`, the request's blocks first_block onwards.
  virtual void Start(int64_t transfer_id, std::vector<int32_t> tokens, int64_t first_block,
                     std::vector<int32_t> blocks) = 0;
  // Scheduler thread, between steps, for each transfer ImportDone reported done,
  // before its blocks count as computed: an importer that could not fill the
  // blocks in place (a sharded instance's cache is on every rank) writes them now
  // through `executor` (StepExecutor::WriteKvBlocks). An error fails the import:
  // the prompt is computed here. A null executor: the request ended meanwhile,
  // drop what is held for it.
  virtual Status Land(int64_t transfer_id, StepExecutor* executor) {
    (void)transfer_id, (void)executor;
    return Status::Ok();
  }
  // Any thread: the request was cancelled (its client went away) while the
  // transfer runs. Give it up where it can be — the prefill not computed for
  // nobody — and still report it exactly once (ImportDone). May come after the
  // report; then nothing to do.
  virtual void Cancel(int64_t transfer_id) { (void)transfer_id; }
};

// Lets the submitter cancel (a client that disconnected): its blocks are freed at
// the next step and on_done reports kCancelled.
class RequestHandle {
 public:
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  int64_t id() const { return id_; }

 private:
  friend class Scheduler;
  explicit RequestHandle(int64_t id) : id_(id) {}
  int64_t id_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;  // every attention rank's together
  // Data-parallel attention: the running sequences on each rank ([attention_ranks]).
  std::vector<int64_t> running_by_attention_rank;
  int64_t prompt_tokens_total = 0;  // counters since start
  int64_t generation_tokens_total = 0;
  int64_t requests_finished_total = 0;
  int64_t preemptions_total = 0;
  int64_t steps_total = 0;
  // Executor recovery (SetRecovery): whether the scheduler waits for a new
  // executor now, and how many times one replaced a failed one.
  bool recovering = false;
  int64_t recovering_since_ns = 0;
  int64_t engine_restarts_total = 0;
  // Prefix cache: admissions that looked it up, the tokens they asked about
  // (prompt + any generated before a preemption), the tokens and full blocks
  // found; the blocks it holds now (owned or not) and those with no owner
  // (evictable, counted as free in kv_blocks_used), and evictions so far.
  bool prefix_cache_enabled = false;
  int64_t prefix_cache_queries_total = 0;
  int64_t prefix_cache_query_tokens_total = 0;
  int64_t prefix_cache_hit_tokens_total = 0;
  int64_t prefix_cache_hit_blocks_total = 0;
  int64_t prefix_cache_evictions_total = 0;
  // Admissions put off for a step because a running request was computing the
  // prompt's next blocks (prefix_wait_min_tokens).
  int64_t prefix_cache_waits_total = 0;
  int64_t kv_blocks_cached = 0;
  int64_t kv_blocks_evictable = 0;
  // Speculative decoding: the proposer's name ("" when off); guesses verified and
  // accepted, and the entries that verified at least one guess (acceptance rate =
  // accepted / proposed; mean accepted length = accepted / verifications).
  std::string spec_proposer;
  int64_t spec_proposed_tokens_total = 0;
  int64_t spec_accepted_tokens_total = 0;
  int64_t spec_verifications_total = 0;
  // Prefill/decode disaggregation: imports started, failed (the prompt was then
  // computed here), prompt tokens and bytes imported; prefills exported.
  int64_t kv_imports_total = 0;
  int64_t kv_import_failures_total = 0;
  int64_t kv_import_tokens_total = 0;
  int64_t kv_import_bytes_total = 0;
  int64_t kv_import_streamed_bytes_total = 0;  // of those, sent while the prefill still ran
  int64_t kv_exports_total = 0;
};

// Replaces a failed executor: called on the scheduler thread with the failure,
// returns the executor to go on with (same KV geometry and vocabulary; it must
// outlive the scheduler or the next replacement), nullptr to go on with the same
// executor (after a RequestRecovery, when it turns out intact), or the error to
// end with.
using ExecutorRecovery = std::function<Result<StepExecutor*>(const Status& failure)>;

class Scheduler {
 public:
  // `executor` and `tokenizer` must outlive the scheduler; `options` must pass
  // ValidateSchedulerOptions (checked). The scheduler owns the executor's KV
  // blocks: nothing else may run steps on it meanwhile.
  Scheduler(StepExecutor& executor, const model::Tokenizer& tokenizer,
            const SchedulerOptions& options);
  ~Scheduler();

  // Queues a request. InvalidArgument for bad parameters (empty prompt, a token
  // outside the vocabulary, prompt + max_tokens beyond max_model_len or a prompt
  // that leaves no room for one token, bad sampling values, an empty stop
  // string); ResourceExhausted when max_waiting requests are already queued or
  // Stop was called (or Run returned).
  Result<std::shared_ptr<RequestHandle>> Submit(RequestParams params, RequestCallbacks callbacks);

  // Serves until Stop(); returns the first executor error (every in-flight
  // request then finishes with kError) — unless SetRecovery was called.
  Status Run();
  // Makes an executor failure survivable: the steps in flight are dropped, every
  // running sequence gives up its KV blocks as if preempted (it keeps its tokens
  // and sampler, so once recomputed it goes on exactly where it was: the tokens
  // already streamed stay valid), `recover` is asked for a replacement, and the
  // loop goes on with it. Requests keep queueing meanwhile (max_waiting bounds
  // them); once the outage has lasted `unavailable_after_ms`, Submit answers
  // Unavailable instead. Call before Run.
  void SetRecovery(ExecutorRecovery recover, int64_t unavailable_after_ms);
  // Replaces the executor at the next turn of the loop, as if it had failed with
  // `reason` (a supervisor saw a rank die while the loop was idle). Any thread;
  // needs SetRecovery.
  void RequestRecovery(Status reason);
  // Stops accepting requests; with cancel_in_flight, finishes every queued and
  // running request with kCancelled, else lets them complete first. Run returns
  // once nothing is left.
  void Stop(bool cancel_in_flight);
  // A KvImporter finished transfer `transfer_id`: ok (its blocks hold the K/V,
  // `bytes` arrived; `prefilled_ns`, NowNs() when the prefill instance said it was
  // done, 0 if unknown) or failed (the prompt is then computed here). Any thread.
  // streamed_bytes: of `bytes`, those that arrived before the prefill ended (sent
  // while its later chunks were computed).
  void ImportDone(int64_t transfer_id, Status status, int64_t bytes, int64_t prefilled_ns = 0,
                  int64_t streamed_bytes = 0);

  SchedulerStats Stats() const;
  // Prompt + output tokens a request may reach: SchedulerOptions::max_model_len, or
  // the KV capacity (one attention rank's share) when that was 0. Fixed at
  // construction; any thread.
  int64_t max_model_len() const;
  // The prefix cache's block hashes as they are registered and forgotten (none
  // with the cache off), the hash every chain starts from and the tokens per
  // block: what a data-parallel front needs to know what this replica caches
  // (docs/serve.md, "Data parallelism"). Any thread. With data-parallel attention
  // each rank's chains start from a root of their own instead (the salt +
  // "/attention-rank/<rank>").
  const kv::CacheEventLog& cache_events() const;
  kv::BlockHash prefix_cache_root() const;
  int64_t kv_block_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::engine
