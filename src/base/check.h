// TESSERA_CHECK: aborts on a bug or broken invariant with file, line, the failed
// condition and any streamed values. Layer: base. Never for expected failures
// (those return Status, see status.h).
#pragma once

#include <sstream>
#include <string>

namespace tessera::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `TESSERA_CHECK(x) << ...` discard the stream in the success branch.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace tessera::internal

#define TESSERA_CHECK(cond)                 \
  (__builtin_expect(!!(cond), 1))           \
      ? (void)0                             \
      : ::tessera::internal::Voidify() &    \
            ::tessera::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define TESSERA_CHECK_OP(a, op, b) \
  TESSERA_CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define TESSERA_CHECK_EQ(a, b) TESSERA_CHECK_OP(a, ==, b)
#define TESSERA_CHECK_NE(a, b) TESSERA_CHECK_OP(a, !=, b)
#define TESSERA_CHECK_LT(a, b) TESSERA_CHECK_OP(a, <, b)
#define TESSERA_CHECK_LE(a, b) TESSERA_CHECK_OP(a, <=, b)
#define TESSERA_CHECK_GT(a, b) TESSERA_CHECK_OP(a, >, b)
#define TESSERA_CHECK_GE(a, b) TESSERA_CHECK_OP(a, >=, b)
