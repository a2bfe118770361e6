// The copy-mode calibration's values, decision and cache (calibration.h).
#include "comm/calibration.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "base/env.h"

namespace tessera::comm {
namespace {

constexpr int kCacheVersion = 1;

std::string FormatBytes(size_t bytes) {
  char text[32];
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) {
    std::snprintf(text, sizeof(text), "%zu MiB", bytes >> 20);
  } else if (bytes >= (size_t{1} << 10) && bytes % (size_t{1} << 10) == 0) {
    std::snprintf(text, sizeof(text), "%zu KiB", bytes >> 10);
  } else {
    std::snprintf(text, sizeof(text), "%zu B", bytes);
  }
  return text;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    size_t begin = colon + 1;
    while (begin < line.size() && line[begin] == ' ') ++begin;
    return line.substr(begin);
  }
  return "unknown";
}

}  // namespace

std::string_view CalibrationModeName(CalibrationMode mode) {
  switch (mode) {
    case CalibrationMode::kAuto:
      return "auto";
    case CalibrationMode::kOff:
      return "off";
    case CalibrationMode::kRedo:
      return "redo";
  }
  return "?";
}

std::optional<CalibrationMode> ParseCalibrationMode(std::string_view name) {
  if (name == "auto" || name.empty()) return CalibrationMode::kAuto;
  if (name == "off" || name == "0") return CalibrationMode::kOff;
  if (name == "redo") return CalibrationMode::kRedo;
  return std::nullopt;
}

std::string_view SettingSourceName(SettingSource source) {
  switch (source) {
    case SettingSource::kDefault:
      return "default";
    case SettingSource::kEnv:
      return "env";
    case SettingSource::kCalibrated:
      return "calibrated";
    case SettingSource::kCached:
      return "cached";
  }
  return "?";
}

std::string FormatCopyWindow(const CopyWindow& window) {
  if (window.empty()) return "never";
  return "[" + FormatBytes(window.min_bytes) + ", " +
         (window.max_bytes == kNoUpperBound ? std::string("no limit")
                                            : FormatBytes(window.max_bytes)) +
         ")";
}

CopyWindow DecideSingleCopyWindow(std::span<const CalibrationPoint> points, double margin) {
  size_t best_first = 0, best_end = 0;  // [first, end) of the chosen run
  double best_saved_us = 0;
  size_t i = 0;
  while (i < points.size()) {
    if (points[i].paired_ratio_q1 < 1.0 + margin) {
      ++i;
      continue;
    }
    size_t end = i;
    double saved_us = 0;
    while (end < points.size() && points[end].paired_ratio_q1 >= 1.0 + margin) {
      saved_us += points[end].streamed_us - points[end].single_copy_us;
      ++end;
    }
    const size_t run = end - i, best_run = best_end - best_first;
    if (run > best_run || (run == best_run && saved_us > best_saved_us)) {
      best_first = i;
      best_end = end;
      best_saved_us = saved_us;
    }
    i = end;
  }
  if (best_end == best_first) return CopyWindow{};
  return CopyWindow{points[best_first].message_bytes,
                    best_end < points.size() ? points[best_end].message_bytes : kNoUpperBound};
}

HostKey LocalHostKey() {
  HostKey key;
  char name[256] = {0};
  key.hostname = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "unknown";
  key.cpu_model = CpuModel();
  utsname uts{};
  key.kernel_release = ::uname(&uts) == 0 ? uts.release : "unknown";
  return key;
}

namespace {

nlohmann::json ToJson(const Calibration& c) {
  nlohmann::json points = nlohmann::json::array();
  for (const CalibrationPoint& p : c.points) {
    points.push_back({{"message_bytes", p.message_bytes},
                      {"streamed_us", p.streamed_us},
                      {"single_copy_us", p.single_copy_us},
                      {"paired_ratio", p.paired_ratio},
                      {"paired_ratio_q1", p.paired_ratio_q1},
                      {"samples", p.samples}});
  }
  return {
      {"version", kCacheVersion},
      {"host",
       {{"hostname", c.host.hostname},
        {"cpu_model", c.host.cpu_model},
        {"kernel_release", c.host.kernel_release}}},
      {"measured_unix_s", c.measured_unix_s},
      {"took_ms", c.took_ms},
      {"margin", c.margin},
      {"points", points},
      {"decision",
       {{"single_copy_min_bytes", c.single_copy.min_bytes},
        {"single_copy_max_bytes", c.single_copy.max_bytes},
        {"single_copy", FormatCopyWindow(c.single_copy)}}},
  };
}

// Throws nlohmann::json::exception when a field is missing or of the wrong type.
Result<Calibration> FromJson(const nlohmann::json& j) {
  if (j.at("version").get<int>() != kCacheVersion) {
    return InvalidArgumentError("version " + j.at("version").dump() + ", expected " +
                                std::to_string(kCacheVersion));
  }
  Calibration c;
  const nlohmann::json& host = j.at("host");
  c.host.hostname = host.at("hostname").get<std::string>();
  c.host.cpu_model = host.at("cpu_model").get<std::string>();
  c.host.kernel_release = host.at("kernel_release").get<std::string>();
  c.measured_unix_s = j.at("measured_unix_s").get<int64_t>();
  c.took_ms = j.at("took_ms").get<double>();
  c.margin = j.at("margin").get<double>();
  for (const nlohmann::json& p : j.at("points")) {
    c.points.push_back(
        CalibrationPoint{p.at("message_bytes").get<size_t>(), p.at("streamed_us").get<double>(),
                         p.at("single_copy_us").get<double>(), p.at("paired_ratio").get<double>(),
                         p.at("paired_ratio_q1").get<double>(), p.at("samples").get<int>()});
  }
  const nlohmann::json& d = j.at("decision");
  c.single_copy.min_bytes = d.at("single_copy_min_bytes").get<size_t>();
  c.single_copy.max_bytes = d.at("single_copy_max_bytes").get<size_t>();
  return c;
}

}  // namespace

