// Speculative decoding in the scheduler: greedy output with guesses verified in
// the step is the plain output token for token and logit for logit (logprobs
// too), with batching, chunked prefill, preemption and the prefix cache mixed in;
// EOS, stop strings and max_tokens end a request at the same token even when
// guesses past it were accepted; a proposer that is always wrong is backed off
// (and probed again later); seeded sampling with guesses repeats. The n-gram
// proposer's lookup rule. On ../shared/models/stories260K.gguf (skipped without it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "engine/draft_proposer.h"
#include "engine/proposer.h"
#include "engine/scheduler.h"
#include "model/synth.h"
#include "test_models.h"

namespace tessera::engine {
namespace {

TEST(NgramProposerTest, ProposesWhatFollowedTheLatestLongestMatch) {
  NgramProposer ngram({.max_ngram = 3, .min_ngram = 1});
  // "5 6 7" occurs at 0 and 5; the suffix "5 6 7" matches the latest (5) first.
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 3, 5, 6, 7};
  EXPECT_EQ(ngram.Lookup(tokens, 3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ngram.Lookup(tokens, 1), (std::vector<int32_t>{1}));
  // Only "9" matches (n = 1), followed by "5 6 2 9", then by the guesses
  // themselves: the text repeats with period 4.
  const std::vector<int32_t> short_match = {1, 9, 5, 6, 2, 9};
  EXPECT_EQ(ngram.Lookup(short_match, 6), (std::vector<int32_t>{5, 6, 2, 9, 5, 6}));
  const std::vector<int32_t> loop = {3, 7, 8, 7, 8};  // "7 8" at 1 -> "7 8 7 8 …"
  EXPECT_EQ(ngram.Lookup(loop, 5), (std::vector<int32_t>{7, 8, 7, 8, 7}));
  // The longest n wins over a later shorter match: "4 5" -> 6, not "5" -> 7.
  const std::vector<int32_t> longest = {4, 5, 6, 0, 5, 7, 1, 4, 5};
  EXPECT_EQ(ngram.Lookup(longest, 1), (std::vector<int32_t>{6}));
  // Nothing repeats: no guess.
  EXPECT_TRUE(ngram.Lookup(std::vector<int32_t>{1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(ngram.Lookup(std::vector<int32_t>{1}, 4).empty());
  std::vector<Proposal> out(1);
  const ProposalRequest request{.sequence_id = 1, .tokens = tokens, .max_tokens = 2};
  ASSERT_TRUE(ngram.Propose({&request, 1}, out).ok());
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(out[0].probs.empty());
}

// Knows each request's continuation (from a plain run) and proposes it, wrong
// at every `wrong_every`-th position when > 0: acceptance patterns chosen by the
// test.
class OracleProposer final : public Proposer {
 public:
  OracleProposer(std::vector<std::vector<int32_t>> streams, int64_t vocab, int wrong_every = 0)
      : streams_(std::move(streams)), vocab_(vocab), wrong_every_(wrong_every) {}
  std::string name() const override { return "oracle"; }
  Status Propose(std::span<const ProposalRequest> requests, std::span<Proposal> out) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      out[i] = {};
      const std::span<const int32_t> tokens = requests[i].tokens;
      for (const std::vector<int32_t>& s : streams_) {
        if (s.size() <= tokens.size() || !std::equal(tokens.begin(), tokens.end(), s.begin())) {
          continue;
        }
        for (size_t p = tokens.size();
             p < s.size() && out[i].tokens.size() < static_cast<size_t>(requests[i].max_tokens);
             ++p) {
          const bool wrong = wrong_every_ > 0 && p % static_cast<size_t>(wrong_every_) == 0;
          out[i].tokens.push_back(wrong ? static_cast<int32_t>((s[p] + 1) % vocab_) : s[p]);
        }
        break;
      }
    }
    return Status::Ok();
  }

 private:
  std::vector<std::vector<int32_t>> streams_;  // prompt + continuation
  int64_t vocab_;
  int wrong_every_;
};

// Always guesses `token` (a token the model never picks here).
class WrongProposer final : public Proposer {
 public:
  explicit WrongProposer(int32_t token) : token_(token) {}
  std::string name() const override { return "wrong"; }
  Status Propose(std::span<const ProposalRequest> requests, std::span<Proposal> out) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      out[i].tokens.assign(static_cast<size_t>(requests[i].max_tokens), token_);
    }
    return Status::Ok();
  }

