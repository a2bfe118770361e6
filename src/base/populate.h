// PopulateForWrite: maps the pages of a range of this process's memory now rather
// than at first touch. Layer: base; used for the shared-memory rings and the KV
// cache. Thread-safe.
//
// A fresh page costs a fault when first written (~12 µs each under the Zen 5 VM's
// hypervisor, as measured); one madvise(MADV_POPULATE_WRITE) maps a range for about
// a tenth of that per page. Contents are unchanged. The range is widened to whole
// pages. Failure (a kernel older than 5.14, memory short) is harmless: the pages then
// fault in at first touch as before. Returns whether the pages were mapped.
#pragma once

#include <cstddef>

namespace tessera {

bool PopulateForWrite(void* addr, size_t bytes);

}  // namespace tessera
