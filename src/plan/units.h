// Human-readable figures for the planner's tables and messages: bytes in binary
// units ("8 MiB", "1.5 GiB"), times ("3.2 ms"), rates. Layer: plan.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::plan {

std::string FormatBytes(double bytes);      // "0 B", "512 B", "8 KiB", "1.50 GiB"
std::string FormatSeconds(double seconds);  // "850 ns", "12.3 us", "4.56 ms", "1.23 s"
std::string FormatCount(double value);      // "1.23e+09" style for big numbers, plain otherwise

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace tessera::plan