 private:
  int32_t token_;
};

// Makes EOS the argmax of every logits row that predicts a position >= `from`
// (rows of all-logits entries included).
class ForceEosExecutor final : public StepExecutor {
 public:
  ForceEosExecutor(StepExecutor& inner, int32_t eos, int64_t from)
      : inner_(inner), eos_(eos), from_(from) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int32_t kv_block_size() const override { return inner_.kv_block_size(); }
  Status Submit(std::span<const StepEntry> entries, bool all_logits) override {
    predicted_.clear();
    for (const StepEntry& e : entries) {
      const int64_t n = static_cast<int64_t>(e.new_tokens.size());
      for (int64_t i = (all_logits || e.all_logits) ? 0 : n - 1; i < n; ++i) {
        predicted_.push_back(e.start_position + i + 1);
      }
    }
    return inner_.Submit(entries, all_logits);
  }
  Result<std::span<const float>> Collect() override {
    TESSERA_ASSIGN_OR_RETURN(std::span<const float> logits, inner_.Collect());
    const size_t vocab = static_cast<size_t>(vocab_size());
    EXPECT_EQ(logits.size(), predicted_.size() * vocab);
    forced_.assign(logits.begin(), logits.end());
    for (size_t row = 0; row < predicted_.size(); ++row) {
      if (predicted_[row] >= from_) forced_[row * vocab + static_cast<size_t>(eos_)] = 1e9f;
    }
    return std::span<const float>(forced_);
  }

 private:
  StepExecutor& inner_;
  int32_t eos_;
  int64_t from_;
  std::vector<int64_t> predicted_;
  std::vector<float> forced_;
};

// Everything a request's callbacks saw.
struct Seen {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens, vocab]
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  std::string text;
  RequestResult result;
  int done_calls = 0;
};

class SpeculativeTest : public testing::SharedModelTest {
 protected:
  // Copy-heavy prompts (text the model goes on to repeat, so n-gram guesses are
  // often right) and ordinary ones, greedy, EOS ignored.
  std::vector<RequestParams> Requests(int n, int64_t max_tokens) const {
    const std::vector<std::string> texts = {
        "Tom had a red ball. He liked the ball. Tom had a red ball. He liked the",
        "Once upon a time",
        "The little dog ran to the park. The little dog ran to the park. The little dog ran",
        "Lily and Ben went to the park",
        "One day, a big bird sat on a tree. One day, a big bird sat on a tree. One day,",
        "Sara wanted to play with"};
    std::vector<RequestParams> out;
    for (int i = 0; i < n; ++i) {
      RequestParams p;
      p.prompt = Encode(texts[static_cast<size_t>(i) % texts.size()]);
      p.max_tokens = max_tokens + 5 * i;
      p.ignore_eos = true;
      p.sampling = model::SamplingParams::Greedy();
      out.push_back(p);
    }
    return out;
  }

  // Submits every request, serves them to the end on this thread.
  std::vector<Seen> Serve(StepExecutor& executor, const SchedulerOptions& options,
                          const std::vector<RequestParams>& ps, SchedulerStats* stats = nullptr) {
    Scheduler scheduler(executor, tokenizer(), options);
    std::vector<Seen> out(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      auto handle = scheduler.Submit(ps[i], Callbacks(out[i]));
      EXPECT_TRUE(handle.ok()) << handle.status().ToString();
    }
    scheduler.Stop(/*cancel_in_flight=*/false);
    const Status status = scheduler.Run();
    EXPECT_TRUE(status.ok()) << status.ToString();
    if (stats != nullptr) *stats = scheduler.Stats();
    return out;
  }

  static RequestCallbacks Callbacks(Seen& seen) {
    return {.on_token =
                [&seen](const TokenEvent& e) {
                  EXPECT_EQ(seen.done_calls, 0) << "token after on_done";
                  seen.tokens.push_back(e.token);
                  seen.logits.insert(seen.logits.end(), e.logits.begin(), e.logits.end());
                  seen.logprobs.push_back(e.logprob);
                  seen.top_logprobs.push_back(e.top_logprobs);
                  seen.text += e.text;
                },
            .on_done =
                [&seen](const RequestResult& r) {
                  ++seen.done_calls;
                  seen.result = r;
                }};
  }

