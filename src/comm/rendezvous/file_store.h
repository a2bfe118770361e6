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

  // The last of `num_ranks` stores of a job to be destroyed removes the directory
  // (each counts itself out), so a finished job leaves nothing in /tmp.
  void RemoveWhenAllLeft(int num_ranks) { remove_after_ = num_ranks; }
  ~FileStore() override;

 private:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {}
  std::string PathFor(std::string_view key) const;
  Result<std::vector<uint8_t>> ReadIfExists(const std::string& path, bool* exists) const;

  std::string directory_;
  int remove_after_ = 0;
};

}  // namespace tessera::comm
