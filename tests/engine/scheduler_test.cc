// Scheduler: continuous batching gives each request exactly the tokens it gets
// alone (greedy and seeded sampling), also when a tiny KV cache
// forces preemptions; long prompts are chunked into steps that keep decoding the
// running streams; stop strings across token boundaries, EOS, max_tokens and the
// context length end requests; Cancel and Stop(true) free everything; Submit
// refuses bad requests. On ../shared/models/stories260K.gguf (skipped without it).
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/block_table.h"
#include "model/sampler.h"
#include "test_models.h"

namespace tessera::engine {
namespace {

// Wraps an executor: records every step's entries (new tokens, start position),
// reports a fixed communication time per step, and from step `force_eos_from`
// on makes EOS the argmax of every logits row; from step `fail_from` on fails.
class RecordingExecutor final : public StepExecutor {
 public:
  struct Entry {
    int64_t num_tokens;
    int64_t start_position;
  };

  explicit RecordingExecutor(StepExecutor& inner) : inner_(inner) {}

  int64_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int32_t kv_block_size() const override { return inner_.kv_block_size(); }
  Status Submit(std::span<const StepEntry> entries, bool all_logits) override {
    std::vector<Entry>& step = steps.emplace_back();
    for (const StepEntry& e : entries) {
      step.push_back({static_cast<int64_t>(e.new_tokens.size()), e.start_position});
    }
    return inner_.Submit(entries, all_logits);
  }
  Result<std::span<const float>> Collect() override {
    TESSERA_ASSIGN_OR_RETURN(std::span<const float> logits, inner_.Collect());
    const int64_t step = collected_++;
    if (fail_from >= 0 && step >= fail_from) return UnavailableError("rank 1 went away");
    if (force_eos_from < 0 || step < force_eos_from) return logits;
    forced_.assign(logits.begin(), logits.end());
    const size_t vocab = static_cast<size_t>(vocab_size());
    for (size_t row = 0; row * vocab < forced_.size(); ++row) {
      forced_[row * vocab + static_cast<size_t>(eos_id)] = 1e9f;
    }
    return std::span<const float>(forced_);
  }
  double last_step_comm_seconds() const override { return comm_seconds_per_step; }

  std::vector<std::vector<Entry>> steps;
  double comm_seconds_per_step = 0;
  int64_t force_eos_from = -1;
  int64_t fail_from = -1;  // steps from this one on fail
  int32_t eos_id = 0;

 private:
  StepExecutor& inner_;
  int64_t collected_ = 0;
  std::vector<float> forced_;
};

// A pipeline of `depth` stages in front of an executor: Submit queues the step
// (a pipeline's stage 0 takes it and returns), Collect runs the oldest. Records how
// many steps were outstanding at once and fails the test when two outstanding
// steps share a sequence (a block table) — what the scheduler must never do.
class PipelineExecutor final : public StepExecutor {
 public:
  PipelineExecutor(StepExecutor& inner, int depth) : inner_(inner), depth_(depth) {}

  int64_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int32_t kv_block_size() const override { return inner_.kv_block_size(); }
  int max_in_flight() const override { return depth_; }
  Status Submit(std::span<const StepEntry> entries, bool all_logits) override {
    if (static_cast<int>(queued_.size()) >= depth_) return InvalidArgumentError("pipeline full");
    for (const StepEntry& e : entries) {
      for (const auto& step : queued_) {
        for (const StepEntry& other : step) {
          EXPECT_NE(e.block_table, other.block_table) << "a sequence in two outstanding steps";
        }
      }
    }
    // The spans stay valid: the scheduler leaves a sequence alone until its step is collected.
    queued_.emplace_back(entries.begin(), entries.end());
    EXPECT_FALSE(all_logits);
    max_outstanding = std::max(max_outstanding, static_cast<int>(queued_.size()));
    sequences_per_step.push_back(static_cast<int64_t>(entries.size()));
    return Status::Ok();
  }
  Result<std::span<const float>> Collect() override {
    if (queued_.empty()) return InvalidArgumentError("Collect without a submitted step");
    std::vector<StepEntry> step = std::move(queued_.front());
    queued_.pop_front();
    return inner_.Step(step);
  }

  int max_outstanding = 0;
  std::vector<int64_t> sequences_per_step;

 private:
  StepExecutor& inner_;
  int depth_;
  std::deque<std::vector<StepEntry>> queued_;
};

// What one request saw through its callbacks.
struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<TokenEvent> events;
  std::string text;
  RequestResult result;
  int done_calls = 0;
};

RequestCallbacks Collect(Outcome& out) {
  return {.on_token =
              [&out](const TokenEvent& e) {
                EXPECT_EQ(out.done_calls, 0) << "token after on_done";
                out.tokens.push_back(e.token);
                out.text += e.text;
                out.events.push_back(e);
              },
          .on_done =
              [&out](const RequestResult& r) {
                ++out.done_calls;
                out.result = r;
              }};
}

class SchedulerTest : public testing::SharedModelTest {
 protected:
  std::vector<RequestParams> Requests(int n, int64_t max_tokens, bool seeded) const {
    const std::vector<std::string> texts = {"Once upon a time",
                                            "The little dog ran to the",
                                            "Lily and Ben went to the park",
                                            "One day, a big bird",
                                            "Tom had a red ball. He liked",
                                            "The sun was hot and the",
                                            "Sara wanted to play with",
                                            "There was a tree"};
    std::vector<RequestParams> out;
    for (int i = 0; i < n; ++i) {
      RequestParams p;
      p.prompt = Encode(texts[static_cast<size_t>(i) % texts.size()]);
      p.max_tokens = max_tokens + 3 * i;
      p.ignore_eos = true;
      if (seeded) {
        p.sampling.temperature = 0.9f;
        p.sampling.seed = 1000 + static_cast<uint64_t>(i);
      } else {
        p.sampling = model::SamplingParams::Greedy();
      }
      out.push_back(p);
    }
    return out;
  }

