// Retention priorities (issue 15 item 9): eviction honours a request's priority before value
// and recency, on every order and with every eviction policy.
#include <gtest/gtest.h>

#include "cache_harness.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "side_request.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::seq;
using testing::small_config;
using testing::take_pages;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

CacheConfig config(SnapshotEviction e) {
  CacheConfig c = small_config();
  c.snapshot_eviction = e;
  return c;
}

RequestOptions at(RetentionPriority p) {
  return RequestOptions{kDefaultNamespace, p};
}

const SnapshotEviction kAll[] = {SnapshotEviction::kLru, SnapshotEviction::kCostAware,
                                 SnapshotEviction::kUtility};

// The high-priority prefix is older and was used once, the low-priority one is newer and was
// used twice: by recency and by frequency the high one would leave first.
TEST(Priority, LowPriorityKvLeavesTheGpuFirstWhateverItsRecency) {
  for (SnapshotEviction e : kAll) {
    SCOPED_TRACE(to_string(e));
    Harness h(config(e));
    const auto hi = seq({{1, 8}, {50, 1}});
    const auto lo = seq({{100, 8}, {60, 1}});
    const std::size_t snaps[] = {8};
    h.request_options = at(80);
    ASSERT_EQ(h.serve(hi, snaps).error, "");
    h.request_options = at(10);
    ASSERT_EQ(h.serve(lo, snaps).error, "");
    ASSERT_EQ(h.serve(lo, snaps).cached, 8u);
    EXPECT_EQ(h.cache->inspect(hi).at(0).kv_priority, 80);
    EXPECT_EQ(h.cache->inspect(lo).at(0).kv_priority, 10);
    // KV and snapshots share the GPU pool: room for 2 + 5 more pages takes both of lo's
    // (its KV and its 5-page snapshot), none of hi's.
    auto room = take_pages(h, h.cache->occupancy().gpu_pages_free + 2 + 5);
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->inspect(lo).at(0).kv, Residency::kHost);
    EXPECT_EQ(h.cache->inspect(lo).at(0).snapshot, Residency::kHost);
    EXPECT_EQ(h.cache->inspect(hi).at(0).kv, Residency::kGpu);
    EXPECT_EQ(h.cache->inspect(hi).at(0).snapshot, Residency::kGpu);
    ASSERT_TRUE(h.cache->free_pages(h.side_lock(), room));
  }
}

TEST(Priority, LowPrioritySnapshotLeavesTheGpuFirst) {
  for (SnapshotEviction e : kAll) {
    SCOPED_TRACE(to_string(e));
    Harness h(config(e));
    const auto hi = seq({{1, 8}, {50, 1}});
    const auto lo = seq({{100, 8}, {60, 1}});
    const auto other = seq({{200, 8}, {70, 1}});
    const std::size_t snaps[] = {8};
    h.request_options = at(90);
    ASSERT_EQ(h.serve(hi, snaps).error, "");
    h.request_options = at(kMinPriority);
    ASSERT_EQ(h.serve(lo, snaps).error, "");
    h.request_options = at(kDefaultPriority);
    ASSERT_EQ(h.serve(other, snaps).error, "");
    // Three snapshots in GPU pages: the one evicted is the lowest priority's.
    auto freed = h.cache->evict({0, 1, Tier::kGpu});
    ASSERT_TRUE(freed);
    EXPECT_EQ(freed->snapshots, 1u);
    ASSERT_INVARIANTS(h);
    EXPECT_NE(h.cache->inspect(lo).at(0).snapshot, Residency::kGpu);
    EXPECT_EQ(h.cache->inspect(hi).at(0).snapshot, Residency::kGpu);
    EXPECT_EQ(h.cache->inspect(other).at(0).snapshot, Residency::kGpu);
  }
}