  // Same tokens, bit-identical logits rows and log-probabilities, same end.
  static void ExpectSame(const std::vector<Seen>& plain, const std::vector<Seen>& spec) {
    ASSERT_EQ(plain.size(), spec.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(spec[i].tokens, plain[i].tokens);
      ASSERT_EQ(spec[i].logits.size(), plain[i].logits.size());
      EXPECT_EQ(0, std::memcmp(spec[i].logits.data(), plain[i].logits.data(),
                               plain[i].logits.size() * sizeof(float)))
          << "logits differ";
      EXPECT_EQ(spec[i].logprobs, plain[i].logprobs);
      EXPECT_EQ(spec[i].top_logprobs, plain[i].top_logprobs);
      EXPECT_EQ(spec[i].text, plain[i].text);
      EXPECT_EQ(spec[i].done_calls, 1);
      EXPECT_EQ(spec[i].result.reason, plain[i].result.reason);
      EXPECT_EQ(spec[i].result.completion_tokens, plain[i].result.completion_tokens);
      EXPECT_EQ(spec[i].result.completion_tokens, static_cast<int64_t>(spec[i].tokens.size()));
    }
  }

  static std::vector<std::vector<int32_t>> Streams(const std::vector<RequestParams>& ps,
                                                   const std::vector<Seen>& seen) {
    std::vector<std::vector<int32_t>> streams;
    for (size_t i = 0; i < ps.size(); ++i) {
      streams.push_back(ps[i].prompt);
      streams.back().insert(streams.back().end(), seen[i].tokens.begin(), seen[i].tokens.end());
    }
    return streams;
  }
};

TEST_F(SpeculativeTest, GreedyNgramIsIdenticalTokenAndLogitWithBatchingAndChunking) {
  std::vector<RequestParams> ps = Requests(6, 40);
  ps[1].top_logprobs = 3;
  ps[2].top_logprobs = 2;
  // A long prompt prefilled in chunks while the others decode and speculate.
  RequestParams long_request = ps[0];
  std::string text;
  while (long_request.prompt.size() < 200) {
    text += "The cat sat on the mat and looked at the big red sun. ";
    long_request.prompt = Encode(text);
  }
  long_request.max_tokens = 30;
  ps.push_back(long_request);
  for (bool prefix_cache : {true, false}) {
    SCOPED_TRACE(prefix_cache ? "prefix cache" : "no prefix cache");
    testing::LocalEngine engine(*loaded_, 2048);
    SchedulerOptions options{
        .max_num_batched_tokens = 32, .max_num_seqs = 4, .enable_prefix_cache = prefix_cache};
    const std::vector<Seen> plain = Serve(engine.driver, options, ps);
    options.proposer = std::make_shared<NgramProposer>();
    options.spec_tokens = 5;
    SchedulerStats stats;
    const std::vector<Seen> spec = Serve(engine.driver, options, ps, &stats);
    ExpectSame(plain, spec);
    EXPECT_EQ(stats.spec_proposer, "ngram");
    EXPECT_GT(stats.spec_accepted_tokens_total, 20);
    // Some guesses were rejected (their KV rolled back), and fewer steps were needed.
    EXPECT_GT(stats.spec_proposed_tokens_total, stats.spec_accepted_tokens_total);
    int64_t accepted = 0;
    for (const Seen& s : spec) accepted += s.result.spec_accepted_tokens;
    EXPECT_EQ(accepted, stats.spec_accepted_tokens_total);
    EXPECT_EQ(stats.kv_blocks_used, 0);
  }
}

TEST_F(SpeculativeTest, PartialAcceptanceAndPreemptionKeepOutputsIdentical) {
  const std::vector<RequestParams> ps = Requests(4, 45);
  std::vector<Seen> plain;
  {
    testing::LocalEngine engine(*loaded_, 2048);
    plain = Serve(engine.driver, {.max_num_batched_tokens = 64, .max_num_seqs = 4}, ps);
  }
  // 7 blocks of 16 tokens; four requests that each need 4-5: preemptions.
  testing::LocalEngine engine(*loaded_, 112);
  for (int wrong_every : {0, 3, 5}) {
    SCOPED_TRACE("a wrong guess every " + std::to_string(wrong_every) + " positions");
    SchedulerStats stats;
    const std::vector<Seen> spec =
        Serve(engine.driver,
              {.max_num_batched_tokens = 64,
               .max_num_seqs = 4,
               .proposer = std::make_shared<OracleProposer>(
                   Streams(ps, plain), engine.driver.vocab_size(), wrong_every),
               .spec_tokens = 4},
              ps, &stats);
    ExpectSame(plain, spec);
    EXPECT_GT(stats.preemptions_total, 0);
    EXPECT_GT(stats.spec_accepted_tokens_total, 0);
    if (wrong_every == 0) {
      EXPECT_EQ(stats.spec_accepted_tokens_total, stats.spec_proposed_tokens_total);
    } else {
      EXPECT_LT(stats.spec_accepted_tokens_total, stats.spec_proposed_tokens_total);
    }
    EXPECT_EQ(stats.kv_blocks_used, 0);
  }
}

