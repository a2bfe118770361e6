// FileStore: a Store in a directory that every rank can see (one file per key,
// written atomically by rename; counters under flock). For local tests and for
// jobs started by mpirun/srun without a TCP rendezvous. Layer: comm. Thread-safe
// and process-safe.
#pragma once

#include <memory>
#include <string>

#include "comm/rendezvous/store.h"

namespace tessera::comm {

class FileStore : public Store {
 public:
  // Creates `directory` if needed.
  static Result<std::unique_ptr<FileStore>> Open(const std::string& directory);

  Status Set(std::string_view key, std::span<const uint8_t> value) override;
  Result<std::vector<uint8_t>> Get(std::string_view key, Deadline deadline) override;
  Result<int64_t> Add(std::string_view key, int64_t delta) override;

  const std::string& directory() const { return directory_; }

 private:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {}
  std::string PathFor(std::string_view key) const;
  Result<std::vector<uint8_t>> ReadIfExists(const std::string& path, bool* exists) const;

  std::string directory_;
};

}  // namespace tessera::comm
