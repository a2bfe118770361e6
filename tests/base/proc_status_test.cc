#include "base/proc_status.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>

namespace tessera {
namespace {

// The fields read back in bytes and move with the process; unknown ones are 0.
TEST(ProcStatusTest, ReadsFieldsInBytesAndUnknownOnesAsZero) {
  const int64_t size = ProcStatusBytes("VmSize");
  ASSERT_GT(size, 0);
  EXPECT_EQ(size % 1024, 0);
  EXPECT_GE(size, ProcStatusBytes("VmRSS"));
  EXPECT_GT(ProcStatusBytes("VmHWM"), 0);
  EXPECT_EQ(ProcStatusBytes("VmNoSuchField"), 0);
  EXPECT_EQ(ProcStatusBytes("Vm"), 0);  // a prefix of field names is not a field

  // 64 MiB more address space shows in VmSize.
  constexpr size_t kBytes = size_t{64} << 20;
  void* block = mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(block, MAP_FAILED);
  EXPECT_GE(ProcStatusBytes("VmSize"), size + static_cast<int64_t>(kBytes) - (int64_t{1} << 20));
  munmap(block, kBytes);
}

}  // namespace
}  // namespace tessera