  // Each request alone, stepped by hand on its own runner (no scheduler): the
  // reference tokens.
  std::vector<int32_t> Alone(const RequestParams& p) const {
    testing::LocalEngine engine(*loaded_, 2048);
    kv::BlockTable table(engine.driver.kv_block_size());
    model::Sampler sampler(p.sampling);
    std::vector<int32_t> tokens = p.prompt;
    std::vector<int32_t> generated;
    int64_t cached = 0;
    while (static_cast<int64_t>(generated.size()) < p.max_tokens) {
      const int64_t total = static_cast<int64_t>(tokens.size());
      EXPECT_TRUE(table.Reserve(engine.cache.allocator, total).ok());
      const StepEntry entry{
          .new_tokens = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(cached)),
          .start_position = cached,
          .block_table = &table};
      auto logits = engine.driver.Step(std::span<const StepEntry>(&entry, 1));
      EXPECT_TRUE(logits.ok()) << logits.status().ToString();
      if (!logits.ok()) break;
      cached = total;
      const int32_t token = sampler.Sample(*logits, tokens, p.prompt.size());
      tokens.push_back(token);
      generated.push_back(token);
    }
    table.Release(engine.cache.allocator);
    return generated;
  }

  // Submits every request, then serves them all on this thread (Stop(false)
  // first, so Run returns once they are done).
  static std::vector<Outcome> Serve(Scheduler& scheduler, const std::vector<RequestParams>& ps) {
    std::vector<Outcome> outcomes(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      auto handle = scheduler.Submit(ps[i], Collect(outcomes[i]));
      EXPECT_TRUE(handle.ok()) << handle.status().ToString();
    }
    scheduler.Stop(/*cancel_in_flight=*/false);
    const Status status = scheduler.Run();
    EXPECT_TRUE(status.ok()) << status.ToString();
    return outcomes;
  }
};

// admit_prefill_tokens: requests that arrive together are admitted into one step
// until their prompt tokens reach the limit (the first always), the rest in the
// steps after; outputs are the same.
TEST_F(SchedulerTest, AdmitPrefillTokensStartsPromptsOneStepAfterAnother) {
  std::vector<RequestParams> ps(4);
  for (size_t i = 0; i < ps.size(); ++i) {
    for (int t = 0; t < 40; ++t)
      ps[i].prompt.push_back((1 + 37 * t + 101 * static_cast<int>(i)) % 500);
    ps[i].max_tokens = 4;
    ps[i].ignore_eos = true;
    ps[i].sampling = model::SamplingParams::Greedy();
  }
  // Admitted in the first step, for limits 0 (none), 32, 100 and 40.
  const std::vector<std::pair<int64_t, size_t>> cases = {{0, 4}, {32, 1}, {100, 3}, {40, 1}};
  for (const auto& [limit, first_step] : cases) {
    SCOPED_TRACE("admit_prefill_tokens " + std::to_string(limit));
    testing::LocalEngine engine(*loaded_, 1024);
    RecordingExecutor recorder(engine.driver);
    Scheduler scheduler(recorder, tokenizer(),
                        {.max_num_batched_tokens = 512,
                         .max_num_seqs = 4,
                         .max_waiting = 4,
                         .admit_prefill_tokens = limit});
    const std::vector<Outcome> out = Serve(scheduler, ps);
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(out[i].tokens, Alone(ps[i])) << i;
    ASSERT_FALSE(recorder.steps.empty());
    EXPECT_EQ(recorder.steps[0].size(), first_step);
    if (limit == 32) {  // then one new prompt a step, beside the earlier ones' decodes
      for (size_t k = 1; k < 4; ++k) {
        ASSERT_EQ(recorder.steps[k].size(), k + 1);
        EXPECT_EQ(recorder.steps[k].back().num_tokens, 40);
      }
    }
  }
}

// Negative admission limits are refused, naming them.
TEST_F(SchedulerTest, NegativeAdmissionLimitsAreRefused) {
  testing::LocalEngine engine(*loaded_, 1024);
  for (const SchedulerOptions& bad : {SchedulerOptions{.prefix_wait_min_tokens = -1},
                                      SchedulerOptions{.admit_prefill_tokens = -1},
                                      SchedulerOptions{.short_prompt_tokens = -1}}) {
    const Status status = ValidateSchedulerOptions(bad, engine.driver);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(
                  "prefix_wait_min_tokens, admit_prefill_tokens and short_prompt_tokens >= 0"),
              std::string::npos)
        << status.ToString();
  }
  EXPECT_TRUE(
      ValidateSchedulerOptions(
          {.prefix_wait_min_tokens = 0, .admit_prefill_tokens = 0, .short_prompt_tokens = 0},
          engine.driver)
          .ok());
}

