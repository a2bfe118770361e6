#include "bench/plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

extern char** environ;

namespace tessera::bench {
namespace {

// A gnuplot single-quoted string: a quote inside is written twice.
std::string GnuplotQuoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) return NotFoundError("cannot create " + path);
  out << text;
  if (!out.flush()) return InternalError("writing " + path + " failed");
  return Status::Ok();
}

}  // namespace

PlotFiles PlotFilesFor(const std::string& png_path) {
  std::string stem = png_path;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".png") == 0) {
    stem.resize(stem.size() - 4);
  }
  return {.png_path = png_path, .data_path = stem + ".dat", .script_path = stem + ".gp"};
}

std::string GnuplotData(std::span<const SweepPoint> points) {
  std::string out =
      "# tessera bench serve request-rate sweep; latencies in ms\n"
      "# rate  output_tok_s  ttft_p50  ttft_p99  tpot_p50  tpot_p99\n";
  char line[256];
  for (const SweepPoint& p : points) {
    const ServeMetrics& m = p.metrics;
    if (m.completed == 0) {
      out += "# rate " + RateLabel(p.request_rate) + ": every request failed\n";
      continue;
    }
    std::snprintf(line, sizeof line, "%s %.4f %.4f %.4f %.4f %.4f\n",
                  RateLabel(p.request_rate).c_str(), m.output_throughput, m.ttft_ms.median,
                  m.ttft_ms.p99, m.tpot_ms.median, m.tpot_ms.p99);
    out += line;
  }
  return out;
}

std::string GnuplotScript(const PlotFiles& files, const std::string& title) {
  const std::string data = GnuplotQuoted(Absolute(files.data_path));
  std::string s;
  s += "# Written by tessera bench serve --plot; redraw with: gnuplot " + files.script_path + "\n";
  s += "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n";
  s += "  set terminal pngcairo size 1200,500 noenhanced\n";
  s += "} else {\n";
  s += "  set terminal png size 1200,500 noenhanced\n";
  s += "}\n";
  s += "set output " + GnuplotQuoted(Absolute(files.png_path)) + "\n";
  s += "set multiplot layout 1,2 title " + GnuplotQuoted(title) + "\n";
  s += "set grid\n";
  s += "set key top left\n";
  s += "set xlabel 'output throughput (tok/s)'\n";
  s += "set offsets graph 0.05, graph 0.05, graph 0.1, graph 0.05\n";
  s += "set title 'Time to first token (point labels: request rate, req/s)'\n";
  s += "set ylabel 'TTFT (ms)'\n";
  s += "plot " + data + " using 2:3 with linespoints pt 7 title 'p50', \\\n";
  s += "     " + data + " using 2:4 with linespoints pt 5 title 'p99', \\\n";
  s += "     " + data + " using 2:4:1 with labels offset 0,1 notitle\n";
  s += "set title 'Time per output token (excl. 1st)'\n";
  s += "set ylabel 'TPOT (ms)'\n";
  s += "plot " + data + " using 2:5 with linespoints pt 7 title 'p50', \\\n";
  s += "     " + data + " using 2:6 with linespoints pt 5 title 'p99', \\\n";
  s += "     " + data + " using 2:6:1 with labels offset 0,1 notitle\n";
  s += "unset multiplot\n";
  return s;
}

bool GnuplotOnPath() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::string_view rest = path;
  while (true) {
    const size_t colon = rest.find(':');
    const std::filesystem::path dir(rest.substr(0, colon));
    const std::filesystem::path candidate = (dir.empty() ? "." : dir) / "gnuplot";
    if (::access(candidate.c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) return false;
    rest.remove_prefix(colon + 1);
  }
}

Status WritePlot(std::span<const SweepPoint> points, const PlotFiles& files,
                 const std::string& title) {
  bool any_completed = false;
  for (const SweepPoint& p : points) any_completed |= p.metrics.completed > 0;
  if (!any_completed) {
    return UnavailableError("--plot: no rate had a successful request; nothing to plot");
  }
  TESSERA_RETURN_IF_ERROR(WriteFile(files.data_path, GnuplotData(points)));
  TESSERA_RETURN_IF_ERROR(WriteFile(files.script_path, GnuplotScript(files, title)));
  const std::string written = " (wrote " + files.data_path + " and " + files.script_path + ")";
  if (!GnuplotOnPath()) {
    return UnavailableError(
        "--plot needs gnuplot, which is not on PATH; install it (Debian: "
        "apt-get install gnuplot-nox) and run `gnuplot " +
        files.script_path + "`" + written);
  }
  std::string script = files.script_path;
  char arg0[] = "gnuplot";
  char* argv[] = {arg0, script.data(), nullptr};
  pid_t pid = 0;
  const int err = ::posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv, environ);
  if (err != 0) {
    return UnavailableError(std::string("could not run gnuplot: ") + std::strerror(err) + written);
  }
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) return InternalError("waitpid on gnuplot failed" + written);
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return InternalError("gnuplot " + files.script_path + " failed (" +
                         (WIFEXITED(wstatus) ? "exit " + std::to_string(WEXITSTATUS(wstatus))
                                             : std::string("killed by a signal")) +
                         ")" + written);
  }
  return Status::Ok();
}

}  // namespace tessera::bench