// Every block the prefix cache holds after speculating requests holds kept
// tokens' K/V only: a second turn that reuses the first turn's prompt and output
// from the cache gets the plain output, bit for bit.
TEST_F(SpeculativeTest, PrefixCacheNeverHoldsRejectedGuesses) {
  const std::vector<RequestParams> first = Requests(3, 60);
  testing::LocalEngine plain_engine(*loaded_, 2048);
  const std::vector<Seen> first_plain =
      Serve(plain_engine.driver, {.max_num_batched_tokens = 32, .max_num_seqs = 4}, first);
  std::vector<RequestParams> second = first;
  for (size_t i = 0; i < second.size(); ++i) {
    second[i].prompt = Streams(first, first_plain)[i];
    const std::vector<int32_t> more = Encode(" And then");
    second[i].prompt.insert(second[i].prompt.end(), more.begin() + 1, more.end());
    second[i].max_tokens = 20;
  }
  const std::vector<Seen> second_plain = Serve(
      plain_engine.driver,
      {.max_num_batched_tokens = 32, .max_num_seqs = 4, .enable_prefix_cache = false}, second);

  // Both turns on one scheduler (one prefix cache), guesses wrong every 4th position.
  testing::LocalEngine engine(*loaded_, 2048);
  Scheduler scheduler(
      engine.driver, tokenizer(),
      {.max_num_batched_tokens = 32,
       .max_num_seqs = 4,
       .proposer = std::make_shared<OracleProposer>(Streams(first, first_plain),
                                                    engine.driver.vocab_size(), /*wrong_every=*/4),
       .spec_tokens = 6});
  std::thread loop([&] { EXPECT_TRUE(scheduler.Run().ok()); });
  auto serve_turn = [&](const std::vector<RequestParams>& ps) {
    std::vector<Seen> seen(ps.size());
    std::vector<std::promise<void>> done(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      RequestCallbacks callbacks = Callbacks(seen[i]);
      callbacks.on_done = [&seen, &done, i](const RequestResult& r) {
        ++seen[i].done_calls;
        seen[i].result = r;
        done[i].set_value();
      };
      EXPECT_TRUE(scheduler.Submit(ps[i], std::move(callbacks)).ok());
    }
    for (auto& d : done) d.get_future().wait();
    return seen;
  };
  const std::vector<Seen> first_spec = serve_turn(first);
  ExpectSame(first_plain, first_spec);
  const std::vector<Seen> second_spec = serve_turn(second);
  scheduler.Stop(false);
  loop.join();
  ExpectSame(second_plain, second_spec);
  const SchedulerStats stats = scheduler.Stats();
  EXPECT_LT(stats.spec_accepted_tokens_total, stats.spec_proposed_tokens_total);
  // The second turn found the first turn's output blocks (written by verifying
  // steps) in the cache.
  int64_t cached = 0;
  for (const Seen& s : second_spec) cached += s.result.cached_tokens;
  EXPECT_GE(cached, 3 * 64);
}

