// Eviction that never waits (issue 13 item 5): the GPU free-room watermarks. Each test
// failed before the watermark step existed.
#include <gtest/gtest.h>

#include "cache_harness.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::seq;
using testing::small_config;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

// 64 GPU pages (4 live snapshot slots): the shares are low = 16 pages, high = 32 pages.
// A request's step here takes 9 pages (its 4-page allocation and its 5-page snapshot), so
// the room kept free is that need, 9 and 18 pages, below the shares.
CacheConfig watermark_config(double low, double high) {
  CacheConfig c = small_config();
  c.gpu_pages = 64;
  c.host_pages = 256;
  c.host_snapshot_slots = 32;
  c.gpu_free_low_watermark = low;
  c.gpu_free_high_watermark = high;
  return c;
}

// Prompt i: 16 tokens (4 pages) of its own, then the token that is always computed.
std::vector<Token> prompt(int i) {
  return seq({{1000 * (i + 1), 16}, {7, 1}});
}

struct ChurnRun {
  CacheStats stats;
  std::size_t max_free_after_settle = 0;
  std::size_t reused = 0;
  std::size_t max_in_flight = 0;  ///< copies in flight when a request ended (not waited for)
};

// Twenty distinct requests through a GPU pool that holds six of them (5 KV pages and a 5-page
// snapshot each), each allocating its 4 pages at once (one prefill chunk) and materializing
// its snapshot (a step of 9 pages, below the low watermark's share), the copies landing
// between requests (a scheduler's step). Then the first ones again: their bytes
// come back from host exactly.
ChurnRun churn(Harness& h) {
  ChurnRun out;
  const std::size_t snap_at[] = {16};
  for (int i = 0; i < 20; ++i) {
    const auto p = prompt(i);
    const Harness::Served s = h.serve(p, snap_at, 4);
    EXPECT_EQ(s.error, "") << "request " << i;
    EXPECT_TRUE(s.bytes_ok) << "request " << i;
    EXPECT_EQ(h.cache->check_invariants(), "") << "request " << i;
    out.max_in_flight = std::max(out.max_in_flight, h.cache->in_flight());
    h.settle();
    EXPECT_EQ(h.cache->check_invariants(), "") << "request " << i;
    if (i >= 8) {  // the pool has been full since request 6
      out.max_free_after_settle =
          std::max<std::size_t>(out.max_free_after_settle, h.cache->occupancy().gpu_pages_free);
    }
  }
  for (int i = 0; i < 4; ++i) {
    const Harness::Served s = h.serve(prompt(i), snap_at, 4);
    EXPECT_EQ(s.error, "");
    EXPECT_TRUE(s.bytes_ok) << "request " << i << " again";
    out.reused += s.cached;
    h.settle();
  }
  out.stats = h.cache->stats();
  return out;
}

TEST(Watermarks, WithoutThemTheWorkloadWaitsInsideAlloc) {
  Harness h(watermark_config(0.0, 0.0));
  const ChurnRun r = churn(h);
  EXPECT_GT(r.stats.alloc_copy_waits, 0u);
  EXPECT_GT(r.stats.alloc_wait_bytes, 0u);
  EXPECT_EQ(r.stats.background_evictions, 0u);
}

TEST(Watermarks, AllocationsBelowTheHighWatermarkNeverWait) {
  Harness h(watermark_config(0.25, 0.5));
  const ChurnRun r = churn(h);
  EXPECT_EQ(r.stats.alloc_copy_waits, 0u);
  EXPECT_EQ(r.stats.alloc_wait_bytes, 0u);
  EXPECT_GT(r.stats.background_evictions, 0u);
  EXPECT_GT(r.stats.kv_pages_demoted, 0u);
  EXPECT_GT(r.stats.snapshots_demoted, 0u);
  // Reuse is not lost: what was demoted ahead comes back from host.
  EXPECT_EQ(r.reused, 4u * 16u);
  // Only down to the high watermark (2 x 9 pages), give or take the last victim's pages.
  EXPECT_LE(r.max_free_after_settle, 18u + 5u);
}

TEST(Watermarks, TheStepStartsCopiesAndLeavesThemInFlight) {
  Harness h(watermark_config(0.25, 0.5));
  const ChurnRun r = churn(h);
  // The demotions were submitted and left running when the request ended: nobody waited.
  EXPECT_GT(r.max_in_flight, 0u);
  EXPECT_EQ(r.stats.alloc_copy_waits, 0u);
  // After the copies land the room is above the low watermark: what the running requests
  // may ask for before the next step (one request taking 9 pages a step here, 2 x that with
  // the high watermark, plus the last victim's pages), not the configured 50% of the pool.
  EXPECT_GE(h.cache->occupancy().gpu_pages_free, 9u);
  EXPECT_LE(r.max_free_after_settle, 18u + 5u);
  EXPECT_GE(h.cache->occupancy().gpu_slots_free, 1u);
}

TEST(Watermarks, AllocationLargerThanTheFreeRoomStillWaitsAndIsCounted) {
  Harness h(watermark_config(0.25, 0.5));
  const std::size_t snap_at[] = {16};
  for (int i = 0; i < 8; ++i) ASSERT_EQ(h.serve(prompt(i), snap_at, 4).error, "");
  h.settle();
  const std::size_t free = h.cache->occupancy().gpu_pages_free;
  ASSERT_LT(free, 64u);
  auto pages = h.cache->alloc_pages(h.side_lock(), free + 4);  // above the free room
  ASSERT_TRUE(pages);
  EXPECT_GT(h.cache->stats().alloc_copy_waits, 0u);
  ASSERT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), *pages));
}

TEST(Watermarks, BadWatermarksAreRejectedByName) {
  CacheConfig c = small_config();
  c.gpu_free_low_watermark = -0.1;
  EXPECT_NE(c.validate().message().find("gpu_free_low_watermark"), std::string::npos);
  c.gpu_free_low_watermark = 1.0;
  EXPECT_NE(c.validate().message().find("gpu_free_low_watermark"), std::string::npos);
  c.gpu_free_low_watermark = 0.3;
  c.gpu_free_high_watermark = 0.2;  // below low
  EXPECT_NE(c.validate().message().find("gpu_free_high_watermark"), std::string::npos);
  c.gpu_free_high_watermark = 1.0;
  EXPECT_NE(c.validate().message().find("gpu_free_high_watermark"), std::string::npos);
  c.gpu_free_high_watermark = 0.5;
  EXPECT_TRUE(c.validate());
  EXPECT_EQ(c.low_watermark(32), 10u);
  EXPECT_EQ(c.high_watermark(32), 16u);
}

}  // namespace
}  // namespace radixtier
