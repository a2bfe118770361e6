#include "base/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace tessera {
namespace {

TEST(MappedFileTest, MapsFileContents) {
  std::string path = ::testing::TempDir() + "/mapped_file_test.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello tessera";
  }
  Result<MappedFile> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->size_bytes(), 13u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file->data()), 5), "hello");
  MappedFile moved = std::move(file).value();
  EXPECT_EQ(moved.size_bytes(), 13u);
  std::remove(path.c_str());
}

TEST(MappedFileTest, MissingFileIsNotFound) {
  Result<MappedFile> file = MappedFile::Open("/nonexistent/tessera/file.gguf");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/tessera/file.gguf"), std::string::npos);
}

TEST(MappedFileTest, DirectoryIsRefused) {
  Result<MappedFile> file = MappedFile::Open("/tmp");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
