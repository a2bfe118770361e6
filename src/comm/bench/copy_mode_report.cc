// PrintCopyMode (copy_mode_report.h).
#include "comm/bench/copy_mode_report.h"

#include <ctime>
#include <string>

namespace tessera::comm {

void PrintCopyMode(const CopyModeReport& report, const CommOptions& options, bool table,
                   FILE* out) {
  std::string where;
  if (report.source == SettingSource::kCalibrated && report.calibration) {
    char took[32];
    std::snprintf(took, sizeof(took), " in %.0f ms", report.calibration->took_ms);
    where = took;
  }
  if (!report.cache_path.empty()) where += "; cache " + report.cache_path;
  if (!report.note.empty()) where += "; " + report.note;
  std::fprintf(out,
               "# copy mode: single copy for same-host collective messages %s (%s%s); within an "
               "all-reduce below %zu KiB; shared-buffer descriptors from %zu KiB\n",
               FormatCopyWindow(report.single_copy).c_str(),
               std::string(SettingSourceName(report.source)).c_str(), where.c_str(),
               options.shm_single_copy_allreduce_max_bytes >> 10,
               options.shm_shared_buffer_bytes >> 10);
  if (!table) return;
  if (!report.calibration) {
    std::fprintf(out, "# calibration: none (%s)\n",
                 report.note.empty() ? "no same-host peer" : report.note.c_str());
    return;
  }
  const Calibration& c = *report.calibration;
  char when[32] = "?";
  const std::time_t t = static_cast<std::time_t>(c.measured_unix_s);
  std::tm tm{};
  if (gmtime_r(&t, &tm) != nullptr) std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", &tm);
  std::fprintf(out,
               "# calibration: %s, %s, kernel %s; measured %s in %.0f ms; 2-rank exchanges, "
               "streamed and single copy interleaved, medians; margin %.0f%%\n",
               c.host.hostname.c_str(), c.host.cpu_model.c_str(), c.host.kernel_release.c_str(),
               when, c.took_ms, c.margin * 100);
  std::fprintf(out, "# %12s %12s %15s %13s %9s %8s %s\n", "message(B)", "streamed_us",
               "single_copy_us", "paired_ratio", "(q1)", "samples", "");
  for (const CalibrationPoint& p : c.points) {
    const bool single = !c.single_copy.empty() && p.message_bytes >= c.single_copy.min_bytes &&
                        p.message_bytes < c.single_copy.max_bytes;
    std::fprintf(out, "  %12zu %12.1f %15.1f %13.3f %9.3f %8d %s\n", p.message_bytes, p.streamed_us,
                 p.single_copy_us, p.paired_ratio, p.paired_ratio_q1, p.samples,
                 single ? "single copy" : "stream");
  }
  std::fprintf(out,
               "# decision: single copy %s (paired ratio = streamed / single copy, median and "
               "lower quartile of the pairs; single copy where q1 >= 1 + margin)\n",
               FormatCopyWindow(c.single_copy).c_str());
}

}  // namespace tessera::comm
