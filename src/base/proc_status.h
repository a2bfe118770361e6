// ProcStatusBytes: one "kB" field of /proc/self/status (VmSize, VmRSS, VmHWM, …) in
// bytes, for memory reports and tests. Layer: base.
#pragma once

#include <cstdint>
#include <string_view>

namespace tessera {

// The field's value in bytes; 0 when there is no /proc or no such field.
int64_t ProcStatusBytes(std::string_view field);

}  // namespace tessera
