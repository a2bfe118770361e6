// `tessera bench serve --plot FILE.png`: latency percentiles against output
// throughput over a request-rate sweep, drawn by gnuplot. Writes a data file and a
// gnuplot script next to FILE (FILE.dat, FILE.gp, so the plot can be redrawn or
// edited) and runs `gnuplot FILE.gp`. Layer: bench; used by the CLI.
#pragma once

#include <span>
#include <string>

#include "base/status.h"
#include "bench/sweep.h"

namespace tessera::bench {

struct PlotFiles {
  std::string png_path;
  std::string data_path;    // png_path with ".png" replaced by ".dat" (appended otherwise)
  std::string script_path;  // likewise ".gp"
};
PlotFiles PlotFilesFor(const std::string& png_path);

// Whitespace-separated columns, one row per rate with completed requests:
// rate label, output tok/s, TTFT p50, TTFT p99, TPOT p50, TPOT p99 (ms). Rates where
// every request failed become comment lines.
std::string GnuplotData(std::span<const SweepPoint> points);

// Two panels side by side (TTFT, TPOT): p50 and p99 in ms (y) against output tok/s
// (x), one point per rate, labelled with the rate. `title` heads the image.
std::string GnuplotScript(const PlotFiles& files, const std::string& title);

// Whether `gnuplot` is an executable on PATH.
bool GnuplotOnPath();

// Writes the data and script files and runs gnuplot on the script. Unavailable when
// no rate completed a request (nothing written) or gnuplot is not on PATH (the two
// files are still written); Internal when gnuplot fails; NotFound when a file
// cannot be created.
Status WritePlot(std::span<const SweepPoint> points, const PlotFiles& files,
                 const std::string& title);

}  // namespace tessera::bench
