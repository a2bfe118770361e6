// The copy-mode calibration (comm/calibration.h, communicator_calibration.cc): the
// decision on given timings, the per-host cache (round trip, another CPU, corrupt,
// unwritable), the environment's precedence, and every same-host rank taking the
// leader's decision. The measurement is injected
// (CommOptions::calibration_measure_for_test): nothing here depends on timing.
#include "comm/calibration.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/options.h"
#include "comm/rendezvous/hash_store.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

using testing::UniqueJobId;

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

// Points at 256 KiB … 16 MiB with the given paired ratios (streamed / single copy).
std::vector<CalibrationPoint> PointsWithRatios(const std::vector<double>& ratios) {
  std::vector<CalibrationPoint> points;
  size_t bytes = 256 * kKiB;
  for (double ratio : ratios) {
    const double single_us = static_cast<double>(bytes) / 10'000.0;
    points.push_back(CalibrationPoint{bytes, single_us * ratio, single_us, ratio, ratio, 7});
    bytes *= 2;
  }
  return points;
}

// A fresh directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/tessera-calib-XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Calibration SampleCalibration() {
  Calibration c;
  c.host = LocalHostKey();
  c.points = PointsWithRatios({0.8, 0.9, 1.2, 1.3, 1.1, 0.95, 0.9});
  c.single_copy = DecideSingleCopyWindow(c.points);
  c.took_ms = 123.5;
  c.measured_unix_s = 1'800'000'000;
  return c;
}

TEST(CalibrationDecisionTest, StreamsWhenSingleCopyNeverWinsByTheMargin) {
  EXPECT_TRUE(
      DecideSingleCopyWindow(PointsWithRatios({0.5, 0.7, 0.9, 1.0, 0.8, 0.6, 0.6})).empty());
  // 4% faster is inside the noise: stay streamed.
  EXPECT_TRUE(DecideSingleCopyWindow(PointsWithRatios({1.04, 1.04, 1.04, 1.04})).empty());
  EXPECT_TRUE(DecideSingleCopyWindow({}).empty());
  EXPECT_EQ(FormatCopyWindow(CopyWindow{}), "never");
}

TEST(CalibrationDecisionTest, AWinInOnlyHalfThePairsIsNoise) {
  // The median pair won by 7%, but a quarter of the pairs did not win by 5%.
  std::vector<CalibrationPoint> points = PointsWithRatios({1.07, 1.3});
  points[0].paired_ratio_q1 = 0.97;
  EXPECT_EQ(DecideSingleCopyWindow(points), (CopyWindow{512 * kKiB, kNoUpperBound}));
  points[1].paired_ratio_q1 = 1.01;
  EXPECT_TRUE(DecideSingleCopyWindow(points).empty());
}

TEST(CalibrationDecisionTest, WindowRunsFromTheFirstWinToTheNextLoss) {
  // Wins at 1, 2 and 4 MiB; loses at 8 MiB.
  const CopyWindow w =
      DecideSingleCopyWindow(PointsWithRatios({0.7, 1.0, 1.2, 1.5, 1.06, 0.9, 0.8}));
  EXPECT_EQ(w, (CopyWindow{1 * kMiB, 8 * kMiB}));
  EXPECT_EQ(FormatCopyWindow(w), "[1 MiB, 8 MiB)");
}

TEST(CalibrationDecisionTest, WinningAtTheLargestSizeHasNoUpperBound) {
  const CopyWindow w =
      DecideSingleCopyWindow(PointsWithRatios({0.9, 0.9, 1.1, 1.1, 1.2, 1.3, 1.4}));
  EXPECT_EQ(w, (CopyWindow{1 * kMiB, kNoUpperBound}));
  EXPECT_EQ(FormatCopyWindow(w), "[1 MiB, no limit)");
}