TEST_F(SchedulerTest, ConcurrentGreedyRequestsMatchEachAlone) {
  testing::LocalEngine engine(*loaded_, 1024);
  RecordingExecutor recorder(engine.driver);
  recorder.comm_seconds_per_step = 0.5;
  Scheduler scheduler(recorder, tokenizer(),
                      {.max_num_batched_tokens = 24, .max_num_seqs = 4, .max_waiting = 16});
  std::vector<RequestParams> ps = Requests(6, 20, /*seeded=*/false);
  ps[1].top_logprobs = 3;
  const std::vector<Outcome> out = Serve(scheduler, ps);

  int64_t prompt_tokens = 0, completion_tokens = 0;
  double comm_s = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(out[i].tokens, Alone(ps[i]));
    EXPECT_EQ(out[i].done_calls, 1);
    EXPECT_EQ(out[i].result.reason, FinishReason::kLength);
    EXPECT_EQ(out[i].result.completion_tokens, ps[i].max_tokens);
    EXPECT_EQ(out[i].result.prompt_tokens, static_cast<int64_t>(ps[i].prompt.size()));
    EXPECT_EQ(out[i].text, tokenizer().Decode(out[i].tokens));
    const RequestTiming& t = out[i].result.timing;
    EXPECT_GE(t.queue_s, 0);
    EXPECT_GT(t.prefill_s, 0);
    EXPECT_GT(t.decode_s, 0);
    EXPECT_GT(t.comm_s, 0);
    comm_s += t.comm_s;
    prompt_tokens += out[i].result.prompt_tokens;
    completion_tokens += out[i].result.completion_tokens;
  }
  // Greedy: the token is the most likely one; log-probabilities sorted, <= 0.
  for (const TokenEvent& e : out[1].events) {
    ASSERT_EQ(e.top_logprobs.size(), 3u);
    EXPECT_EQ(e.top_logprobs[0].first, e.token);
    EXPECT_EQ(e.top_logprobs[0].second, e.logprob);
    EXPECT_GE(e.top_logprobs[0].second, e.top_logprobs[1].second);
    EXPECT_GE(e.top_logprobs[1].second, e.top_logprobs[2].second);
    EXPECT_LE(e.logprob, 0.0f);
  }
  EXPECT_TRUE(out[0].events[0].top_logprobs.empty());
  // The max_num_seqs cap and the token budget held in every step.
  for (const auto& step : recorder.steps) {
    EXPECT_LE(step.size(), 4u);
    int64_t tokens = 0;
    for (const auto& e : step) tokens += e.num_tokens;
    EXPECT_LE(tokens, 24);
  }
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.steps_total, static_cast<int64_t>(recorder.steps.size()));
  // Each step's communication time is shared out among its requests.
  EXPECT_NEAR(comm_s, 0.5 * static_cast<double>(stats.steps_total), 1e-9);
  EXPECT_EQ(stats.prompt_tokens_total, prompt_tokens);
  EXPECT_EQ(stats.generation_tokens_total, completion_tokens);
  EXPECT_EQ(stats.requests_finished_total, 6);
  EXPECT_EQ(stats.preemptions_total, 0);
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.waiting, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.kv_blocks_total, engine.driver.num_kv_blocks());
}

// Penalties over the generated tokens and logit biases, applied by the scheduler's
// sampler as by a sampler stepped alone, and they change the output.
TEST_F(SchedulerTest, PenaltiesAndLogitBiasMatchEachAlone) {
  testing::LocalEngine engine(*loaded_, 1024);
  Scheduler scheduler(engine.driver, tokenizer(),
                      {.max_num_batched_tokens = 32, .max_num_seqs = 4, .max_waiting = 16});
  std::vector<RequestParams> ps = Requests(4, 24, /*seeded=*/false);
  const std::vector<RequestParams> plain = ps;
  ps[0].sampling.presence_penalty = -2.0f;  // greedy: favours a loop
  ps[1].sampling.frequency_penalty = 0.8f;
  ps[2].sampling.logit_bias = {{ps[2].prompt.back(), 100.0f}};
  ps[3].sampling.temperature = 0.9f;
  ps[3].sampling.seed = 5;
  ps[3].sampling.presence_penalty = -1.0f;
  ps[3].sampling.frequency_penalty = 0.5f;
  const std::vector<Outcome> out = Serve(scheduler, ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(out[i].tokens, Alone(ps[i]));
    if (i < 3) EXPECT_NE(out[i].tokens, Alone(plain[i]));
  }
  EXPECT_EQ(out[2].tokens,
            std::vector<int32_t>(static_cast<size_t>(ps[2].max_tokens), ps[2].prompt.back()));
}

TEST_F(SchedulerTest, PipelineKeepsDisjointStepsInFlight) {
  // Two stages, eight streams: two micro-batches of four alternate, each step over
  // sequences the other outstanding step does not hold; every output is the one it
  // gets alone.
  testing::LocalEngine engine(*loaded_, 2048);
  PipelineExecutor pipeline(engine.driver, 2);
  Scheduler scheduler(pipeline, tokenizer(), {.max_num_batched_tokens = 64, .max_num_seqs = 8});
  const std::vector<RequestParams> ps = Requests(8, 12, /*seeded=*/true);
  const std::vector<Outcome> out = Serve(scheduler, ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(out[i].tokens, Alone(ps[i]));
    EXPECT_EQ(out[i].result.reason, FinishReason::kLength);
  }
  EXPECT_EQ(pipeline.max_outstanding, 2);
  // While all eight decode, each step carries half of them.
  const int64_t halves = std::count(pipeline.sequences_per_step.begin(),
                                    pipeline.sequences_per_step.end(), int64_t{4});
  EXPECT_GE(halves, 20);
  for (int64_t n : pipeline.sequences_per_step) EXPECT_LE(n, 4);
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
}

TEST_F(SchedulerTest, PipelinePreemptsOnlyIdleSequences) {
  // A cache too small for four requests with two steps in flight: preemption picks
  // sequences no outstanding step holds, and outputs stay those of each alone.
  testing::LocalEngine engine(*loaded_, 96);
  PipelineExecutor pipeline(engine.driver, 2);
  Scheduler scheduler(pipeline, tokenizer(), {.max_num_batched_tokens = 64, .max_num_seqs = 4});
  const std::vector<RequestParams> ps = Requests(4, 45, /*seeded=*/false);
  const std::vector<Outcome> out = Serve(scheduler, ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(out[i].tokens, Alone(ps[i]));
  }
  EXPECT_GT(scheduler.Stats().preemptions_total, 0);
  EXPECT_EQ(pipeline.max_outstanding, 2);
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
}

TEST_F(SchedulerTest, PipelineStopWithCancelDrainsOutstandingSteps) {
  // Stop(true) while steps are in flight: they are collected first (a Driver refuses
  // to shut down with steps outstanding), then every request ends cancelled.
  testing::LocalEngine engine(*loaded_, 2048);
  PipelineExecutor pipeline(engine.driver, 2);
  Scheduler scheduler(pipeline, tokenizer(), {.max_num_batched_tokens = 64, .max_num_seqs = 4});
  std::vector<Outcome> out(4);
  const std::vector<RequestParams> ps = Requests(4, 1000, /*seeded=*/false);
  std::atomic<int> tokens{0};
  for (size_t i = 0; i < ps.size(); ++i) {
    RequestCallbacks callbacks = Collect(out[i]);
    callbacks.on_token = [&tokens, &scheduler](const TokenEvent&) {
      if (++tokens == 20) scheduler.Stop(/*cancel_in_flight=*/true);
    };
    ASSERT_TRUE(scheduler.Submit(ps[i], std::move(callbacks)).ok());
  }
  ASSERT_TRUE(scheduler.Run().ok());
  for (const Outcome& o : out) {
    EXPECT_EQ(o.done_calls, 1);
    EXPECT_EQ(o.result.reason, FinishReason::kCancelled);
  }
  EXPECT_FALSE(pipeline.Collect().ok()) << "a step was left outstanding";
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
}