TEST(Priority, LowPriorityLeavesTheHostPoolFirst) {
  CacheConfig c = small_config();
  c.host_pages = 4;  // two 2-page nodes, then full
  c.host_snapshot_slots = 2;
  Harness h(c);
  const auto hi = seq({{1, 8}, {50, 1}});
  const auto lo = seq({{100, 8}, {60, 1}});
  const auto third = seq({{200, 8}, {70, 1}});
  const std::size_t snaps[] = {8};
  h.request_options = at(70);
  ASSERT_EQ(h.serve(hi, snaps).error, "");
  h.request_options = at(20);
  ASSERT_EQ(h.serve(lo, snaps).error, "");
  h.request_options = at(kDefaultPriority);
  ASSERT_EQ(h.serve(third, snaps).error, "");
  // Everything to host in one demotion batch, into a host pool with room for two of the
  // three nodes: the low-priority one is the one left out, although it is demoted first (its
  // planned copy must not keep the host room from the higher ones demoted after it).
  // Room for all three nodes (KV 2 pages + snapshot 5 pages each) in one allocation.
  auto room = take_pages(h, h.cache->occupancy().gpu_pages_free + 3 * (2 + 5));
  ASSERT_EQ(room.size(), c.gpu_pages);
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), room));
  h.cache->drain();
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->match(lo).usable_tokens, 0u);
  EXPECT_EQ(h.cache->match(hi).usable_tokens, 8u);
  EXPECT_EQ(h.cache->match(third).usable_tokens, 8u);
  EXPECT_EQ(h.cache->inspect(hi).at(0).kv, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(third).at(0).snapshot, Residency::kHost);
}

// The same with more nodes than the host holds, by priority in the opposite order of their
// recency, over several batches: after each batch the host keeps the highest priorities.
TEST(Priority, EachDemotionBatchKeepsTheHighestPrioritiesOnHost) {
  for (SnapshotEviction e : kAll) {
    SCOPED_TRACE(to_string(e));
    CacheConfig c = config(e);
    c.host_pages = 6;  // three nodes' KV (2 pages each), three snapshots' worth below
    c.host_snapshot_slots = 3;
    Harness h(c);
    std::vector<std::vector<Token>> prompts;
    const std::size_t snaps[] = {8};
    for (int i = 0; i < 4; ++i) {
      prompts.push_back(seq({{1000 + 100 * i, 8}, {50 + i, 1}}));
      h.request_options = at(static_cast<RetentionPriority>(90 - 20 * i));  // newest lowest
      ASSERT_EQ(h.serve(prompts.back(), snaps).error, "");
    }
    // Four nodes demoted in one batch into room for three: the lowest priority one is out.
    auto room = take_pages(h, h.cache->occupancy().gpu_pages_free + 4 * (2 + 5));
    ASSERT_EQ(room.size(), c.gpu_pages);
    ASSERT_TRUE(h.cache->free_pages(h.side_lock(), room));
    h.cache->drain();
    ASSERT_INVARIANTS(h);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(h.cache->match(prompts[i]).usable_tokens, 8u) << i;
    EXPECT_EQ(h.cache->match(prompts[3]).usable_tokens, 0u);
  }
}

// A node keeps the highest priority of the requests that used it: a shared prefix used by a
// low-priority request stays at the high one's level; the low request's own suffix is low.
TEST(Priority, ANodeKeepsTheHighestPriorityOfItsUsers) {
  Harness h(small_config());
  const auto main = seq({{1, 16}, {50, 1}});
  const auto side = seq({{1, 8}, {300, 8}, {60, 1}});  // shares main's first 8 tokens
  const std::size_t main_snaps[] = {8, 16}, side_snaps[] = {8, 16};
  h.request_options = at(60);
  ASSERT_EQ(h.serve(main, main_snaps).error, "");
  h.request_options = at(5);
  ASSERT_EQ(h.serve(side, side_snaps).cached, 8u);
  const auto m = h.cache->inspect(main), s = h.cache->inspect(side);
  ASSERT_EQ(m.size(), 2u);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(m[0].kv_priority, 60);  // the shared node
  EXPECT_EQ(m[0].snapshot_priority, 60);
  EXPECT_EQ(s[1].kv_priority, 5);
  EXPECT_EQ(s[1].snapshot_priority, 5);
  // Room for 2 + 5 pages in the one GPU pool: the side's own KV and snapshot leave.
  auto room = take_pages(h, h.cache->occupancy().gpu_pages_free + 2 + 5);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(side).at(1).kv, Residency::kHost);  // the newest, but lowest
  EXPECT_EQ(h.cache->inspect(side).at(1).snapshot, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(main).at(1).kv, Residency::kGpu);
  EXPECT_EQ(h.cache->inspect(main).at(1).snapshot, Residency::kGpu);
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), room));
}

}  // namespace
}  // namespace radixtier
