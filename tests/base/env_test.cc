#include "base/env.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace tessera {
namespace {

TEST(EnvTest, ParsesSizesWithSuffixes) {
  EXPECT_EQ(ParseSizeBytes("17"), 17);
  EXPECT_EQ(ParseSizeBytes("4k"), 4096);
  EXPECT_EQ(ParseSizeBytes("256M"), int64_t{256} << 20);
  EXPECT_EQ(ParseSizeBytes("2G"), int64_t{2} << 30);
  EXPECT_FALSE(ParseSizeBytes(""));
  EXPECT_FALSE(ParseSizeBytes("12x"));
  EXPECT_FALSE(ParseSizeBytes("M"));
  EXPECT_FALSE(ParseSizeBytes("99999999999999999999G"));
}

TEST(EnvTest, ReadsKnobsWithDefaults) {
  ::setenv("TESSERA_TEST_KNOB", "8k", 1);
  EXPECT_EQ(*EnvIntOr("TESSERA_TEST_KNOB", 1), 8192);
  ::unsetenv("TESSERA_TEST_KNOB");
  EXPECT_EQ(*EnvIntOr("TESSERA_TEST_KNOB", 5), 5);
  ::setenv("TESSERA_TEST_FLAG", "on", 1);
  EXPECT_TRUE(*EnvBoolOr("TESSERA_TEST_FLAG", false));
  ::unsetenv("TESSERA_TEST_FLAG");
  EXPECT_FALSE(*EnvBoolOr("TESSERA_TEST_FLAG", false));
}

TEST(EnvTest, MalformedKnobIsAnErrorNamingIt) {
  ::setenv("TESSERA_TEST_BAD", "lots", 1);
  Result<int64_t> number = EnvIntOr("TESSERA_TEST_BAD", 1);
  ASSERT_FALSE(number.ok());
  EXPECT_EQ(number.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(number.status().message().find("TESSERA_TEST_BAD='lots' is not an integer"),
            std::string::npos)
      << number.status().ToString();
  Result<bool> flag = EnvBoolOr("TESSERA_TEST_BAD", false);
  ASSERT_FALSE(flag.ok());
  EXPECT_NE(flag.status().message().find("TESSERA_TEST_BAD='lots' is not a boolean"),
            std::string::npos)
      << flag.status().ToString();
  ::unsetenv("TESSERA_TEST_BAD");
}

}  // namespace
}  // namespace tessera
