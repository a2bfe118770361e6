#include "bench/progress.h"

#include <algorithm>
#include <chrono>

namespace tessera::bench {
namespace {

constexpr int kBarWidth = 24;
constexpr auto kRedrawInterval = std::chrono::milliseconds(200);

int Percent(const ProgressSnapshot& s) {
  return s.num_total > 0 ? static_cast<int>(s.num_done * 100 / s.num_total) : 100;
}

std::string Prefix(const ProgressSnapshot& s) { return s.label.empty() ? "" : s.label + ": "; }

}  // namespace

double ProgressSnapshot::OutputTokensPerSecond() const {
  return elapsed_s >= 0.1 ? static_cast<double>(output_tokens) / elapsed_s : 0.0;
}

std::string FormatProgressBar(const ProgressSnapshot& s) {
  int64_t filled = s.num_total > 0 ? s.num_done * kBarWidth / s.num_total : kBarWidth;
  filled = std::clamp<int64_t>(filled, 0, kBarWidth);
  std::string bar(kBarWidth + 2, '.');  // "[####......]"
  bar.front() = '[';
  bar.back() = ']';
  for (int64_t i = 0; i < filled; ++i) bar[static_cast<size_t>(i) + 1] = '#';
  char buf[160];
  std::snprintf(buf, sizeof buf, " %lld/%lld %3d%%  failed %lld  %.1f s  %.1f out tok/s",
                static_cast<long long>(s.num_done), static_cast<long long>(s.num_total), Percent(s),
                static_cast<long long>(s.num_failed), s.elapsed_s, s.OutputTokensPerSecond());
  std::string out = Prefix(s);
  out += bar;
  out += buf;
  return out;
}

std::string FormatProgressLine(const ProgressSnapshot& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "progress: %lld/%lld (%d%%), failed %lld, %.1f s, %.1f out tok/s\n",
                static_cast<long long>(s.num_done), static_cast<long long>(s.num_total), Percent(s),
                static_cast<long long>(s.num_failed), s.elapsed_s, s.OutputTokensPerSecond());
  std::string out = Prefix(s);
  out += buf;
  return out;
}

bool IsProgressLogStep(int64_t num_done, int64_t num_total) {
  if (num_done <= 0 || num_total <= 0) return false;
  const int64_t step = (num_total + 9) / 10;
  return num_done % step == 0 || num_done == num_total;
}

ProgressReporter::ProgressReporter(std::FILE* out, bool is_terminal, int64_t num_total,
                                   std::string label)
    : out_(out), is_terminal_(is_terminal), start_(Clock::now()) {
  state_.label = std::move(label);
  state_.num_total = num_total;
  if (!is_terminal_) return;
  ticker_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!finished_) {
      DrawBarLocked();
      cv_.wait_for(lock, kRedrawInterval);
    }
  });
}

ProgressReporter::~ProgressReporter() { Finish(); }

ProgressSnapshot ProgressReporter::SnapshotLocked() const {
  ProgressSnapshot s = state_;
  s.elapsed_s = std::chrono::duration<double>(Clock::now() - start_).count();
  return s;
}

void ProgressReporter::DrawBarLocked() {
  // '\r' and erase-to-end-of-line: the bar is redrawn in place.
  std::fprintf(out_, "\r%s\033[K", FormatProgressBar(SnapshotLocked()).c_str());
  std::fflush(out_);
}

void ProgressReporter::OnRequestDone(const RequestOutcome& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  ++state_.num_done;
  if (!outcome.ok) ++state_.num_failed;
  if (outcome.ok) state_.output_tokens += outcome.output_tokens;
  if (!is_terminal_ && IsProgressLogStep(state_.num_done, state_.num_total)) {
    std::fputs(FormatProgressLine(SnapshotLocked()).c_str(), out_);
    std::fflush(out_);
  }
}

void ProgressReporter::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
  }
  cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (is_terminal_) {
    DrawBarLocked();
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

}  // namespace tessera::bench