TEST_F(SchedulerTest, PreemptionKeepsOutputsIdentical) {
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded sampling" : "greedy");
    // 6 blocks of 16 tokens; four requests that each need up to 4-5 blocks.
    testing::LocalEngine engine(*loaded_, 96);
    Scheduler scheduler(engine.driver, tokenizer(),
                        {.max_num_batched_tokens = 64, .max_num_seqs = 4});
    const std::vector<RequestParams> ps = Requests(4, 45, seeded);
    const std::vector<Outcome> out = Serve(scheduler, ps);
    for (size_t i = 0; i < ps.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(out[i].tokens, Alone(ps[i]));
      EXPECT_EQ(out[i].done_calls, 1);
      EXPECT_EQ(out[i].result.reason, FinishReason::kLength);
    }
    const SchedulerStats stats = scheduler.Stats();
    EXPECT_GT(stats.preemptions_total, 0);
    EXPECT_EQ(stats.kv_blocks_used, 0);
  }
}

TEST_F(SchedulerTest, LongPromptIsChunkedWhileOthersKeepDecoding) {
  testing::LocalEngine engine(*loaded_, 1024);
  RecordingExecutor recorder(engine.driver);
  Scheduler scheduler(recorder, tokenizer(), {.max_num_batched_tokens = 32, .max_num_seqs = 4});
  std::vector<RequestParams> ps = Requests(3, 30, /*seeded=*/false);
  RequestParams long_request = ps[0];
  std::string text;
  while (long_request.prompt.size() < 300) {
    text += "The cat sat on the mat and looked at the big red sun. ";
    long_request.prompt = Encode(text);
  }
  long_request.max_tokens = 5;
  ps.push_back(long_request);
  const std::vector<Outcome> out = Serve(scheduler, ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(out[i].tokens, Alone(ps[i]));
  }
  // Steps that continue a prefill (a chunk of several tokens not at position 0):
  // the long prompt's. Each must also carry the three short requests' decodes.
  int64_t continued_chunks = 0, long_prompt_tokens = 0;
  for (const auto& step : recorder.steps) {
    int64_t decodes = 0, tokens = 0;
    bool continues_prefill = false;
    for (const auto& e : step) {
      tokens += e.num_tokens;
      if (e.num_tokens == 1 && e.start_position > 0) ++decodes;
      if (e.num_tokens > 1 && e.start_position > 0) {
        continues_prefill = true;
        long_prompt_tokens += e.num_tokens;
      }
    }
    EXPECT_LE(tokens, 32);
    if (continues_prefill) {
      ++continued_chunks;
      EXPECT_EQ(decodes, 3) << "a prefill chunk stalled the running streams";
    }
  }
  // 300+ tokens in chunks of at most 32 - 3 decodes.
  EXPECT_GE(continued_chunks, 9);
  EXPECT_GT(long_prompt_tokens, 250);
}

// A prefill-only request (PD's prefill side) on a one-rank executor: inside each
// step that completes some of its blocks every layer is reported, in order, with
// those blocks — chunk by chunk under a small step budget (a last chunk ending
// inside the block it started completes none) — then on_progress follows the
// step, and on_prefilled the last one.
TEST_F(SchedulerTest, APrefillOnlyRequestSeesEachLayerInsideEachStep) {
  testing::LocalEngine engine(*loaded_, 1024);
  Scheduler scheduler(engine.driver, tokenizer(),
                      {.max_num_batched_tokens = 32, .max_num_seqs = 4});
  RequestParams p = Requests(1, 1, /*seeded=*/false)[0];
  std::string text;
  while (p.prompt.size() < 70) {
    text += "The cat sat on the mat and looked at the big red sun. ";
    p.prompt = Encode(text);
  }
  const int64_t prompt = static_cast<int64_t>(p.prompt.size());
  const int32_t layers = static_cast<int32_t>(loaded_->model->config().num_layers);
  std::vector<std::string> events;
  Outcome outcome;
  RequestCallbacks callbacks = Collect(outcome);
  callbacks.on_layer_kv = [&](int64_t first_block, int32_t layer,
                              std::span<const uint8_t* const> pieces) {
    events.push_back("layer " + std::to_string(layer) + " of blocks " +
                     std::to_string(first_block) + "+" + std::to_string(pieces.size()));
  };
  callbacks.on_progress = [&](std::span<const int32_t>, int64_t computed, StepExecutor&) {
    events.push_back("step @" + std::to_string(computed));
  };
  callbacks.on_prefilled = [&](std::span<const int32_t>) { events.push_back("prefilled"); };
  ASSERT_TRUE(scheduler.Submit(p, std::move(callbacks)).ok());
  scheduler.Stop(/*cancel_in_flight=*/false);
  ASSERT_TRUE(scheduler.Run().ok());
  std::vector<std::string> want;
  for (int64_t end = 32, reported = 0;; end += 32) {
    const int64_t computed = std::min(end, prompt);
    const int64_t full = computed / 16;  // the blocks the step completes, if any
    for (int32_t l = 0; l < layers && full > reported; ++l) {
      want.push_back("layer " + std::to_string(l) + " of blocks " + std::to_string(reported) + "+" +
                     std::to_string(full - reported));
    }
    reported = full;
    want.push_back("step @" + std::to_string(computed));
    if (computed == prompt) break;
  }
  want.push_back("prefilled");
  EXPECT_EQ(events, want);
  EXPECT_EQ(outcome.done_calls, 1);
  EXPECT_EQ(outcome.result.reason, FinishReason::kStop);
}

