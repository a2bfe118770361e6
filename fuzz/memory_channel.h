// A Channel over bytes in memory, for the fuzz targets of the comm decoders: reads
// hand out `input` in pieces of the sizes `chunks` gives (so every split of the
// stream is tried), then report the stream closed; writes are kept in `written`,
// each accepting as many bytes as `accept` gives (so partial writes are tried).
// With `close_at_end` false the stream stays open with nothing more to read.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "comm/transport/channel.h"

namespace tessera::fuzz {

class MemoryChannel : public comm::Channel {
 public:
  MemoryChannel(std::vector<uint8_t> input, std::function<size_t()> chunks,
                std::function<size_t()> accept, bool close_at_end = true)
      : input_(std::move(input)),
        chunks_(std::move(chunks)),
        accept_(std::move(accept)),
        close_at_end_(close_at_end) {}

  Result<size_t> Write(const void* data, size_t size) override {
    size_t n = std::min(size, accept_());
    const uint8_t* p = static_cast<const uint8_t*>(data);
    written.insert(written.end(), p, p + n);
    return n;
  }
  Result<std::span<const uint8_t>> Peek() override {
    if (visible_ == read_) {
      if (read_ == input_.size()) {
        if (!close_at_end_) return std::span<const uint8_t>();
        return UnavailableError("closed the connection");
      }
      visible_ = std::min(input_.size(), read_ + std::max<size_t>(1, chunks_()));
    }
    return std::span<const uint8_t>(input_.data() + read_, visible_ - read_);
  }
  void Consume(size_t size) override { read_ += size; }
  std::string Describe() const override { return "memory"; }

  std::vector<uint8_t> written;

 private:
  std::vector<uint8_t> input_;
  std::function<size_t()> chunks_;
  std::function<size_t()> accept_;
  bool close_at_end_;
  size_t read_ = 0;
  size_t visible_ = 0;
};

}  // namespace tessera::fuzz