TEST(CalibrationDecisionTest, TheLongestRunOfWinsIsChosen) {
  // An isolated win at 256 KiB, a run at 2–8 MiB.
  const CopyWindow w =
      DecideSingleCopyWindow(PointsWithRatios({1.3, 0.9, 0.9, 1.1, 1.1, 1.1, 0.9}));
  EXPECT_EQ(w, (CopyWindow{2 * kMiB, 16 * kMiB}));
  // The margin is a parameter.
  EXPECT_EQ(DecideSingleCopyWindow(PointsWithRatios({1.04, 0.9}), 0.02),
            (CopyWindow{256 * kKiB, 512 * kKiB}));
}

TEST(CalibrationCacheTest, RoundTrip) {
  TempDir dir;
  const Calibration c = SampleCalibration();
  ASSERT_TRUE(SaveCalibration(dir.path() + "/sub", c).ok());  // creates the directory
  auto loaded = LoadCalibration(dir.path() + "/sub", c.host);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->host, c.host);
  EXPECT_EQ(loaded->points, c.points);
  EXPECT_EQ(loaded->single_copy, c.single_copy);
  EXPECT_EQ(loaded->single_copy, (CopyWindow{1 * kMiB, 8 * kMiB}));
  EXPECT_DOUBLE_EQ(loaded->took_ms, c.took_ms);
  EXPECT_EQ(loaded->measured_unix_s, c.measured_unix_s);
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() + "/sub")) {
    ++files;
    EXPECT_EQ(entry.path().extension(), ".json") << entry.path();
  }
  EXPECT_EQ(files, 1);
  // And the copy-mode record the leader publishes.
  CopyModeReport report{c.single_copy, SettingSource::kCalibrated, c, "/x/y.json", ""};
  auto back = CopyModeReportFromJson(CopyModeReportToJson(report));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->single_copy, report.single_copy);
  EXPECT_EQ(back->source, SettingSource::kCalibrated);
  ASSERT_TRUE(back->calibration.has_value());
  EXPECT_EQ(back->calibration->points, c.points);
  EXPECT_EQ(back->cache_path, "/x/y.json");
  EXPECT_FALSE(CopyModeReportFromJson("{\"source\":\"calibrated\"}").ok());
}

TEST(CalibrationCacheTest, ACacheFromAnotherCpuOrKernelIsIgnored) {
  TempDir dir;
  Calibration other = SampleCalibration();
  other.host.cpu_model = "Some Other CPU @ 1.00GHz";
  ASSERT_TRUE(SaveCalibration(dir.path(), other).ok());
  auto loaded = LoadCalibration(dir.path(), LocalHostKey());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
  EXPECT_NE(loaded.status().message().find("Some Other CPU"), std::string::npos);
  other = SampleCalibration();
  other.host.kernel_release = "0.0.1-other";
  ASSERT_TRUE(SaveCalibration(dir.path(), other).ok());
  EXPECT_EQ(LoadCalibration(dir.path(), LocalHostKey()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(LoadCalibration(dir.path() + "/missing", LocalHostKey()).status().code(),
            StatusCode::kNotFound);
}

TEST(CalibrationCacheTest, ACorruptCacheIsInvalidArgument) {
  TempDir dir;
  const HostKey host = LocalHostKey();
  for (const char* text : {"", "{", "[1,2]", "{\"version\":1}", "{\"version\":2,\"host\":{}}"}) {
    std::ofstream(CalibrationCachePath(dir.path(), host), std::ios::trunc) << text;
    auto loaded = LoadCalibration(dir.path(), host);
    ASSERT_FALSE(loaded.ok()) << text;
    EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument) << text;
  }
}

TEST(CalibrationCacheTest, AnUnwritableDirectoryIsAnError) {
  TempDir dir;
  // A directory under a regular file cannot be created, even by root.
  std::ofstream(dir.path() + "/file") << "x";
  EXPECT_FALSE(SaveCalibration(dir.path() + "/file/sub", SampleCalibration()).ok());
}

TEST(CalibrationCacheTest, CacheDirectoryFromTheEnvironment) {
  struct Saved {
    const char* name;
    std::optional<std::string> value;
  };
  std::vector<Saved> saved;
  for (const char* name : {"TESSERA_CACHE_DIR", "XDG_CACHE_HOME", "HOME"}) {
    const char* v = std::getenv(name);
    saved.push_back({name, v ? std::optional<std::string>(v) : std::nullopt});
  }
  ::setenv("HOME", "/h", 1);
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("TESSERA_CACHE_DIR");
  EXPECT_EQ(CalibrationCacheDir(), "/h/.cache/tessera");
  ::setenv("XDG_CACHE_HOME", "/x", 1);
  EXPECT_EQ(CalibrationCacheDir(), "/x/tessera");
  ::setenv("TESSERA_CACHE_DIR", "/t", 1);
  EXPECT_EQ(CalibrationCacheDir(), "/t");
  for (const Saved& s : saved) {
    if (s.value) {
      ::setenv(s.name, s.value->c_str(), 1);
    } else {
      ::unsetenv(s.name);
    }
  }
}

// Sets environment variables for one test, restoring them after.
class ScopedEnv {
 public:
  void Set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first, it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first);
      }
    }
  }

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