// short_prompt_tokens: short prompts queued behind a long one start in the first
// step beside its first chunk instead of after its last, and the long prompt still
// gets at least half of every step; with 0 (strict FIFO) they wait for all of it.
// Outputs are the same either way.
TEST_F(SchedulerTest, ShortPromptsStartBeforeALongPromptsNextChunk) {
  std::vector<RequestParams> ps = Requests(3, 6, /*seeded=*/false);
  std::string text;
  while (ps[0].prompt.size() < 300) {  // the first in the queue: 300+ tokens
    text += "The cat sat on the mat and looked at the big red sun. ";
    ps[0].prompt = Encode(text);
  }
  const int64_t budget = 64;
  for (const int64_t short_tokens : {int64_t{128}, int64_t{0}}) {
    SCOPED_TRACE("short_prompt_tokens " + std::to_string(short_tokens));
    testing::LocalEngine engine(*loaded_, 1024);
    RecordingExecutor recorder(engine.driver);
    Scheduler scheduler(
        recorder, tokenizer(),
        {.max_num_batched_tokens = budget, .max_num_seqs = 4, .short_prompt_tokens = short_tokens});
    const std::vector<Outcome> out = Serve(scheduler, ps);
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(out[i].tokens, Alone(ps[i])) << i;
    // The steps in which the short prompts' prefills began (a first entry of at
    // most 16 tokens: the short prompts have fewer), and the long prompt's chunks.
    std::vector<int64_t> short_starts;
    int64_t last_long_chunk = -1;
    for (size_t k = 0; k < recorder.steps.size(); ++k) {
      for (const RecordingExecutor::Entry& e : recorder.steps[k]) {
        if (e.num_tokens > 16) {
          last_long_chunk = static_cast<int64_t>(k);
          // The shorts take at most half the budget; the long prompt the rest
          // (all but its last chunk, the remainder).
          if (e.start_position + e.num_tokens < static_cast<int64_t>(ps[0].prompt.size()))
            EXPECT_GE(e.num_tokens, budget / 2) << "step " << k;
        } else if (e.start_position == 0) {
          short_starts.push_back(static_cast<int64_t>(k));
        }
      }
    }
    ASSERT_EQ(short_starts.size(), ps.size() - 1);
    for (const int64_t start : short_starts) {
      if (short_tokens > 0) {
        EXPECT_EQ(start, 0) << "a short prompt queued behind the long one";
      } else {
        EXPECT_GE(start, last_long_chunk) << "strict FIFO let a short prompt ahead";
      }
    }
  }
}

TEST_F(SchedulerTest, StopStringAcrossTokenBoundary) {
  testing::LocalEngine engine(*loaded_, 1024);
  RequestParams p = Requests(1, 60, /*seeded=*/false)[0];
  const std::vector<int32_t> tokens = Alone(p);
  std::string full;
  std::vector<size_t> ends;  // ends[k]: text length after token k
  for (int32_t t : tokens) {
    full += tokenizer().TokenPiece(t);
    ends.push_back(full.size());
  }
  // A stop string made of the last 2 bytes of token k and the first 2 of token
  // k + 1, whose first occurrence is exactly there.
  std::string stop;
  size_t k = 1, at = 0;
  for (; k + 1 < tokens.size(); ++k) {
    const size_t begin = ends[k - 1], end = ends[k];
    if (end - begin < 2 || ends[k + 1] - end < 2) continue;
    stop = full.substr(end - 2, 4);
    at = full.find(stop);
    if (at == end - 2) break;
  }
  ASSERT_LT(k + 1, tokens.size()) << "no stop string spans a token boundary in:\n" << full;

  for (const std::vector<std::string>& stops :
       {std::vector<std::string>{stop}, std::vector<std::string>{"qqqq", stop}}) {
    Scheduler scheduler(engine.driver, tokenizer(), {});
    p.stop = stops;
    const Outcome out = Serve(scheduler, {p})[0];
    EXPECT_EQ(out.result.reason, FinishReason::kStop);
    EXPECT_EQ(out.text, full.substr(0, at)) << "stop string \"" << stop << "\"";
    ASSERT_EQ(out.events.size(), k + 2);    // up to the token that completes it
    EXPECT_EQ(out.events.back().text, "");  // its start was held back, nothing after
    EXPECT_EQ(out.result.completion_tokens, static_cast<int64_t>(k + 2));
  }

  // A stop string whose first byte is everywhere but which never completes:
  // everything held back is released, the text is whole.
  Scheduler scheduler(engine.driver, tokenizer(), {});
  p.stop = {"e\x01"};
  const Outcome out = Serve(scheduler, {p})[0];
  EXPECT_EQ(out.result.reason, FinishReason::kLength);
  EXPECT_EQ(out.text, full);
  EXPECT_EQ(out.tokens, tokens);
}

TEST_F(SchedulerTest, EosMaxTokensAndContextLength) {
  testing::LocalEngine engine(*loaded_, 1024);
  RecordingExecutor recorder(engine.driver);
  recorder.force_eos_from = 5;  // EOS is the argmax from the 6th step on
  recorder.eos_id = tokenizer().eos_id();
  ASSERT_TRUE(tokenizer().IsEndOfGeneration(recorder.eos_id));
  {
    Scheduler scheduler(recorder, tokenizer(), {});
    RequestParams p = Requests(1, 50, false)[0];
    p.ignore_eos = false;
    const Outcome out = Serve(scheduler, {p})[0];
    EXPECT_EQ(out.result.reason, FinishReason::kStop);
    ASSERT_EQ(out.tokens.size(), 6u);  // one prefill step, four decodes, then EOS
    EXPECT_EQ(out.tokens.back(), recorder.eos_id);
    EXPECT_EQ(out.events.back().text, "");
  }
  {
    recorder.force_eos_from = 0;
    Scheduler scheduler(recorder, tokenizer(), {});
    RequestParams p = Requests(1, 12, false)[0];  // ignore_eos
    const Outcome out = Serve(scheduler, {p})[0];
    EXPECT_EQ(out.result.reason, FinishReason::kLength);
    EXPECT_EQ(out.result.completion_tokens, 12);
  }
  {
    // max_tokens 0: until prompt + output reach max_model_len.
    Scheduler scheduler(engine.driver, tokenizer(), {.max_model_len = 40});
    RequestParams p = Requests(1, 0, false)[0];
    const Outcome out = Serve(scheduler, {p})[0];
    EXPECT_EQ(out.result.reason, FinishReason::kLength);
    EXPECT_EQ(out.result.completion_tokens, 40 - static_cast<int64_t>(p.prompt.size()));
    RequestParams same = p;
    same.max_tokens = out.result.completion_tokens;
    EXPECT_EQ(out.tokens, Alone(same));
  }
}