// EOS, stop strings and max_tokens end a request at the token they end it at
// without guesses, also when the guesses (all right) go on past it.
TEST_F(SpeculativeTest, StopConditionsEndAtTheSameTokenDespiteAcceptedGuesses) {
  testing::LocalEngine engine(*loaded_, 2048);
  const int32_t eos = tokenizer().eos_id();
  ASSERT_TRUE(tokenizer().IsEndOfGeneration(eos));
  const SchedulerOptions plain_options{.max_num_batched_tokens = 64, .max_num_seqs = 4};
  std::vector<RequestParams> ps = Requests(3, 40);
  const std::vector<Seen> free_run = Serve(engine.driver, plain_options, ps);
  std::vector<std::vector<int32_t>> streams = Streams(ps, free_run);
  auto with_oracle = [&](std::vector<std::vector<int32_t>> s) {
    SchedulerOptions options = plain_options;
    options.proposer =
        std::make_shared<OracleProposer>(std::move(s), engine.driver.vocab_size(), 0);
    options.spec_tokens = 6;
    return options;
  };
  {  // EOS at position prompt + 9: the oracle's stream has EOS there and goes on.
    const int64_t at = static_cast<int64_t>(ps[0].prompt.size()) + 9;
    ForceEosExecutor forced(engine.driver, eos, at);
    std::vector<RequestParams> q = {ps[0]};
    q[0].ignore_eos = false;
    const std::vector<Seen> plain = Serve(forced, plain_options, q);
    ASSERT_EQ(plain[0].tokens.size(), 10u);
    EXPECT_EQ(plain[0].tokens.back(), eos);
    std::vector<int32_t> stream = streams[0];
    stream[static_cast<size_t>(at)] = eos;
    SchedulerStats stats;
    const std::vector<Seen> spec = Serve(forced, with_oracle({stream}), q, &stats);
    ExpectSame(plain, spec);
    EXPECT_EQ(spec[0].result.reason, FinishReason::kStop);
    EXPECT_GE(stats.spec_accepted_tokens_total, 6);
  }
  {  // max_tokens 1..8 with up to 6 guesses a step.
    for (int64_t max_tokens = 1; max_tokens <= 8; ++max_tokens) {
      std::vector<RequestParams> q = ps;
      for (RequestParams& p : q) p.max_tokens = max_tokens;
      const std::vector<Seen> plain = Serve(engine.driver, plain_options, q);
      const std::vector<Seen> spec = Serve(engine.driver, with_oracle(streams), q);
      ExpectSame(plain, spec);
      for (const Seen& s : spec) EXPECT_EQ(s.result.completion_tokens, max_tokens);
    }
  }
  {  // A stop string in the middle of the output.
    std::vector<RequestParams> q = {ps[1]};
    std::string stop;
    const std::string& full = free_run[1].text;
    ASSERT_GT(full.size(), 40u);
    stop = full.substr(full.size() / 2, 3);
    q[0].stop = {stop};
    const std::vector<Seen> plain = Serve(engine.driver, plain_options, q);
    const std::vector<Seen> spec = Serve(engine.driver, with_oracle(streams), q);
    ExpectSame(plain, spec);
    EXPECT_EQ(spec[0].result.reason, FinishReason::kStop);
    EXPECT_LT(spec[0].tokens.size(), free_run[1].tokens.size());
  }
}

// A proposer that is always wrong costs a few verifications, not one per token:
// the sequence pauses guessing for longer and longer, and probes again after
// each pause. Without adaptation every step carries the full k.
TEST_F(SpeculativeTest, AdaptiveGuessingBacksOffAWrongProposerAndProbesAgain) {
  testing::LocalEngine engine(*loaded_, 2048);
  std::vector<RequestParams> ps = Requests(1, 120);
  const std::vector<Seen> plain = Serve(engine.driver, {}, ps);
  int32_t never = 0;  // a token the greedy output never has
  while (std::find(plain[0].tokens.begin(), plain[0].tokens.end(), never) !=
         plain[0].tokens.end()) {
    ++never;
  }
  SchedulerStats adaptive, fixed;
  const std::vector<Seen> a =
      Serve(engine.driver, {.proposer = std::make_shared<WrongProposer>(never), .spec_tokens = 4},
            ps, &adaptive);
  const std::vector<Seen> f = Serve(engine.driver,
                                    {.proposer = std::make_shared<WrongProposer>(never),
                                     .spec_tokens = 4,
                                     .spec_adaptive = false},
                                    ps, &fixed);
  ExpectSame(plain, a);
  ExpectSame(plain, f);
  EXPECT_EQ(adaptive.spec_accepted_tokens_total, 0);
  // 119 decode steps, each with 4 guesses but the last three (3, 2, 1: none past max_tokens).
  EXPECT_EQ(fixed.spec_proposed_tokens_total, 4 * 115 + 3 + 2 + 1);
  EXPECT_LT(adaptive.spec_proposed_tokens_total, fixed.spec_proposed_tokens_total / 10);
  // More than the first three tries: it probed again after a pause.
  EXPECT_GT(adaptive.spec_verifications_total, 6);
  EXPECT_LT(adaptive.spec_verifications_total, 30);
}