TEST(CalibrationOptionsTest, EnvironmentKnobsPinTheWindow) {
  {
    ScopedEnv env;
    env.Set("TESSERA_SHM_SINGLE_COPY_BYTES", "0");
    env.Set("TESSERA_COMM_CALIBRATION", "auto");
    auto o = CommOptions::FromEnvironment();
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->shm_single_copy_source, SettingSource::kEnv);
    EXPECT_EQ(o->calibration, CalibrationMode::kAuto);
  }
  {
    ScopedEnv env;
    env.Set("TESSERA_SHM_SINGLE_COPY_MAX_BYTES", "4M");
    auto o = CommOptions::FromEnvironment();
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->shm_single_copy_source, SettingSource::kEnv);
  }
  for (const auto& [text, mode] :
       {std::pair{"off", CalibrationMode::kOff}, std::pair{"redo", CalibrationMode::kRedo},
        std::pair{"auto", CalibrationMode::kAuto}}) {
    ScopedEnv env;
    env.Set("TESSERA_COMM_CALIBRATION", text);
    auto o = CommOptions::FromEnvironment();
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->calibration, mode);
  }
  ScopedEnv env;
  env.Set("TESSERA_COMM_CALIBRATION", "sometimes");
  EXPECT_FALSE(CommOptions::FromEnvironment().ok());
}

// Options for communicators whose ranks are threads, calibrating into `dir` with
// an injected measurement: rank 0 (the leader) finds single copy faster at 1–4 MiB,
// any other rank would find it slower everywhere, and `calls` counts measurements.
CommOptions CalibratingOptions(const std::string& dir, std::atomic<int>* calls) {
  CommOptions o = testing::TestOptions(TransportKind::kShm);
  o.shm_single_copy_bytes = 0;
  o.shm_single_copy_max_bytes = 8 * kMiB;
  o.shm_single_copy_source = SettingSource::kDefault;
  o.calibration_cache_dir = dir;
  o.calibration_measure_for_test = [calls](int rank) {
    calls->fetch_add(1);
    return rank == 0 ? PointsWithRatios({0.8, 0.9, 1.2, 1.3, 1.2, 0.95, 0.9})
                     : PointsWithRatios({0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5});
  };
  return o;
}

// Runs `n` rank threads, rank r with options[r], and returns each one's copy mode.
std::vector<CopyModeReport> ConnectRanks(const std::vector<CommOptions>& options,
                                         const std::string& job = UniqueJobId("calib")) {
  const int n = static_cast<int>(options.size());
  auto store = std::make_shared<HashStore>();
  std::vector<CopyModeReport> reports(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CommOptions o = options[r];
      o.job_id = job;
      auto comm = Communicator::Create(store, r, n, o);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      reports[r] = (*comm)->copy_mode();
      // The window is what the messenger sends by: a collective still exact.
      std::vector<float> send(300'000, static_cast<float>(r + 1)), recv(300'000 * n);
      ASSERT_TRUE((*comm)->AllGather(send.data(), recv.data(), send.size(), DataType::kF32).ok());
      for (int p = 0; p < n; ++p) ASSERT_EQ(recv[p * send.size() + 7], static_cast<float>(p + 1));
      // The calibration's traffic is not in the ledger.
      EXPECT_EQ((*comm)->ledger().Total().calls, 1u);
    });
  }
  for (auto& t : threads) t.join();
  return reports;
}