// Prefill/decode disaggregation's importer, as far as cancelling goes: records the
// transfers started and cancelled, and reports a cancelled one at once (failed).
class CancellingImporter final : public KvImporter {
 public:
  void Start(int64_t id, std::vector<int32_t>, int64_t, std::vector<int32_t>) override {
    std::lock_guard<std::mutex> lock(mu);
    started.push_back(id);
  }
  void Cancel(int64_t id) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      cancelled.push_back(id);
    }
    if (report_on_cancel) sink->ImportDone(id, AbortedError("given up"), 0, 0, 0);
  }
  // Polls `what` (under the lock) for up to 5 s.
  bool WaitFor(const std::function<bool()>& what) {
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (what()) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  Scheduler* sink = nullptr;
  bool report_on_cancel = true;
  std::mutex mu;
  std::vector<int64_t> started, cancelled;
};

// A request cancelled (its client gone) while its KV import runs: the importer is
// told — also while every running request waits for its import and the loop has
// nothing to step — and the request ends kCancelled once the importer reports,
// its blocks freed.
TEST_F(SchedulerTest, ACancelledImportIsGivenUpAndEndsCancelled) {
  testing::LocalEngine engine(*loaded_, 1024);
  CancellingImporter importer;
  Scheduler scheduler(engine.driver, tokenizer(), {.kv_importer = &importer});
  importer.sink = &scheduler;
  RequestParams p = Requests(1, 8, false)[0];
  p.prompt = Encode(
      "Once upon a time there was a little girl named Lily. She liked to play in the park with "
      "her friends every day, and her dog came with them.");  // several full blocks
  ASSERT_GT(p.prompt.size(), 33u);
  Outcome out;
  std::shared_ptr<RequestHandle> handle = scheduler.Submit(p, Collect(out)).value();
  std::thread loop([&] { EXPECT_TRUE(scheduler.Run().ok()); });
  ASSERT_TRUE(importer.WaitFor([&] { return !importer.started.empty(); }));
  handle->Cancel();
  const bool told = importer.WaitFor([&] { return !importer.cancelled.empty(); });
  if (!told) importer.Cancel(importer.started[0]);  // unblock the loop; the test fails below
  EXPECT_TRUE(told) << "the importer was never told of the cancellation";
  scheduler.Stop(false);
  loop.join();
  EXPECT_EQ(importer.cancelled[0], importer.started[0]);
  EXPECT_EQ(out.result.reason, FinishReason::kCancelled);
  EXPECT_EQ(out.done_calls, 1);
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
}

