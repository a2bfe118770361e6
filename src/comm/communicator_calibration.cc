// Communicator::ResolveCopyMode (communicator.h): which same-host collective
// messages go as single copy, agreed by the ranks of each host at connect. The
// lowest same-host rank (the leader) decides: the environment's window, else this
// host's cached calibration, else a measurement — streamed against single-copy
// exchanges with the next same-host rank (the partner) over the messenger just
// built — which it caches (calibration.h). It publishes its decision in the store;
// every same-host rank takes it, unless its own environment set a window.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <ctime>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "comm/communicator.h"

namespace tessera::comm {
namespace {

// The measurement's messages; outside NextTag's range, so no collective's tag.
constexpr int32_t kCalibrationTag = INT32_MIN;

// What the leader and the partner run: each size `samples` times each way. Per
// message 256 KiB–8 MiB (2-rank all-gathers and all-to-alls of 512 KiB–16 MiB in
// all; a window that reaches 8 MiB has no upper bound). Fewer samples where one
// takes milliseconds: a fresh page costs ~20 µs under the VMs' hypervisors, so the
// buffers (3 × 8 MiB) cost as much as the samples, ~0.1 s each on a loaded 2-core VM.
struct Schedule {
  struct Size {
    size_t bytes;
    int samples;
  };
  std::vector<Size> sizes = {{size_t{256} << 10, 9}, {size_t{512} << 10, 9}, {size_t{1} << 20, 7},
                             {size_t{2} << 20, 5},   {size_t{4} << 20, 5},   {size_t{8} << 20, 3}};
};

// "exchange <bytes>x<samples>,…": the partner runs what the leader says.
std::string FormatPlan(const Schedule& schedule) {
  std::string text = "exchange ";
  for (size_t i = 0; i < schedule.sizes.size(); ++i) {
    text += (i > 0 ? "," : "") + std::to_string(schedule.sizes[i].bytes) + "x" +
            std::to_string(schedule.sizes[i].samples);
  }
  return text;
}

std::optional<Schedule> ParsePlan(const std::string& text) {
  constexpr std::string_view kPrefix = "exchange ";
  if (text.rfind(kPrefix, 0) != 0) return std::nullopt;
  Schedule schedule;
  schedule.sizes.clear();
  const char* p = text.data() + kPrefix.size();
  const char* end = text.data() + text.size();
  while (p < end) {
    Schedule::Size size{0, 0};
    auto [x, ec] = std::from_chars(p, end, size.bytes);
    if (ec != std::errc() || x == end || *x != 'x') return std::nullopt;
    auto [next, ec2] = std::from_chars(x + 1, end, size.samples);
    if (ec2 != std::errc() || size.bytes == 0 || size.bytes > (size_t{1} << 30) ||
        size.samples < 1 || size.samples > 1000) {
      return std::nullopt;
    }
    schedule.sizes.push_back(size);
    if (next < end && *next != ',') return std::nullopt;
    p = next < end ? next + 1 : next;
  }
  if (schedule.sizes.empty()) return std::nullopt;
  return schedule;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// The nearest-rank lower quartile: the ceil(n / 4)-th smallest.
double LowerQuartile(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() + 3) / 4 - 1];
}

// One exchange as a 2-rank all-gather runs it: each rank sends `bytes` to the
// other, copies its own block beside (the send's tee) and receives the other's.
// An 8-byte exchange first lines the two ranks up. Returns the time in µs.
Result<double> TimedExchange(Messenger& messenger, int peer, bool lower, const uint8_t* send,
                             uint8_t* out, size_t bytes, bool single_copy) {
  messenger.set_single_copy_window(single_copy ? 1 : 0, kNoUpperBound);
  TESSERA_RETURN_IF_ERROR(messenger.Begin(Primitive::kAllGather, /*count_call=*/false));
  uint64_t ping = 0, pong = 0;
  SendOp line_up(peer, kCalibrationTag, &ping, sizeof(ping));
  RecvOp lined_up(peer, kCalibrationTag, &pong, sizeof(pong));
  messenger.PostSend(&line_up);
  messenger.PostRecv(&lined_up);
  TESSERA_RETURN_IF_ERROR(messenger.WaitAll({&line_up, &lined_up}));
  const int64_t start_ns = NowNs();
  SendOp so = SendOp::Copy(peer, kCalibrationTag, send, bytes);
  so.tee = out + (lower ? 0 : bytes);
  RecvOp ro(peer, kCalibrationTag, out + (lower ? bytes : 0), bytes);
  messenger.PostSend(&so);
  messenger.PostRecv(&ro);
  TESSERA_RETURN_IF_ERROR(messenger.WaitAll({&so, &ro}));
  return static_cast<double>(NowNs() - start_ns) / 1e3;
}

// Both ranks run this with the same schedule (the pair's order alternates A/B,
// B/A between samples and sizes); the leader's timings make the points.
Result<std::vector<CalibrationPoint>> MeasureExchanges(Messenger& messenger, int peer, bool lower,
                                                       const Schedule& schedule) {
  size_t largest = 0;
  for (const Schedule::Size& size : schedule.sizes) largest = std::max(largest, size.bytes);
  std::vector<uint8_t> send(largest, static_cast<uint8_t>(lower ? 0x5a : 0xa5));
  std::vector<uint8_t> out(2 * largest, 0);  // [lower's block | upper's block]
  // Warm-up, untimed: the rings, process_vm_readv's first pins.
  for (bool single_copy : {false, true}) {
    TESSERA_RETURN_IF_ERROR(
        TimedExchange(messenger, peer, lower, send.data(), out.data(), largest, single_copy)
            .status());
  }
  std::vector<CalibrationPoint> points;
  for (size_t i = 0; i < schedule.sizes.size(); ++i) {
    const Schedule::Size size = schedule.sizes[i];
    std::vector<double> streamed, single, ratios;
    for (int s = 0; s < size.samples; ++s) {
      double us[2] = {0, 0};  // [streamed, single copy]
      const bool single_first = (s + static_cast<int>(i)) % 2 == 1;
      for (int k = 0; k < 2; ++k) {
        const bool single_copy = single_first ? k == 0 : k == 1;
        TESSERA_ASSIGN_OR_RETURN(us[single_copy ? 1 : 0],
                                 TimedExchange(messenger, peer, lower, send.data(), out.data(),
                                               size.bytes, single_copy));
      }
      streamed.push_back(us[0]);
      single.push_back(us[1]);
      ratios.push_back(us[1] > 0 ? us[0] / us[1] : 1.0);
    }
    points.push_back(CalibrationPoint{size.bytes, Median(streamed), Median(single), Median(ratios),
                                      LowerQuartile(ratios), size.samples});
  }
  return points;
}

}  // namespace