// spec_max_batch: no guesses in a step where more sequences decode than that;
// once enough have finished, the rest guess again. Output unchanged.
TEST_F(SpeculativeTest, NoGuessesWhileMoreSequencesDecodeThanTheBatchLimit) {
  testing::LocalEngine engine(*loaded_, 2048);
  const std::vector<RequestParams> ps = Requests(4, 40);  // 40, 45, 50, 55 tokens
  const SchedulerOptions base{.max_num_batched_tokens = 256, .max_num_seqs = 4};
  const std::vector<Seen> plain = Serve(engine.driver, base, ps);
  SchedulerOptions options = base;
  options.proposer = std::make_shared<WrongProposer>(0);
  options.spec_tokens = 4;
  options.spec_adaptive = false;
  SchedulerStats unlimited, limited;
  ExpectSame(plain, Serve(engine.driver, options, ps, &unlimited));
  options.spec_max_batch = 2;
  ExpectSame(plain, Serve(engine.driver, options, ps, &limited));
  // Every sequence guesses at every decode step without the limit; with it only
  // the last two, over their last 10 and 15 tokens.
  EXPECT_GT(unlimited.spec_verifications_total, 150);
  EXPECT_GT(limited.spec_verifications_total, 10);
  EXPECT_LE(limited.spec_verifications_total, 25);
  options.spec_max_batch = -1;
  EXPECT_FALSE(engine::ValidateSchedulerOptions(options, engine.driver).ok());
}

// Seeded sampling with guesses: the rejection rule draws from the request's RNG,
// so a seed gives the same tokens every run; guesses get accepted.
TEST_F(SpeculativeTest, SeededSamplingWithGuessesRepeats) {
  testing::LocalEngine engine(*loaded_, 2048);
  std::vector<RequestParams> ps = Requests(4, 40);
  for (size_t i = 0; i < ps.size(); ++i) {
    ps[i].sampling.temperature = 0.7f;
    ps[i].sampling.seed = 77 + i;
  }
  const SchedulerOptions options{.max_num_batched_tokens = 32,
                                 .max_num_seqs = 4,
                                 .proposer = std::make_shared<NgramProposer>(),
                                 .spec_tokens = 4};
  SchedulerStats stats;
  const std::vector<Seen> once = Serve(engine.driver, options, ps, &stats);
  const std::vector<Seen> again = Serve(engine.driver, options, ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(once[i].tokens, again[i].tokens) << "request " << i;
    EXPECT_EQ(once[i].result.completion_tokens, ps[i].max_tokens);
  }
  EXPECT_GT(stats.spec_accepted_tokens_total, 0);
}

TEST_F(SpeculativeTest, BadSpeculationSettingsAreRefused) {
  testing::LocalEngine engine(*loaded_, 1024);
  EXPECT_FALSE(ValidateSchedulerOptions({.spec_tokens = 4}, engine.driver).ok());
  EXPECT_FALSE(
      ValidateSchedulerOptions({.proposer = std::make_shared<NgramProposer>(), .spec_tokens = 17},
                               engine.driver)
          .ok());
  EXPECT_TRUE(ValidateSchedulerOptions(
                  {.proposer = std::make_shared<NgramProposer>(), .spec_tokens = 0}, engine.driver)
                  .ok());
  RequestParams p = Requests(1, 8)[0];
  {
    Scheduler scheduler(engine.driver, tokenizer(), {});
    p.spec_tokens = 3;
    auto refused = scheduler.Submit(p, {});
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("no proposer"), std::string::npos);
    p.spec_tokens = 0;  // asking for none is fine
    EXPECT_TRUE(scheduler.Submit(p, {}).ok());
    scheduler.Stop(true);
    EXPECT_TRUE(scheduler.Run().ok());
  }
  // Opt-in where the default is off, opt-out where it is on.
  const std::vector<RequestParams> ps = Requests(2, 30);
  const std::vector<Seen> plain = Serve(engine.driver, {}, ps);
  for (int32_t default_k : {0, 4}) {
    std::vector<RequestParams> q = ps;  // the copy-heavy request 0 speculates, 1 does not
    if (default_k == 0) q[0].spec_tokens = 4;
    if (default_k != 0) q[1].spec_tokens = 0;
    SchedulerStats stats;
    const std::vector<Seen> spec =
        Serve(engine.driver,
              {.proposer = std::make_shared<NgramProposer>(), .spec_tokens = default_k}, q, &stats);
    ExpectSame(plain, spec);
    EXPECT_GT(spec[0].result.spec_proposed_tokens, 0) << "default " << default_k;
    EXPECT_EQ(spec[1].result.spec_proposed_tokens, 0) << "default " << default_k;
  }
  RequestParams bad = p;
  bad.spec_tokens = -2;
  Scheduler scheduler(engine.driver, tokenizer(),
                      {.proposer = std::make_shared<NgramProposer>(), .spec_tokens = 2});
  EXPECT_FALSE(scheduler.Submit(bad, {}).ok());
  bad.spec_tokens = kMaxSpecTokens + 1;
  EXPECT_FALSE(scheduler.Submit(bad, {}).ok());
  scheduler.Stop(true);
  EXPECT_TRUE(scheduler.Run().ok());
}

