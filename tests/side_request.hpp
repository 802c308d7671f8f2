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

}  // namespace radixtier::testing