Result<CopyModeReport> Communicator::DecideCopyModeAsLeader(Store& store, const std::string& key,
                                                            int partner,
                                                            const SingleCopyProbe& probe,
                                                            const std::vector<int>& pids) {
  CopyModeReport report;
  report.single_copy = {options_.shm_single_copy_bytes, options_.shm_single_copy_max_bytes};
  report.source = options_.shm_single_copy_source;
  const bool redo = options_.calibration == CalibrationMode::kRedo;
  const bool injected = static_cast<bool>(options_.calibration_measure_for_test);
  bool plan_published = false;
  if (options_.calibration == CalibrationMode::kOff) {
    report.note = "TESSERA_COMM_CALIBRATION=off";
  } else if (report.source == SettingSource::kCalibrated ||
             report.source == SettingSource::kCached) {
    report.note = "resolved by the parent communicator";
  } else if (report.source == SettingSource::kEnv && !redo) {
    report.note = "set by TESSERA_SHM_SINGLE_COPY_BYTES / _MAX_BYTES";
  } else if (pids[partner] == static_cast<int>(::getpid()) && !injected) {
    // Single copy between threads is a memcpy; the host's calibration is about
    // process_vm_readv between processes.
    report.note = "ranks are threads of one process";
  } else if (!injected && !(probe.reads_us[partner] && probe.we_read[partner])) {
    report.note = "process_vm_readv is not permitted between these ranks";
  } else {
    const HostKey host = LocalHostKey();
    const std::string dir = options_.calibration_cache_dir.empty() ? CalibrationCacheDir()
                                                                   : options_.calibration_cache_dir;
    if (!dir.empty()) report.cache_path = CalibrationCachePath(dir, host);
    if (!redo && !dir.empty()) {
      auto cached = LoadCalibration(dir, host);
      if (cached.ok()) {
        report.calibration = std::move(*cached);
      } else if (cached.status().code() == StatusCode::kInvalidArgument) {
        TLOG_WARN("comm", "rank %d: %s; ignoring it and measuring again", rank_,
                  cached.status().message().c_str());
      } else {
        TLOG_INFO("comm", "rank %d: %s; measuring", rank_, cached.status().message().c_str());
      }
    }
    if (report.calibration) {
      if (report.source != SettingSource::kEnv) {
        report.single_copy = report.calibration->single_copy;
        report.source = SettingSource::kCached;
      }
    } else {
      Calibration c;
      c.host = host;
      const int64_t start_ns = NowNs();
      if (injected) {
        c.points = options_.calibration_measure_for_test(rank_);
      } else {
        const Schedule schedule;
        TESSERA_RETURN_IF_ERROR(store.SetString(key + "/plan", FormatPlan(schedule)));
        plan_published = true;
        TESSERA_ASSIGN_OR_RETURN(c.points, MeasureExchanges(*messenger_, partner,
                                                            /*lower=*/true, schedule));
      }
      c.took_ms = static_cast<double>(NowNs() - start_ns) / 1e6;
      c.measured_unix_s = static_cast<int64_t>(std::time(nullptr));
      c.single_copy = DecideSingleCopyWindow(c.points, c.margin);
      TLOG_INFO("comm", "rank %d calibrated the copy mode in %.0f ms: single copy %s", rank_,
                c.took_ms, FormatCopyWindow(c.single_copy).c_str());
      if (dir.empty()) {
        TLOG_WARN("comm",
                  "no cache directory (TESSERA_CACHE_DIR, XDG_CACHE_HOME and HOME are unset): "
                  "the copy-mode calibration runs again in every job");
      } else if (Status saved = SaveCalibration(dir, c); !saved.ok()) {
        TLOG_WARN("comm",
                  "could not write the copy-mode calibration cache: %s (it runs again "
                  "in the next job; set TESSERA_CACHE_DIR to a writable directory)",
                  saved.message().c_str());
        report.cache_path.clear();
      }
      if (report.source != SettingSource::kEnv) {
        report.single_copy = c.single_copy;
        report.source = SettingSource::kCalibrated;
      }
      report.calibration = std::move(c);
    }
  }
  if (!plan_published) TESSERA_RETURN_IF_ERROR(store.SetString(key + "/plan", "none"));
  return report;
}

