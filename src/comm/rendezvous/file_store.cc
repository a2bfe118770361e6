#include "comm/rendezvous/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "base/unique_fd.h"
#include "comm/rendezvous/hash_store.h"

namespace tessera::comm {
namespace {

Status WriteAll(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return InternalError(std::string("file store write: ") + std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

Result<std::unique_ptr<FileStore>> FileStore::Open(const std::string& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) return InternalError("cannot create store directory " + directory + ": " + ec.message());
  return std::unique_ptr<FileStore>(new FileStore(directory));
}

FileStore::~FileStore() {
  if (remove_after_ <= 0) return;
  Result<int64_t> left = Add("store/ranks_left", 1);
  if (left.ok() && *left >= remove_after_) {
    std::error_code ec;
    std::filesystem::remove_all(directory_, ec);
  }
}

std::string FileStore::PathFor(std::string_view key) const {
  // Keys contain '/'; encode every byte outside [A-Za-z0-9._-] as %XX.
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      name += buf;
    }
  }
  return directory_ + "/" + name;
}

Status FileStore::Set(std::string_view key, std::span<const uint8_t> value) {
  if (key.size() > kMaxStoreKeyBytes / 4 || value.size() > kMaxStoreValueBytes) {
    return InvalidArgumentError("store key or value too large");
  }
  std::string path = PathFor(key);
  std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." +
                     std::to_string(g_temp_counter.fetch_add(1));
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return InternalError("cannot write " + temp + ": " + std::strerror(errno));
  TESSERA_RETURN_IF_ERROR(WriteAll(fd.get(), value.data(), value.size()));
  fd.Reset();
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    return InternalError("cannot rename " + temp + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> FileStore::ReadIfExists(const std::string& path, bool* exists) const {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    *exists = false;
    if (errno == ENOENT) return std::vector<uint8_t>();
    return InternalError("cannot read " + path + ": " + std::strerror(errno));
  }
  *exists = true;
  std::vector<uint8_t> data;
  uint8_t buf[65536];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return InternalError("cannot read " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    if (data.size() + n > kMaxStoreValueBytes) return InvalidArgumentError(path + " too large");
    data.insert(data.end(), buf, buf + n);
  }
  return data;
}

Result<std::vector<uint8_t>> FileStore::Get(std::string_view key, Deadline deadline) {
  std::string path = PathFor(key);
  int sleep_us = 50;
  while (true) {
    bool exists = false;
    TESSERA_ASSIGN_OR_RETURN(auto data, ReadIfExists(path, &exists));
    if (exists) return data;
    if (deadline.Expired()) {
      return DeadlineExceededError("store key '" + std::string(key) + "' was never set (" +
                                   directory_ + ")");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 5000);
  }
}

Result<int64_t> FileStore::Add(std::string_view key, int64_t delta) {
  std::string path = PathFor(key);
  std::string lock_path = directory_ + "/.lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return InternalError("cannot open " + lock_path + ": " + std::strerror(errno));
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return InternalError("flock " + lock_path + ": " + std::strerror(errno));
  }
  bool exists = false;
  TESSERA_ASSIGN_OR_RETURN(auto data, ReadIfExists(path, &exists));
  TESSERA_ASSIGN_OR_RETURN(int64_t current, ParseCounter(data, key));
  int64_t sum = current + delta;
  TESSERA_RETURN_IF_ERROR(Set(key, EncodeCounter(sum)));
  return sum;  // the lock is released when `lock` closes
}

}  // namespace tessera::comm