// An engine replaced while a request's KV import runs (a rank of a several-rank
// decode instance died): the transfer is given up — its blocks went with the old
// engine — and the prompt is computed on the new one, so the request gets its
// tokens alone; a late report of the old transfer changes nothing.
TEST_F(SchedulerTest, RecoveryDuringAnImportComputesThePromptHere) {
  testing::LocalEngine first(*loaded_, 1024), second(*loaded_, 1024);
  CancellingImporter importer;
  importer.report_on_cancel = false;
  Scheduler scheduler(first.driver, tokenizer(), {.kv_importer = &importer});
  importer.sink = &scheduler;
  scheduler.SetRecovery([&](const Status&) -> Result<StepExecutor*> { return &second.driver; },
                        /*unavailable_after_ms=*/60'000);
  RequestParams p = Requests(1, 8, false)[0];
  p.prompt = Encode(
      "Once upon a time there was a little girl named Lily. She liked to play in the park with "
      "her friends every day, and her dog came with them.");
  Outcome out;
  ASSERT_TRUE(scheduler.Submit(p, Collect(out)).ok());
  std::thread loop([&] { EXPECT_TRUE(scheduler.Run().ok()); });
  ASSERT_TRUE(importer.WaitFor([&] { return !importer.started.empty(); }));
  scheduler.RequestRecovery(UnavailableError("rank 1 died"));
  const bool given_up = importer.WaitFor([&] { return !importer.cancelled.empty(); });
  EXPECT_TRUE(given_up) << "the recovery kept waiting for the old engine's transfer";
  scheduler.ImportDone(importer.started[0], Status::Ok(), 0, 0, 0);  // late: ignored
  scheduler.Stop(/*cancel_in_flight=*/!given_up);  // not given up: it would wait forever
  loop.join();
  EXPECT_EQ(out.result.reason, FinishReason::kLength);
  EXPECT_EQ(out.done_calls, 1);
  EXPECT_EQ(out.tokens, Alone(p));
  EXPECT_EQ(out.result.kv_imported_tokens, 0);
  EXPECT_EQ(scheduler.Stats().engine_restarts_total, 1);
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
}

TEST_F(SchedulerTest, CancelFreesBlocksAndReportsCancelled) {
  testing::LocalEngine engine(*loaded_, 1024);
  Scheduler scheduler(engine.driver, tokenizer(), {});
  std::vector<RequestParams> ps = Requests(3, 20, false);
  ps[0].prompt = Encode(
      "Once upon a time there was a little girl named Lily. She liked to play in the park with "
      "her friends every day.");  // > 16 tokens: several blocks
  ps[0].max_tokens = 200;
  ps[1].prompt = {tokenizer().bos_id()};  // one block while it runs
  std::vector<Outcome> out(3);
  std::shared_ptr<RequestHandle> first;
  RequestCallbacks cancel_after_3 = Collect(out[0]);
  cancel_after_3.on_token = [&, inner = cancel_after_3.on_token](const TokenEvent& e) {
    inner(e);
    if (out[0].tokens.size() == 3) first->Cancel();
  };
  int64_t blocks_used_later = -1;
  RequestCallbacks watch = Collect(out[1]);
  watch.on_token = [&, inner = watch.on_token](const TokenEvent& e) {
    inner(e);
    if (out[1].tokens.size() == 10) blocks_used_later = scheduler.Stats().kv_blocks_used;
  };
  first = scheduler.Submit(ps[0], cancel_after_3).value();
  ASSERT_TRUE(scheduler.Submit(ps[1], watch).ok());
  // Cancelled while still queued.
  auto queued = scheduler.Submit(ps[2], Collect(out[2]));
  ASSERT_TRUE(queued.ok());
  (*queued)->Cancel();
  scheduler.Stop(false);
  ASSERT_TRUE(scheduler.Run().ok());

  EXPECT_EQ(out[0].result.reason, FinishReason::kCancelled);
  EXPECT_EQ(out[0].result.completion_tokens, 3);
  EXPECT_EQ(out[0].done_calls, 1);
  EXPECT_EQ(out[1].result.reason, FinishReason::kLength);
  EXPECT_EQ(out[2].result.reason, FinishReason::kCancelled);
  EXPECT_EQ(out[2].result.completion_tokens, 0);
  EXPECT_EQ(out[2].done_calls, 1);
  // Only request 1's single block is left once request 0 is gone.
  EXPECT_EQ(blocks_used_later, 1);
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
  EXPECT_EQ(scheduler.Stats().requests_finished_total, 3);
}

TEST_F(SchedulerTest, SubmitRefusals) {
  testing::LocalEngine engine(*loaded_, 1024);
  Scheduler scheduler(engine.driver, tokenizer(), {.max_waiting = 2, .max_model_len = 64});
  RequestParams p = Requests(1, 10, false)[0];
  auto code = [&](const RequestParams& q) {
    auto handle = scheduler.Submit(q, {});
    return handle.ok() ? StatusCode::kOk : handle.status().code();
  };
  RequestParams bad = p;
  bad.prompt.clear();
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad = p;
  bad.prompt.push_back(static_cast<int32_t>(engine.driver.vocab_size()));
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad = p;
  bad.max_tokens = 64 - static_cast<int64_t>(p.prompt.size()) + 1;  // one past the length
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad.prompt.assign(64, tokenizer().bos_id());  // no room for a single token
  bad.max_tokens = 0;
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad = p;
  bad.sampling.top_p = 0;
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);
  bad = p;
  bad.stop = {""};
  EXPECT_EQ(code(bad), StatusCode::kInvalidArgument);

  bad = p;
  bad.max_tokens = 64 - static_cast<int64_t>(p.prompt.size());  // exactly fits
  EXPECT_EQ(code(bad), StatusCode::kOk);
  EXPECT_EQ(code(p), StatusCode::kOk);
  EXPECT_EQ(code(p), StatusCode::kResourceExhausted);  // max_waiting queued
  EXPECT_EQ(scheduler.Stats().waiting, 2);
  scheduler.Stop(true);
  EXPECT_EQ(code(p), StatusCode::kResourceExhausted);  // stopping
  EXPECT_TRUE(scheduler.Run().ok());
}

TEST_F(SchedulerTest, IdleRunWaitsUntilSubmitAndStopWakesIt) {
  testing::LocalEngine engine(*loaded_, 1024);
  Scheduler scheduler(engine.driver, tokenizer(), {});
  std::promise<Status> ran;
  std::thread thread([&] { ran.set_value(scheduler.Run()); });
  std::future<Status> done = ran.get_future();
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  EXPECT_EQ(scheduler.Stats().steps_total, 0);

  std::promise<RequestResult> finished;
  RequestParams p = Requests(1, 8, false)[0];
  ASSERT_TRUE(
      scheduler.Submit(p, {.on_done = [&](const RequestResult& r) { finished.set_value(r); }})
          .ok());
  EXPECT_EQ(finished.get_future().get().completion_tokens, 8);
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  scheduler.Stop(false);
  EXPECT_TRUE(done.get().ok());
  thread.join();
}

TEST_F(SchedulerTest, StopWithCancelEndsEverythingAndRunReturns) {
  testing::LocalEngine engine(*loaded_, 1024);
  Scheduler scheduler(engine.driver, tokenizer(),
                      {.max_num_batched_tokens = 16, .max_num_seqs = 2});
  const std::vector<RequestParams> ps = Requests(4, 200, false);
  std::vector<Outcome> out(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    RequestCallbacks callbacks = Collect(out[i]);
    if (i == 0) {
      callbacks.on_token = [&, inner = callbacks.on_token](const TokenEvent& e) {
        inner(e);
        if (out[0].tokens.size() == 2) scheduler.Stop(/*cancel_in_flight=*/true);
      };
    }
    ASSERT_TRUE(scheduler.Submit(ps[i], callbacks).ok());
  }
  Status status = InternalError("Run did not return");
  std::thread thread([&] { status = scheduler.Run(); });
  thread.join();
  EXPECT_TRUE(status.ok()) << status.ToString();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(out[i].done_calls, 1);
    EXPECT_EQ(out[i].result.reason, FinishReason::kCancelled);
  }
  EXPECT_EQ(out[0].result.completion_tokens, 2);
  EXPECT_EQ(out[3].result.completion_tokens, 0);  // never admitted (max_num_seqs 2)
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
  EXPECT_EQ(scheduler.Stats().running + scheduler.Stats().waiting, 0);
}

