// The per-host copy-mode calibration: which same-host collective messages go as
// single copy (process_vm_readv) and which stream through the shm ring, decided
// from streamed vs single-copy timings measured on this host and cached per host
// (JSON under the cache dir). Layer: comm. Pure values and files; the measurement
// and the agreement between ranks are Communicator::ResolveCopyMode
// (communicator_calibration.cc). Thread-compatible (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera::comm {

// TESSERA_COMM_CALIBRATION. kAuto: use this host's cache, measure when there is
// none; kOff: the fixed defaults (every message streams); kRedo: measure again and
// rewrite the cache.
enum class CalibrationMode : uint8_t { kAuto, kOff, kRedo };
std::string_view CalibrationModeName(CalibrationMode mode);  // "auto", "off", "redo"
std::optional<CalibrationMode> ParseCalibrationMode(std::string_view name);

// Where a communicator's single-copy window came from.
enum class SettingSource : uint8_t {
  kDefault,     // CommOptions' fixed defaults
  kEnv,         // TESSERA_SHM_SINGLE_COPY_* (or set by the caller)
  kCalibrated,  // measured on this host by this job
  kCached,      // measured earlier on this host, read from the cache
};
std::string_view SettingSourceName(SettingSource source);  // "default", "env", …

// Messages of [min_bytes, max_bytes) go as single copy; min_bytes 0 = never.
struct CopyWindow {
  size_t min_bytes = 0;
  size_t max_bytes = 0;
  bool empty() const { return min_bytes == 0 || max_bytes <= min_bytes; }
  bool operator==(const CopyWindow&) const = default;
};
// A max_bytes with no upper bound (single copy won at the largest size measured).
inline constexpr size_t kNoUpperBound = SIZE_MAX;
// "[1 MiB, 8 MiB)", "[1 MiB, no limit)" or "never".
std::string FormatCopyWindow(const CopyWindow& window);

// One message size, measured as a two-rank exchange (each rank sends `bytes` to
// the other and copies its own block, as a 2-rank all-gather or all-to-all does),
// streamed and single-copy interleaved A/B/B/A.
struct CalibrationPoint {
  size_t message_bytes = 0;
  double streamed_us = 0;     // median
  double single_copy_us = 0;  // median
  // Median over the samples of streamed / single copy, each pair measured back to
  // back (> 1: single copy faster). Robust to the host drifting between states.
  double paired_ratio = 0;
  // The lower quartile of the same ratios (nearest rank): single copy was at least
  // this much faster in 3 of 4 pairs.
  double paired_ratio_q1 = 0;
  int samples = 0;
  bool operator==(const CalibrationPoint&) const = default;
};

// Single copy must be at least this much faster before a size leaves the streamed
// default: the VMs measured so far drift by a few percent for minutes.
inline constexpr double kCalibrationMargin = 0.05;

// The decision: the longest run of consecutive measured sizes (points in
// increasing size) where single copy won by the margin in 3 of 4 pairs
// (paired_ratio_q1 >= 1 + margin): a median alone let a slow phase of the VM — every
// exchange 5–10x slower, dominated by scheduling — pass a 7% win at 256 KiB that
// the fast phase did not show. min_bytes = its first
// size; max_bytes = the next measured size (which lost), or kNoUpperBound when it
// runs to the largest. No such size: never (every message streams). Ties between
// runs go to the one that saves more time.
CopyWindow DecideSingleCopyWindow(std::span<const CalibrationPoint> points,
                                  double margin = kCalibrationMargin);

// What a cache is keyed by: a cache measured on another CPU (a VM image moved to
// other hardware) or another kernel does not apply here.
struct HostKey {
  std::string hostname;
  std::string cpu_model;       // /proc/cpuinfo "model name" (or "unknown")
  std::string kernel_release;  // uname -r
  bool operator==(const HostKey&) const = default;
};
HostKey LocalHostKey();

struct Calibration {
  HostKey host;
  std::vector<CalibrationPoint> points;  // increasing message_bytes
  CopyWindow single_copy;                // the decision
  double margin = kCalibrationMargin;
  double took_ms = 0;           // the measurement's wall time on the leader
  int64_t measured_unix_s = 0;  // when
};

// What a communicator resolved at connect (Communicator::copy_mode()): the window
// in force, where it came from, and the measurement behind it when there is one.
struct CopyModeReport {
  CopyWindow single_copy;
  SettingSource source = SettingSource::kDefault;
  std::optional<Calibration> calibration;  // measured now, or read from the cache
  std::string cache_path;                  // the cache read or written ("" = none)
  std::string note;  // why nothing was calibrated ("TESSERA_COMM_CALIBRATION=off", …)
};

// JSON (nlohmann): {"version":1,"host":{…},"measured_unix_s":…,"took_ms":…,
// "margin":…,"points":[{"message_bytes":…,"streamed_us":…,…}],
// "decision":{"single_copy_min_bytes":…,"single_copy_max_bytes":…}}.
std::string CalibrationToJson(const Calibration& calibration);
// InvalidArgument when `text` is not such a record.
Result<Calibration> CalibrationFromJson(std::string_view text);

// The leader's decision as the other same-host ranks receive it (through the
// store); InvalidArgument when `text` is not one.
std::string CopyModeReportToJson(const CopyModeReport& report);
Result<CopyModeReport> CopyModeReportFromJson(std::string_view text);

// $TESSERA_CACHE_DIR, else $XDG_CACHE_HOME/tessera, else $HOME/.cache/tessera;
// "" when none is set.
std::string CalibrationCacheDir();
// <dir>/comm-calibration-<hostname>.json (the hostname's unsafe characters as _).
std::string CalibrationCachePath(const std::string& dir, const HostKey& host);
// This host's cached calibration. NotFound when there is none or it was measured
// on another CPU model or kernel (the message says which); InvalidArgument when the
// file is corrupt.
Result<Calibration> LoadCalibration(const std::string& dir, const HostKey& host);
// Writes the cache atomically (a temporary file in `dir`, then rename), creating
// `dir` if needed; concurrent writers leave one whole file. An error when `dir`
// cannot be written (the caller warns and goes on).
Status SaveCalibration(const std::string& dir, const Calibration& calibration);

}  // namespace tessera::comm