TEST(CalibrationConnectTest, EveryRankTakesTheLeadersDecisionAndTheCacheServesTheNextJob) {
  TempDir dir;
  std::atomic<int> calls{0};
  const CommOptions o = CalibratingOptions(dir.path(), &calls);
  std::vector<CopyModeReport> reports = ConnectRanks({o, o, o, o});
  EXPECT_EQ(calls.load(), 1);  // the leader measured, once
  for (const CopyModeReport& r : reports) {
    EXPECT_EQ(r.single_copy, (CopyWindow{1 * kMiB, 8 * kMiB}));
    EXPECT_EQ(r.source, SettingSource::kCalibrated);
    ASSERT_TRUE(r.calibration.has_value());
    EXPECT_EQ(r.calibration->points.size(), 7u);
    EXPECT_EQ(r.cache_path, CalibrationCachePath(dir.path(), LocalHostKey()));
  }
  ASSERT_TRUE(LoadCalibration(dir.path(), LocalHostKey()).ok());
  // The next job reads the cache and measures nothing.
  reports = ConnectRanks({o, o, o});
  EXPECT_EQ(calls.load(), 1);
  for (const CopyModeReport& r : reports) {
    EXPECT_EQ(r.single_copy, (CopyWindow{1 * kMiB, 8 * kMiB}));
    EXPECT_EQ(r.source, SettingSource::kCached);
  }
  // redo measures again and rewrites.
  CommOptions redo = o;
  redo.calibration = CalibrationMode::kRedo;
  reports = ConnectRanks({redo, redo});
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(reports[1].source, SettingSource::kCalibrated);
}

TEST(CalibrationConnectTest, SplitPassesTheDecisionOnWithoutMeasuring) {
  TempDir dir;
  std::atomic<int> calls{0};
  const CommOptions o = CalibratingOptions(dir.path(), &calls);
  testing::RunRanks(4, o, [&](Communicator& comm) {
    EXPECT_EQ(comm.copy_mode().source, SettingSource::kCalibrated);
    auto sub = comm.Split(comm.rank() % 2, comm.rank());
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    EXPECT_EQ((*sub)->copy_mode().single_copy, (CopyWindow{1 * kMiB, 8 * kMiB}));
    EXPECT_EQ((*sub)->copy_mode().source, SettingSource::kCalibrated);
  });
  EXPECT_EQ(calls.load(), 1);
}

TEST(CalibrationConnectTest, ACorruptCacheIsMeasuredAgainAndRewritten) {
  TempDir dir;
  std::atomic<int> calls{0};
  const CommOptions o = CalibratingOptions(dir.path(), &calls);
  const std::string path = CalibrationCachePath(dir.path(), LocalHostKey());
  std::ofstream(path) << "{\"version\": 1, \"host\": tru";
  std::vector<CopyModeReport> reports = ConnectRanks({o, o});
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(reports[1].source, SettingSource::kCalibrated);
  EXPECT_TRUE(LoadCalibration(dir.path(), LocalHostKey()).ok());
}

TEST(CalibrationConnectTest, ACacheFromAnotherCpuIsMeasuredAgain) {
  TempDir dir;
  std::atomic<int> calls{0};
  const CommOptions o = CalibratingOptions(dir.path(), &calls);
  Calibration other = SampleCalibration();
  other.host.cpu_model = "Another CPU";
  other.single_copy = CopyWindow{64 * kKiB, kNoUpperBound};
  ASSERT_TRUE(SaveCalibration(dir.path(), other).ok());
  std::vector<CopyModeReport> reports = ConnectRanks({o, o});
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(reports[0].single_copy, (CopyWindow{1 * kMiB, 8 * kMiB}));
  EXPECT_EQ(LoadCalibration(dir.path(), LocalHostKey())->host.cpu_model, LocalHostKey().cpu_model);
}