TEST_F(SchedulerTest, ExecutorErrorEndsEveryRequestAndRunReturnsIt) {
  testing::LocalEngine engine(*loaded_, 1024);
  RecordingExecutor recorder(engine.driver);
  recorder.fail_from = 3;
  Scheduler scheduler(recorder, tokenizer(), {.max_num_batched_tokens = 16, .max_num_seqs = 2});
  const std::vector<RequestParams> ps = Requests(3, 20, false);
  std::vector<Outcome> out(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) ASSERT_TRUE(scheduler.Submit(ps[i], Collect(out[i])).ok());
  const Status status = scheduler.Run();  // no Stop: the error ends it
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(out[i].done_calls, 1);
    EXPECT_EQ(out[i].result.reason, FinishReason::kError);
    EXPECT_EQ(out[i].result.error.code(), StatusCode::kUnavailable);
  }
  EXPECT_EQ(out[0].result.completion_tokens, 3);  // steps 0..2 sampled
  EXPECT_EQ(out[2].result.completion_tokens, 0);  // waiting (max_num_seqs 2)
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
  EXPECT_EQ(scheduler.Submit(ps[0], {}).status().code(), StatusCode::kResourceExhausted);
}

// An executor that fails mid-generation (steps in flight, some requests decoding,
// one still waiting) and is replaced by a fresh one: every request continues
// where it was and ends with exactly the tokens it gets alone; the streamed
// tokens before the failure are not repeated.
TEST_F(SchedulerTest, RecoveryFromAFailedExecutorKeepsOutputsIdentical) {
  for (int depth : {1, 2}) {
    for (bool seeded : {false, true}) {
      SCOPED_TRACE(std::string(seeded ? "seeded" : "greedy") + ", depth " + std::to_string(depth));
      testing::LocalEngine first(*loaded_, 1024);
      RecordingExecutor failing(first.driver);
      failing.fail_from = 14;  // after full blocks were cached (prefix cache)
      PipelineExecutor first_pipeline(failing, depth);
      testing::LocalEngine second(*loaded_, 1024);
      PipelineExecutor second_pipeline(second.driver, depth);
      Scheduler scheduler(first_pipeline, tokenizer(),
                          {.max_num_batched_tokens = 16, .max_num_seqs = 3});
      std::vector<Status> failures;
      scheduler.SetRecovery(
          [&](const Status& failure) -> Result<StepExecutor*> {
            failures.push_back(failure);
            EXPECT_TRUE(scheduler.Stats().recovering);
            EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
            return &second_pipeline;
          },
          /*unavailable_after_ms=*/60'000);
      const std::vector<RequestParams> ps = Requests(4, 12, seeded);
      const std::vector<Outcome> out = Serve(scheduler, ps);
      ASSERT_EQ(failures.size(), 1u);
      EXPECT_EQ(failures[0].code(), StatusCode::kUnavailable);
      for (size_t i = 0; i < ps.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        EXPECT_EQ(out[i].tokens, Alone(ps[i]));
        EXPECT_EQ(out[i].done_calls, 1);
        EXPECT_EQ(out[i].result.reason, FinishReason::kLength);
      }
      const SchedulerStats stats = scheduler.Stats();
      EXPECT_EQ(stats.engine_restarts_total, 1);
      EXPECT_FALSE(stats.recovering);
      EXPECT_EQ(stats.kv_blocks_used, 0);
    }
  }
}

// While the executor is being replaced, requests queue; once the outage has
// lasted unavailable_after_ms they are refused as Unavailable. A recovery that
// fails ends every request with its error, and Run returns it.
TEST_F(SchedulerTest, RecoveryQueuesThenRefusesAndAFailedRecoveryEndsEverything) {
  testing::LocalEngine engine(*loaded_, 1024);
  RecordingExecutor failing(engine.driver);
  failing.fail_from = 2;
  Scheduler scheduler(failing, tokenizer(), {.max_num_batched_tokens = 16, .max_num_seqs = 2});
  const std::vector<RequestParams> ps = Requests(2, 8, false);
  std::vector<Outcome> out(ps.size() + 1);
  Status late_submit;
  scheduler.SetRecovery(
      [&](const Status&) -> Result<StepExecutor*> {
        EXPECT_TRUE(scheduler.Submit(ps[0], Collect(out[2])).ok());  // queued
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        late_submit = scheduler.Submit(ps[1], {}).status();
        return UnavailableError("rank 1 did not come back");
      },
      /*unavailable_after_ms=*/20);
  for (size_t i = 0; i < ps.size(); ++i) ASSERT_TRUE(scheduler.Submit(ps[i], Collect(out[i])).ok());
  const Status status = scheduler.Run();
  EXPECT_EQ(late_submit.code(), StatusCode::kUnavailable) << late_submit.ToString();
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  EXPECT_NE(status.message().find("did not come back"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("went away"), std::string::npos) << status.ToString();
  for (const Outcome& o : out) {
    EXPECT_EQ(o.done_calls, 1);
    EXPECT_EQ(o.result.reason, FinishReason::kError);
  }
  EXPECT_EQ(out[0].result.completion_tokens, 2);
  EXPECT_EQ(scheduler.Stats().engine_restarts_total, 0);
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
}

// RequestRecovery (a supervisor's report) replaces the executor at the next turn
// of the loop; a recovery that finds the executor intact (nullptr) keeps it and
// counts no restart. Outputs are unchanged either way.
TEST_F(SchedulerTest, RequestedRecoveryReplacesOrKeepsTheExecutor) {
  for (bool intact : {true, false}) {
    SCOPED_TRACE(intact ? "intact" : "replaced");
    testing::LocalEngine first(*loaded_, 1024);
    testing::LocalEngine second(*loaded_, 1024);
    Scheduler scheduler(first.driver, tokenizer(),
                        {.max_num_batched_tokens = 16, .max_num_seqs = 2});
    int calls = 0;
    scheduler.SetRecovery(
        [&](const Status& failure) -> Result<StepExecutor*> {
          ++calls;
          EXPECT_NE(failure.message().find("restarted"), std::string::npos);
          if (intact) return static_cast<StepExecutor*>(nullptr);
          return &second.driver;
        },
        60'000);
    scheduler.RequestRecovery(UnavailableError("the launcher restarted the ranks"));
    const std::vector<RequestParams> ps = Requests(3, 10, true);
    const std::vector<Outcome> out = Serve(scheduler, ps);
    EXPECT_EQ(calls, 1);
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(out[i].tokens, Alone(ps[i])) << i;
    EXPECT_EQ(scheduler.Stats().engine_restarts_total, intact ? 0 : 1);
  }
}

}  // namespace
}  // namespace tessera::engine
