// Progress of a running serve benchmark on stderr: a bar redrawn in place when
// stderr is a terminal, else one line per ~10% of requests. Layer: bench; used by
// `tessera bench serve`. ProgressReporter::OnRequestDone is thread-safe (request
// threads call it); the formatting functions are pure.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "base/clock.h"
#include "bench/openai_client.h"

namespace tessera::bench {

struct ProgressSnapshot {
  std::string label;  // e.g. "rate 4" in a sweep; may be empty
  int64_t num_done = 0;
  int64_t num_total = 0;
  int64_t num_failed = 0;
  double elapsed_s = 0;
  int64_t output_tokens = 0;  // of the finished requests
  // Output tokens / elapsed: the throughput so far, 0 before the first second's tenth.
  double OutputTokensPerSecond() const;
};

// "[#####·····]  45/100  45%  failed 2  12.3 s  456.7 out tok/s" without a line end
// (the terminal form, drawn after '\r').
std::string FormatProgressBar(const ProgressSnapshot& s);
// "progress: 50/100 (50%), failed 2, 12.3 s, 456.7 out tok/s\n" (the log form).
std::string FormatProgressLine(const ProgressSnapshot& s);
// Whether the log form prints at `num_done` finished requests: every ceil(total/10)
// requests, and at the last.
bool IsProgressLogStep(int64_t num_done, int64_t num_total);

// Draws the progress of one benchmark run on `out`. With `is_terminal` a ticker
// thread redraws the bar 5 times a second; else OnRequestDone prints log lines.
// Finish() (or the destructor) draws the final state and ends the line, so the
// caller can print its report after it without the two interleaving.
class ProgressReporter {
 public:
  ProgressReporter(std::FILE* out, bool is_terminal, int64_t num_total, std::string label);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  void OnRequestDone(const RequestOutcome& outcome);
  void Finish();

 private:
  ProgressSnapshot SnapshotLocked() const;
  void DrawBarLocked();

  std::FILE* out_;
  const bool is_terminal_;
  const Clock::time_point start_;
  std::mutex mu_;  // guards everything below and writes to out_
  std::condition_variable cv_;
  ProgressSnapshot state_;
  bool finished_ = false;
  std::thread ticker_;
};

}  // namespace tessera::bench