std::string CalibrationToJson(const Calibration& c) { return ToJson(c).dump(2) + "\n"; }

Result<Calibration> CalibrationFromJson(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgumentError("not JSON");
  try {
    return FromJson(j);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("malformed calibration record: ") + e.what());
  }
}

std::string CopyModeReportToJson(const CopyModeReport& report) {
  nlohmann::json j = {
      {"single_copy_min_bytes", report.single_copy.min_bytes},
      {"single_copy_max_bytes", report.single_copy.max_bytes},
      {"source", SettingSourceName(report.source)},
      {"cache_path", report.cache_path},
      {"note", report.note},
      {"calibration", report.calibration ? ToJson(*report.calibration) : nlohmann::json()},
  };
  return j.dump();
}

Result<CopyModeReport> CopyModeReportFromJson(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgumentError("not JSON");
  try {
    CopyModeReport report;
    report.single_copy.min_bytes = j.at("single_copy_min_bytes").get<size_t>();
    report.single_copy.max_bytes = j.at("single_copy_max_bytes").get<size_t>();
    const std::string source = j.at("source").get<std::string>();
    bool known = false;
    for (SettingSource s : {SettingSource::kDefault, SettingSource::kEnv,
                            SettingSource::kCalibrated, SettingSource::kCached}) {
      if (SettingSourceName(s) == source) {
        report.source = s;
        known = true;
      }
    }
    if (!known) return InvalidArgumentError("unknown source '" + source + "'");
    report.cache_path = j.at("cache_path").get<std::string>();
    report.note = j.at("note").get<std::string>();
    if (!j.at("calibration").is_null()) {
      TESSERA_ASSIGN_OR_RETURN(report.calibration, FromJson(j.at("calibration")));
    }
    return report;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("malformed copy-mode record: ") + e.what());
  }
}

std::string CalibrationCacheDir() {
  if (auto dir = EnvString("TESSERA_CACHE_DIR"); dir && !dir->empty()) return *dir;
  if (auto xdg = EnvString("XDG_CACHE_HOME"); xdg && !xdg->empty()) return *xdg + "/tessera";
  if (auto home = EnvString("HOME"); home && !home->empty()) return *home + "/.cache/tessera";
  return "";
}

std::string CalibrationCachePath(const std::string& dir, const HostKey& host) {
  std::string name;
  for (char c : host.hostname) {
    name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  }
  return dir + "/comm-calibration-" + (name.empty() ? "host" : name) + ".json";
}

Result<Calibration> LoadCalibration(const std::string& dir, const HostKey& host) {
  const std::string path = CalibrationCachePath(dir, host);
  std::ifstream in(path);
  if (!in) return NotFoundError("no calibration cache at " + path);
  std::stringstream text;
  text << in.rdbuf();
  auto c = CalibrationFromJson(text.str());
  if (!c.ok()) {
    return InvalidArgumentError("calibration cache " + path +
                                " is corrupt: " + c.status().message());
  }
  if (c->host.cpu_model != host.cpu_model || c->host.kernel_release != host.kernel_release ||
      c->host.hostname != host.hostname) {
    return NotFoundError("calibration cache " + path + " was measured on another machine (" +
                         c->host.cpu_model + ", kernel " + c->host.kernel_release +
                         "), not on this one (" + host.cpu_model + ", kernel " +
                         host.kernel_release + ")");
  }
  return c;
}

Status SaveCalibration(const std::string& dir, const Calibration& calibration) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create " + dir + ": " + ec.message());
  const std::string path = CalibrationCachePath(dir, calibration.host);
  std::random_device random;
  const std::string temp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(random());
  {
    std::ofstream out(temp, std::ios::trunc);
    if (!out) return UnavailableError("cannot write " + temp + ": " + std::strerror(errno));
    out << CalibrationToJson(calibration);
    out.flush();
    if (!out) {
      std::filesystem::remove(temp, ec);
      return UnavailableError("cannot write " + temp);
    }
  }
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    return UnavailableError("cannot rename " + temp + " to " + path + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace tessera::comm
