// The shared tier's config for the unit tests over MemorySharedStore (tests/shared_tier_test.cpp,
// tests/shared/shared_tier_safety_test.cpp): the cache's geometry, a small minimum and chunk so
// that a 200-byte snapshot goes in 4 chunks, recompute always dearer than a fetch.
#pragma once

#include <string>
#include <utility>

#include "radixtier/config.hpp"
#include "radixtier/shared/shared_tier.hpp"

namespace radixtier::testing {

inline shared::SharedTierConfig memory_tier_config(const CacheConfig& c, std::string model_id) {
  shared::SharedTierConfig t;
  t.model.model_id = std::move(model_id);
  t.model.weights_version = "v1";
  t.model.kv_dtype = "f32";
  t.model.page_size = c.page_size;
  t.model.page_bytes = c.page_bytes;
  t.model.snapshot_bytes = c.snapshot_bytes;
  t.min_tokens = 4;
  t.chunk_bytes = 64;          // a 200-byte snapshot in 4 chunks
  t.prefill_tokens_per_s = 1;  // recompute is always dearer here
  return t;
}

}  // namespace radixtier::testing
