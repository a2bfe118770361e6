// Helpers for the engine tests: where the shared test models are, loading them,
// and running a batch of sequences through a ModelRunner with a given prefill
// chunk size. Layer: tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "engine/loaded_model.h"
#include "engine/model_runner.h"
#include "kv/block_allocator.h"
#include "kv/block_table.h"
#include "kv/kv_cache.h"

namespace tessera::engine::testing {

inline std::string ModelsDir() { return std::string(TESSERA_SHARED_DIR) + "/models"; }
inline std::string ModelPath(const std::string& name) { return ModelsDir() + "/" + name; }

inline bool HaveModel(const std::string& name) { return std::filesystem::exists(ModelPath(name)); }

// A KV cache + allocator sized for `num_tokens` tokens in total.
struct TestCache {
  TestCache(const model::ModelConfig& c, kernels::KvType type, int64_t num_tokens,
            int32_t block_size = 16)
      : cache(std::move(kv::KvCache::Create(
                            {.num_layers = static_cast<int32_t>(c.num_layers),
                             .num_kv_heads = static_cast<int32_t>(c.num_kv_heads),
                             .head_dim = static_cast<int32_t>(c.head_dim),
                             .block_size = block_size,
                             .type = type},
                            static_cast<int32_t>(kv::BlocksForTokens(num_tokens, block_size))))
                  .value()),
        allocator(cache.num_blocks()) {}
  kv::KvCache cache;
  kv::BlockAllocator allocator;
};

}  // namespace tessera::engine::testing