// A draft model (the Q4_0 sibling of the F32 target) guesses; the target's greedy
// output stays the plain output, tokens and logits, with batching and chunking;
// the draft's KV follows the kept tokens across rounds (most guesses right).
TEST_F(SpeculativeTest, DraftModelGuessesKeepGreedyOutputIdentical) {
  const std::string target_path = testing::ModelPath("stories260K-ffn192.gguf");
  const std::string draft_path = testing::ModelPath("stories260K-ffn192-Q4_0.gguf");
  if (!testing::HaveModel("stories260K-ffn192.gguf") ||
      !testing::HaveModel("stories260K-ffn192-Q4_0.gguf")) {
    GTEST_SKIP() << "no stories260K-ffn192 pair";
  }
  auto target = LoadModel(target_path);
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  testing::LocalEngine engine(*target, 2048);
  std::vector<RequestParams> ps = Requests(5, 40);
  ps[2].top_logprobs = 2;
  SchedulerOptions options{.max_num_batched_tokens = 32, .max_num_seqs = 4};
  const std::vector<Seen> plain = Serve(engine.driver, options, ps);
  auto draft = DraftProposer::Create(draft_path, *target->tokenizer);
  ASSERT_TRUE(draft.ok()) << draft.status().ToString();
  options.proposer = std::shared_ptr<Proposer>(std::move(draft).value());
  options.spec_tokens = 4;
  SchedulerStats stats;
  const std::vector<Seen> spec = Serve(engine.driver, options, ps, &stats);
  ExpectSame(plain, spec);
  EXPECT_EQ(stats.spec_proposer, "draft");
  EXPECT_GT(stats.spec_accepted_tokens_total, stats.spec_proposed_tokens_total / 2)
      << stats.spec_accepted_tokens_total << "/" << stats.spec_proposed_tokens_total;
  EXPECT_GT(stats.spec_proposed_tokens_total, stats.spec_accepted_tokens_total);  // some rollback
  // Seeded sampling with draft guesses repeats.
  std::vector<RequestParams> sampled = ps;
  for (size_t i = 0; i < sampled.size(); ++i) {
    sampled[i].sampling.temperature = 0.8f;
    sampled[i].sampling.seed = 5 + i;
  }
  const std::vector<Seen> once = Serve(engine.driver, options, sampled);
  const std::vector<Seen> again = Serve(engine.driver, options, sampled);
  for (size_t i = 0; i < sampled.size(); ++i) EXPECT_EQ(once[i].tokens, again[i].tokens);
}

