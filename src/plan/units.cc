#include "plan/units.h"

#include <cmath>
#include <cstdio>

namespace tessera::plan {

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  double value = bytes;
  while (std::fabs(value) >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char buf[64];
  if (unit == 0 || value == std::floor(value)) {
    std::snprintf(buf, sizeof(buf), "%.0f %s", value, units[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g %s", value, units[unit]);
  }
  return buf;
}

std::string FormatSeconds(double seconds) {
  char buf[64];
  const double a = std::fabs(seconds);
  if (a == 0) {
    std::snprintf(buf, sizeof(buf), "0 s");
  } else if (a < 1e-6) {
    std::snprintf(buf, sizeof(buf), "%.3g ns", seconds * 1e9);
  } else if (a < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.3g us", seconds * 1e6);
  } else if (a < 1) {
    std::snprintf(buf, sizeof(buf), "%.3g ms", seconds * 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g s", seconds);
  }
  return buf;
}

std::string FormatCount(double value) {
  char buf[64];
  if (std::fabs(value) >= 1e7) {
    std::snprintf(buf, sizeof(buf), "%.3g", value);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f", value);
  }
  return buf;
}

}  // namespace tessera::plan
