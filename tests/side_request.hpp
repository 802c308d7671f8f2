// GoogleTest helpers shared by the cache's unit tests: a side request (Harness::side_lock())
// takes and returns GPU pages and snapshot slots to put the cache under pressure.
#pragma once

#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "cache_harness.hpp"

namespace radixtier::testing {

inline std::vector<GpuPageId> take_pages(Harness& h, std::size_t n) {
  auto r = h.cache->alloc_pages(h.side_lock(), n);
  EXPECT_TRUE(r) << r.status().to_string();
  return r ? *r : std::vector<GpuPageId>{};
}
inline GpuSlotId take_slot(Harness& h) {
  auto r = h.cache->alloc_snapshot_slot(h.side_lock());
  EXPECT_TRUE(r) << r.status().to_string();
  return r ? *r : GpuSlotId();
}
inline void give_pages(Harness& h, std::span<const GpuPageId> pages) {
  EXPECT_TRUE(h.cache->free_pages(h.side_lock(), pages));
}
inline void give_slot(Harness& h, GpuSlotId slot) {
  EXPECT_TRUE(h.cache->free_snapshot_slot(h.side_lock(), slot));
}

/// Pushes the KV of the leaf below `prompt`'s first `keep` tokens and that leaf's snapshot from
/// the GPU pool to host (issue 21: cached GPU snapshots are pages of the one GPU pool, so a
/// page count no longer says which kind leaves). A request pins [0, keep) meanwhile.
inline void demote_leaf_below(Harness& h, std::span<const Token> prompt, std::size_t keep) {
  auto hold = h.cache->admit(prompt.first(keep + 1));
  ASSERT_TRUE(hold) << hold.status().to_string();
  ASSERT_EQ(hold->cached_tokens, keep);
  auto freed = h.cache->evict({1, 1, Tier::kGpu});
  ASSERT_TRUE(freed) << freed.status().to_string();
  EXPECT_GE(freed->kv_pages, 1u);
  EXPECT_EQ(freed->snapshots, 1u);
  ASSERT_TRUE(h.cache->release(hold->lock));
}

}  // namespace radixtier::testing