Status Communicator::ResolveCopyMode(Store& store, const std::vector<bool>& use_shm,
                                     const SingleCopyProbe& probe, const std::vector<int>& pids,
                                     const Deadline& deadline) {
  copy_mode_ = CopyModeReport{};
  copy_mode_.single_copy = {options_.shm_single_copy_bytes, options_.shm_single_copy_max_bytes};
  copy_mode_.source = options_.shm_single_copy_source;
  std::vector<int> local;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || use_shm[p]) local.push_back(p);
  }
  if (local.size() < 2) return Status::Ok();  // no same-host peer: nothing to decide
  // Every same-host rank takes part whatever its own knobs say, so no rank waits for
  // one that skipped: the leader always publishes a plan and a decision.
  const int leader = local[0];
  const int partner = local[1];
  const std::string key = "calibration/" + std::to_string(leader);
  CopyModeReport decided;
  if (rank_ == leader) {
    TESSERA_ASSIGN_OR_RETURN(decided, DecideCopyModeAsLeader(store, key, partner, probe, pids));
    TESSERA_RETURN_IF_ERROR(store.SetString(key + "/decision", CopyModeReportToJson(decided)));
  } else {
    if (rank_ == partner) {
      TESSERA_ASSIGN_OR_RETURN(std::string plan, store.GetString(key + "/plan", deadline));
      if (plan != "none") {
        const std::optional<Schedule> schedule = ParsePlan(plan);
        if (!schedule) {
          return InternalError("rank " + std::to_string(leader) +
                               " sent a malformed calibration plan '" + plan + "'");
        }
        TESSERA_RETURN_IF_ERROR(
            MeasureExchanges(*messenger_, leader, /*lower=*/false, *schedule).status());
      }
    }
    TESSERA_ASSIGN_OR_RETURN(std::string text, store.GetString(key + "/decision", deadline));
    auto parsed = CopyModeReportFromJson(text);
    if (!parsed.ok()) {
      return InternalError("rank " + std::to_string(leader) +
                           " sent a malformed copy-mode decision: " + parsed.status().message());
    }
    decided = std::move(*parsed);
  }
  // This rank's own environment wins; off keeps the fixed defaults; otherwise the
  // leader's decision holds on every same-host rank.
  if (options_.shm_single_copy_source == SettingSource::kEnv) {
    copy_mode_.calibration = std::move(decided.calibration);
    copy_mode_.cache_path = decided.cache_path;
    copy_mode_.note = "set by TESSERA_SHM_SINGLE_COPY_BYTES / _MAX_BYTES";
  } else if (options_.calibration == CalibrationMode::kOff) {
    copy_mode_.note = "TESSERA_COMM_CALIBRATION=off";
  } else {
    copy_mode_ = std::move(decided);
  }
  options_.shm_single_copy_bytes = copy_mode_.single_copy.min_bytes;
  options_.shm_single_copy_max_bytes = copy_mode_.single_copy.max_bytes;
  options_.shm_single_copy_source = copy_mode_.source;
  if (options_.calibration == CalibrationMode::kRedo) options_.calibration = CalibrationMode::kAuto;
  messenger_->set_single_copy_window(copy_mode_.single_copy.min_bytes,
                                     copy_mode_.single_copy.max_bytes);
  messenger_->ledger().Reset();  // the measurement's bytes are no one's traffic
  return Status::Ok();
}

}  // namespace tessera::comm