// The benchmark's speed pair: a synthetic target whose blocks from 2 on are damped
// to nothing (synth --damp-from 2 --damp 0), and the 2-block synth of the same seed
// as its draft. The draft computes exactly what the target does, so every greedy
// guess is kept; with a damp that lets the later blocks speak, guesses fail too.
// Either way the target's output is the plain output, tokens and logits.
TEST_F(SpeculativeTest, DampedSynthTargetKeepsEveryGuessOfItsTruncatedDraft) {
  const std::string dir = ::testing::TempDir() + "/spec_damped_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  model::SynthOptions o;
  o.dim = 64;
  o.num_layers = 2;
  o.num_heads = 4;
  o.ffn_dim = 128;
  o.type = kernels::WeightType::kF32;
  o.seed = 3;
  ASSERT_TRUE(model::WriteSynthModel(o, dir + "/draft.gguf").ok());
  o.num_layers = 4;
  o.damp_from = 2;
  for (float damp : {0.0f, 0.7f}) {
    o.damp = damp;
    ASSERT_TRUE(model::WriteSynthModel(o, dir + "/target.gguf").ok());
    auto target = LoadModel(dir + "/target.gguf");
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    testing::LocalEngine engine(*target, 2048);
    const std::vector<RequestParams> ps = Requests(4, 40);
    SchedulerOptions options{.max_num_batched_tokens = 64, .max_num_seqs = 4};
    const std::vector<Seen> plain = Serve(engine.driver, options, ps);
    if (damp == 0) {  // the draft alone computes the target's logits
      auto alone_model = LoadModel(dir + "/draft.gguf");
      ASSERT_TRUE(alone_model.ok()) << alone_model.status().ToString();
      testing::LocalEngine alone_engine(*alone_model, 2048);
      const std::vector<Seen> alone = Serve(alone_engine.driver, options, ps);
      for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(alone[i].logits, plain[i].logits) << i;
    }
    auto draft = DraftProposer::Create(dir + "/draft.gguf", *target->tokenizer);
    ASSERT_TRUE(draft.ok()) << draft.status().ToString();
    options.proposer = std::shared_ptr<Proposer>(std::move(draft).value());
    options.spec_tokens = 4;
    SchedulerStats stats;
    const std::vector<Seen> spec = Serve(engine.driver, options, ps, &stats);
    ExpectSame(plain, spec);
    EXPECT_GT(stats.spec_proposed_tokens_total, 40) << damp;
    if (damp == 0) {
      EXPECT_EQ(stats.spec_accepted_tokens_total, stats.spec_proposed_tokens_total);
    } else {
      EXPECT_LT(stats.spec_accepted_tokens_total, stats.spec_proposed_tokens_total);
    }
    if (damp != 0) continue;
    // Sampled requests: the draft samples its guesses as the request does and
    // hands over their distributions, which equal the target's here, so the
    // rejection rule keeps them all (an argmax guess would be kept only with the
    // target's probability of it); seeded runs repeat.
    std::vector<RequestParams> sampled = ps;
    for (size_t i = 0; i < sampled.size(); ++i) {
      sampled[i].sampling.temperature = 1.0f;
      sampled[i].sampling.top_k = 0;
      sampled[i].sampling.top_p = 1.0f;
      sampled[i].sampling.min_p = 0.0f;
      sampled[i].sampling.seed = 21 + i;
    }
    SchedulerStats sampled_stats;
    const std::vector<Seen> once = Serve(engine.driver, options, sampled, &sampled_stats);
    const std::vector<Seen> again = Serve(engine.driver, options, sampled);
    for (size_t i = 0; i < sampled.size(); ++i) EXPECT_EQ(once[i].tokens, again[i].tokens);
    EXPECT_GT(sampled_stats.spec_proposed_tokens_total, 40);
    EXPECT_GE(sampled_stats.spec_accepted_tokens_total,
              sampled_stats.spec_proposed_tokens_total - 2);
  }
  std::filesystem::remove_all(dir);
}

// A draft whose vocabulary differs is refused at start, naming the difference.
TEST_F(SpeculativeTest, DraftWithAnotherVocabularyIsRefused) {
  if (!testing::HaveModel("llama-2-tiny-random.gguf")) GTEST_SKIP() << "no llama-2 model";
  auto refused = DraftProposer::Create(testing::ModelPath("llama-2-tiny-random.gguf"), tokenizer());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  const std::string message = refused.status().message();
  EXPECT_NE(message.find("vocabulary has 32000 tokens, the target's 512"), std::string::npos)
      << message;
  // The same vocabulary passes; a token whose text differs is named.
  EXPECT_TRUE(CheckSameVocabulary(tokenizer(), tokenizer()).ok());
  auto other = LoadModel(testing::ModelPath("llama-2-tiny-random.gguf"));
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(CheckSameVocabulary(*other->tokenizer, tokenizer()).ok());
  EXPECT_FALSE(DraftProposer::Create(testing::ModelPath("no-such-draft.gguf"), tokenizer()).ok());
}

}  // namespace
}  // namespace tessera::engine
