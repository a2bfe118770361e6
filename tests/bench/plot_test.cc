// The --plot writer: file names, the gnuplot data and script (content checked),
// and gnuplot drawing a PNG when it is installed (skipped otherwise).
#include "bench/plot.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tessera::bench {
namespace {

std::vector<SweepPoint> ThreePoints() {
  std::vector<SweepPoint> points(3);
  const double rates[] = {1, 4, INFINITY};
  for (int i = 0; i < 3; ++i) {
    SweepPoint& p = points[static_cast<size_t>(i)];
    p.request_rate = rates[i];
    p.metrics.completed = 10;
    p.metrics.output_throughput = 100.0 * (i + 1);
    p.metrics.ttft_ms.median = 50.0 * (i + 1);
    p.metrics.ttft_ms.p99 = 90.0 * (i + 1);
    p.metrics.tpot_ms.median = 20.0 + i;
    p.metrics.tpot_ms.p99 = 30.0 + i;
  }
  return points;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(PlotTest, FilesSitNextToThePng) {
  PlotFiles f = PlotFilesFor("out/sweep.png");
  EXPECT_EQ(f.png_path, "out/sweep.png");
  EXPECT_EQ(f.data_path, "out/sweep.dat");
  EXPECT_EQ(f.script_path, "out/sweep.gp");
  PlotFiles g = PlotFilesFor("plot");
  EXPECT_EQ(g.data_path, "plot.dat");
  EXPECT_EQ(g.script_path, "plot.gp");
}

TEST(PlotTest, DataHasOneRowPerRateWithCompletedRequests) {
  std::vector<SweepPoint> points = ThreePoints();
  points[1].metrics.completed = 0;  // every request at rate 4 failed
  const std::string data = GnuplotData(points);
  EXPECT_NE(data.find("# rate  output_tok_s  ttft_p50  ttft_p99  tpot_p50  tpot_p99\n"),
            std::string::npos)
      << data;
  EXPECT_NE(data.find("\n1 100.0000 50.0000 90.0000 20.0000 30.0000\n"), std::string::npos) << data;
  EXPECT_NE(data.find("\n# rate 4: every request failed\n"), std::string::npos) << data;
  EXPECT_NE(data.find("\ninf 300.0000 150.0000 270.0000 22.0000 32.0000\n"), std::string::npos)
      << data;
}

TEST(PlotTest, ScriptPlotsTtftAndTpotAgainstThroughput) {
  const std::string script = GnuplotScript(PlotFilesFor("/tmp/a'b/sweep.png"), "my title");
  EXPECT_NE(script.find("set output '/tmp/a''b/sweep.png'"), std::string::npos) << script;
  EXPECT_NE(script.find("set multiplot layout 1,2 title 'my title'"), std::string::npos);
  EXPECT_NE(script.find("set xlabel 'output throughput (tok/s)'"), std::string::npos);
  EXPECT_NE(script.find("set ylabel 'TTFT (ms)'"), std::string::npos);
  EXPECT_NE(script.find("set ylabel 'TPOT (ms)'"), std::string::npos);
  // TTFT p50/p99 are columns 3/4, TPOT p50/p99 columns 5/6, throughput column 2.
  for (const char* use :
       {"using 2:3 with linespoints pt 7 title 'p50'",
        "using 2:4 with linespoints pt 5 title 'p99'", "using 2:4:1 with labels",
        "using 2:5 with linespoints pt 7 title 'p50'",
        "using 2:6 with linespoints pt 5 title 'p99'", "using 2:6:1 with labels"}) {
    EXPECT_NE(script.find(std::string("'/tmp/a''b/sweep.dat' ") + use), std::string::npos)
        << use << "\n"
        << script;
  }
  EXPECT_NE(script.find("unset multiplot"), std::string::npos);
}

TEST(PlotTest, NothingToPlotWhenEveryRateFailed) {
  std::vector<SweepPoint> points = ThreePoints();
  for (SweepPoint& p : points) p.metrics.completed = 0;
  const std::string dir = ::testing::TempDir() + "/tessera_plot_none_" + std::to_string(getpid());
  Status s = WritePlot(points, PlotFilesFor(dir + ".png"), "t");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(std::filesystem::exists(dir + ".dat"));
}

TEST(PlotTest, MissingGnuplotIsAClearError) {
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  const std::string empty_dir =
      ::testing::TempDir() + "/tessera_plot_nopath_" + std::to_string(getpid());
  std::filesystem::create_directories(empty_dir);
  ::setenv("PATH", empty_dir.c_str(), 1);
  EXPECT_FALSE(GnuplotOnPath());
  const std::string stem = empty_dir + "/sweep";
  Status s = WritePlot(ThreePoints(), PlotFilesFor(stem + ".png"), "t");
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("gnuplot"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("gnuplot-nox"), std::string::npos) << s.ToString();
  // The data and script are written anyway, to be drawn later.
  EXPECT_TRUE(std::filesystem::exists(stem + ".dat"));
  EXPECT_TRUE(std::filesystem::exists(stem + ".gp"));
  std::filesystem::remove_all(empty_dir);
}

TEST(PlotTest, GnuplotDrawsThePng) {
  if (!GnuplotOnPath()) GTEST_SKIP() << "gnuplot is not installed";
  const std::string dir = ::testing::TempDir() + "/tessera_plot_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const PlotFiles files = PlotFilesFor(dir + "/sweep.png");
  Status s = WritePlot(ThreePoints(), files, "tessera bench serve: test");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ReadAll(files.data_path), GnuplotData(ThreePoints()));
  const std::string png = ReadAll(files.png_path);
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::bench