TEST(CalibrationConnectTest, AnUnwritableCacheDirectoryStillConnects) {
  TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";
  std::atomic<int> calls{0};
  const CommOptions o = CalibratingOptions(dir.path() + "/file/sub", &calls);
  std::vector<CopyModeReport> reports = ConnectRanks({o, o});
  EXPECT_EQ(calls.load(), 1);
  for (const CopyModeReport& r : reports) {
    EXPECT_EQ(r.single_copy, (CopyWindow{1 * kMiB, 8 * kMiB}));
    EXPECT_EQ(r.source, SettingSource::kCalibrated);
    EXPECT_EQ(r.cache_path, "");  // nothing was written
  }
}

TEST(CalibrationConnectTest, TheEnvironmentWinsAndOffKeepsTheDefaults) {
  TempDir dir;
  std::atomic<int> calls{0};
  const CommOptions o = CalibratingOptions(dir.path(), &calls);
  // Rank 1's own window (TESSERA_SHM_SINGLE_COPY_BYTES) holds on rank 1; the others
  // take the leader's calibration.
  CommOptions pinned = o;
  pinned.shm_single_copy_bytes = 64 * kKiB;
  pinned.shm_single_copy_source = SettingSource::kEnv;
  std::vector<CopyModeReport> reports = ConnectRanks({o, pinned, o});
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(reports[0].single_copy, (CopyWindow{1 * kMiB, 8 * kMiB}));
  EXPECT_EQ(reports[1].single_copy, (CopyWindow{64 * kKiB, 8 * kMiB}));
  EXPECT_EQ(reports[1].source, SettingSource::kEnv);
  EXPECT_EQ(reports[2].single_copy, (CopyWindow{1 * kMiB, 8 * kMiB}));
  // A leader whose environment pins the window measures nothing; every rank of its
  // host takes that window.
  reports = ConnectRanks({pinned, o, o});
  EXPECT_EQ(calls.load(), 1);
  for (const CopyModeReport& r : reports) {
    EXPECT_EQ(r.single_copy, (CopyWindow{64 * kKiB, 8 * kMiB}));
    EXPECT_EQ(r.source, SettingSource::kEnv);
  }
  // off: the fixed defaults (every message streams), nothing measured or written.
  TempDir empty;
  CommOptions off = CalibratingOptions(empty.path(), &calls);
  off.calibration = CalibrationMode::kOff;
  reports = ConnectRanks({off, off});
  EXPECT_EQ(calls.load(), 1);
  for (const CopyModeReport& r : reports) {
    EXPECT_TRUE(r.single_copy.empty());
    EXPECT_EQ(r.source, SettingSource::kDefault);
  }
  EXPECT_TRUE(std::filesystem::is_empty(empty.path()));
}

TEST(CalibrationConnectTest, RanksThatAreThreadsDoNotCalibrate) {
  // Without an injected measurement, threads keep the defaults (their single copy
  // is a memcpy, not the host's process_vm_readv) and touch no cache.
  TempDir dir;
  CommOptions o = testing::TestOptions(TransportKind::kShm);
  o.shm_single_copy_bytes = 0;
  o.shm_single_copy_source = SettingSource::kDefault;
  o.calibration_cache_dir = dir.path();
  std::vector<CopyModeReport> reports = ConnectRanks({o, o});
  for (const CopyModeReport& r : reports) {
    EXPECT_TRUE(r.single_copy.empty());
    EXPECT_EQ(r.source, SettingSource::kDefault);
    EXPECT_NE(r.note.find("threads"), std::string::npos) << r.note;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace tessera::comm
