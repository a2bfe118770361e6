#include "base/status.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

Result<int> ParsePositive(int x) {
  if (x <= 0) return InvalidArgumentError("x must be positive, got " + std::to_string(x));
  return x;
}

Result<int> Doubled(int x) {
  TESSERA_ASSIGN_OR_RETURN(int value, ParsePositive(x));
  return value * 2;
}

Status CheckBoth(int a, int b) {
  TESSERA_RETURN_IF_ERROR(ParsePositive(a).status());
  TESSERA_RETURN_IF_ERROR(ParsePositive(b).status().WithContext("second argument"));
  return Status::Ok();
}

TEST(StatusTest, ResultCarriesValueOrError) {
  EXPECT_EQ(*Doubled(4), 8);
  Result<int> bad = Doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().ToString(), "InvalidArgument: x must be positive, got -1");
}

TEST(StatusTest, ReturnIfErrorAddsContext) {
  EXPECT_TRUE(CheckBoth(1, 2).ok());
  Status s = CheckBoth(1, 0);
  EXPECT_EQ(s.message(), "second argument: x must be positive, got 0");
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  Result<int> bad = ParsePositive(0);
  EXPECT_DEATH((void)bad.value(), "x must be positive");
}

TEST(StatusDeathTest, CheckPrintsValues) {
  int a = 3, b = 4;
  EXPECT_DEATH(TESSERA_CHECK_EQ(a, b) << "context", "CHECK failed: .*3 vs 4.*context");
}

}  // namespace
}  // namespace tessera
