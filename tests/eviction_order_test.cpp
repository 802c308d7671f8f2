// The eviction orders (issue 11 part C, issue 15 items 1-4): each test failed before.
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

// Item 1: a parent exposed by evicting its child re-enters the order at its own last use, not
// at the most recent end: the old chain base goes before a sequence used after it.
TEST(EvictionOrder, ExposedParentKeepsTheRecencyOfItsLastUse) {
  for (SnapshotEviction e : {SnapshotEviction::kLru, SnapshotEviction::kCostAware}) {
    SCOPED_TRACE(to_string(e));
    Harness h(config(e));
    const auto p = seq({{1, 16}, {50, 1}});  // nodes X [0, 8) and Y [8, 16)
    const auto q = seq({{100, 8}, {60, 1}});
    const std::size_t p_snaps[] = {8, 16}, q_snaps[] = {8};
    ASSERT_EQ(h.serve(p, p_snaps).error, "");
    ASSERT_EQ(h.serve(q, q_snaps).error, "");  // used after P
    // X and Q were used as often (one insert each): only recency decides. KV is asked for
    // alone (the GPU pool also holds the snapshots, which have their own order in it).
    auto first = h.cache->evict({1, 0, Tier::kGpu});  // Y leaves
    ASSERT_TRUE(first);
    EXPECT_EQ(first->kv_pages, 2u);
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->inspect(p).at(1).kv, Residency::kHost);
    auto second = h.cache->evict({1, 0, Tier::kGpu});  // X, not Q
    ASSERT_TRUE(second);
    EXPECT_EQ(second->kv_pages, 2u);
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->inspect(p).at(0).kv, Residency::kHost);
    EXPECT_EQ(h.cache->inspect(q).at(0).kv, Residency::kGpu);
  }
}

// Item 2: an admission refreshes the KV of its whole path but only the snapshot it resumes
// from; the intermediate snapshot on the path then leaves before a more recent one.
TEST(EvictionOrder, AdmissionRefreshesOnlyTheSnapshotItResumesFrom) {
  for (SnapshotEviction e : {SnapshotEviction::kLru, SnapshotEviction::kCostAware}) {
    SCOPED_TRACE(to_string(e));
    Harness h(config(e));
    const auto p = seq({{1, 16}, {50, 1}});
    const auto r = seq({{200, 8}, {70, 1}});
    const std::size_t p_snaps[] = {8, 16}, r_snaps[] = {8};
    ASSERT_EQ(h.serve(p, p_snaps).error, "");
    ASSERT_EQ(h.serve(r, r_snaps).error, "");
    auto a = h.cache->admit(p);  // resumes at 16
    ASSERT_TRUE(a);
    ASSERT_EQ(a->cached_tokens, 16u);
    ASSERT_TRUE(h.cache->release(a->lock));
    // Three snapshots in GPU pages: the first one asked for is P's intermediate.
    auto freed = h.cache->evict({0, 1, Tier::kGpu});
    ASSERT_TRUE(freed);
    EXPECT_EQ(freed->snapshots, 1u);
    ASSERT_INVARIANTS(h);
    EXPECT_NE(h.cache->inspect(p).at(0).snapshot, Residency::kGpu);  // P's intermediate left
    EXPECT_EQ(h.cache->inspect(p).at(1).snapshot, Residency::kGpu);
    EXPECT_TRUE(h.cache->match(r).snapshot_on_gpu);
  }
}

// Item 3: KV that no snapshot at or below it makes resumable (dead KV) leaves first, before
// older live KV, and is dropped rather than copied to host.
TEST(EvictionOrder, DeadKvLeavesFirstAndIsNotDemoted) {
  Harness h(small_config());
  const auto q = seq({{100, 8}, {60, 1}});
  const auto p = seq({{1, 16}, {50, 1}});
  const std::size_t q_snaps[] = {8}, p_snaps[] = {16};
  ASSERT_EQ(h.serve(q, q_snaps).error, "");  // older, live
  ASSERT_EQ(h.serve(p, p_snaps).error, "");  // newer; its one snapshot is at 16
  // P's snapshot goes to host and is dropped there; Q's stays pinned on the GPU meanwhile.
  auto hold = h.cache->admit(q);
  ASSERT_TRUE(hold);
  auto freed = h.cache->evict({0, 1, Tier::kGpu});  // P's snapshot, Q's is locked
  ASSERT_TRUE(freed);
  ASSERT_EQ(freed->snapshots, 1u);
  h.cache->drop_host();
  ASSERT_TRUE(h.cache->release(hold->lock));
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->match(p).usable_tokens, 0u);  // P's KV is dead now
  const std::uint32_t host_free = h.cache->occupancy().host_pages_free;
  auto pages = take_pages(h, h.cache->occupancy().gpu_pages_free + 4);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(q).at(0).kv, Residency::kGpu);    // the older live KV stays
  EXPECT_TRUE(h.cache->inspect(p).empty());                    // the dead KV is gone ...
  EXPECT_EQ(h.cache->occupancy().host_pages_free, host_free);  // ... not copied to host
  EXPECT_EQ(h.cache->stats().dead_kv_pages_dropped, 4u);
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), pages));
}

// Item 4 (issue 21): a cached GPU snapshot is 5 pages of the one GPU pool; a side request
// that needs the whole pool pushes the node's KV and snapshot to host and gets all 7 pages,
// and no live slot is taken or freed by it.
TEST(EvictionOrder, SnapshotLeavesTheGpuWithItsKv) {
  Harness h(small_config());
  const auto p = seq({{1, 8}, {50, 1}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  const std::uint32_t slots_free = h.cache->occupancy().gpu_slots_free;
  ASSERT_EQ(h.cache->occupancy().gpu_pages_free, h.config.gpu_pages - 2 - 5);
  auto pages = take_pages(h, h.config.gpu_pages);
  ASSERT_EQ(pages.size(), h.config.gpu_pages);
  ASSERT_INVARIANTS(h);
  ASSERT_EQ(h.cache->inspect(p).at(0).kv, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(p).at(0).snapshot, Residency::kHost);
  EXPECT_EQ(h.cache->occupancy().gpu_slots_free, slots_free);
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), pages));
  auto again = h.serve(p, snaps);  // and both come back byte-exact
  EXPECT_EQ(again.cached, 8u);
  EXPECT_TRUE(again.bytes_ok);
}

// Part B: one host pool. With no KV on host, its pages hold as many snapshots as fit; the
// split between KV and snapshots follows the keys, not a share fixed in the config.
TEST(EvictionOrder, HostSnapshotsAndKvShareOnePool) {
  CacheConfig c = small_config();
  c.host_snapshot_slots = 0;  // 64 host pages, no room reserved for snapshots
  Harness h(c);
  const auto p = seq({{1, 8}, {50, 1}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  auto pages = take_pages(h, h.config.gpu_pages);  // KV and snapshot leave the GPU
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(p).at(0).snapshot, Residency::kHost);  // 5 pages of the pool
  EXPECT_EQ(h.cache->occupancy().host_pages_free, 64u - 2u - 5u);
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), pages));
  // With the fixed split of the baselines there is no room for it.
  c.snapshot_eviction = SnapshotEviction::kLru;
  Harness lru(c);
  ASSERT_EQ(lru.serve(p, snaps).error, "");
  auto more = take_pages(lru, lru.cache->occupancy().gpu_pages_free + 2);
  EXPECT_EQ(lru.cache->inspect(p).at(0).snapshot, Residency::kGpu);
  EXPECT_EQ(lru.cache->occupancy().host_pages_free, 64u - 2u);
  ASSERT_TRUE(lru.cache->free_pages(lru.side_lock(), more));
}

// Q, then P, each with a snapshot at its end; both pushed to host; then P served again, so its
// promotion leaves P on both tiers and Q on host alone.
const auto kQ = seq({{100, 8}, {60, 1}});
const auto kP = seq({{1, 8}, {50, 1}});
constexpr std::size_t kSnaps[] = {8};
void promote_p_leave_q_on_host(Harness& h) {
  ASSERT_EQ(h.serve(kQ, kSnaps).error, "");
  ASSERT_EQ(h.serve(kP, kSnaps).error, "");
  auto pages = take_pages(h, h.config.gpu_pages);  // both leave the GPU for host
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), pages));
  ASSERT_EQ(h.cache->inspect(kP).at(0).kv, Residency::kHost);
  ASSERT_EQ(h.serve(kP, kSnaps).cached, 8u);
  ASSERT_EQ(h.cache->inspect(kP).at(0).kv, Residency::kBoth);
  ASSERT_EQ(h.cache->inspect(kQ).at(0).kv, Residency::kHost);
  ASSERT_INVARIANTS(h);
}

// Issue 36: a host copy of KV or of a snapshot the GPU holds too leaves the host before
// anything held there alone, whatever their values: dropping it loses nothing while the GPU
// copy lives. P, used twice and last, is on both tiers after its resume promoted it; Q, used
// once, on host only.
TEST(EvictionOrder, HostDropsCopiesOfWhatTheGpuHoldsFirst) {
  Harness h(small_config());
  ASSERT_NO_FATAL_FAILURE(promote_p_leave_q_on_host(h));  // P's host copies stay, clean
  const auto& p = kP;
  const auto& q = kQ;
  const auto& snaps = kSnaps;
  ASSERT_EQ(h.cache->inspect(p).at(0).snapshot, Residency::kBoth);

  auto snap = h.cache->evict({0, 1, Tier::kHost});
  ASSERT_TRUE(snap);
  EXPECT_EQ(snap->snapshots, 1u);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(p).at(0).snapshot, Residency::kGpu);   // its copy went
  EXPECT_EQ(h.cache->inspect(q).at(0).snapshot, Residency::kHost);  // Q's only one stays
  auto freed = h.cache->evict({8, 0, Tier::kHost});
  ASSERT_TRUE(freed);
  EXPECT_EQ(freed->kv_pages, 2u);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(p).at(0).kv, Residency::kGpu);   // its copy went
  EXPECT_EQ(h.cache->inspect(q).at(0).kv, Residency::kHost);  // the only copy of Q stays
  EXPECT_EQ(h.serve(q, snaps).cached, 8u);
  // The GPU copy alone is P's KV now: evicting it from GPU demotes it again.
  auto more = take_pages(h, h.config.gpu_pages);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(p).at(0).kv, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(p).at(0).snapshot, Residency::kHost);
  ASSERT_TRUE(h.cache->free_pages(h.side_lock(), more));
  const auto last = h.serve(p, snaps);
  EXPECT_EQ(last.cached, 8u);
  EXPECT_TRUE(last.bytes_ok);
}

// Under write-through the host copies are the policy's point (the shared tier publishes from
// them): the copy of P, worth more, stays, and Q's KV, held on host alone, goes first. Once a
// shared tier published P's copies (mark_published), they leave first as under write-back:
// the copy of P goes and Q's stays. Marking a path the tree lacks changes nothing.
TEST(EvictionOrder, WriteThroughCopiesKeepTheirValueUntilPublished) {
  for (bool published : {false, true}) {
    SCOPED_TRACE(published ? "P's copies published" : "nothing published");
    CacheConfig c = small_config();
    c.write_policy = WritePolicy::kWriteThrough;
    Harness h(c);
    ASSERT_NO_FATAL_FAILURE(promote_p_leave_q_on_host(h));
    const auto& p = kP;
    const auto& q = kQ;
    h.cache->mark_published(seq({{300, 8}}));
    if (published) h.cache->mark_published(std::span(p).first(8));
    ASSERT_INVARIANTS(h);
    auto freed = h.cache->evict({8, 0, Tier::kHost});
    ASSERT_TRUE(freed);
    ASSERT_INVARIANTS(h);
    if (!published) {
      EXPECT_EQ(h.cache->inspect(p).at(0).kv, Residency::kBoth);
      EXPECT_TRUE(h.cache->inspect(q).empty() || h.cache->inspect(q).at(0).kv == Residency::kNone);
      continue;
    }
    EXPECT_EQ(freed->kv_pages, 2u);
    EXPECT_EQ(h.cache->inspect(p).at(0).kv, Residency::kGpu);   // the published copy went
    EXPECT_EQ(h.cache->inspect(q).at(0).kv, Residency::kHost);  // the only copy of Q stays
    const auto last = h.serve(q, kSnaps);
    EXPECT_EQ(last.cached, 8u);
    EXPECT_TRUE(last.bytes_ok);
  }
}

// Issue 36: a conversation resumes its last finish and keeps a deeper one; the finish it
// resumed is then spent (node.hpp, "Eviction orders"). Once kSpentWindow resumes in a row
// landed on no spent snapshot, its insert and its frontier resume no longer count, so it
// leaves before a snapshot used once; a resume that lands on it turns that off again.
TEST(EvictionOrder, SpentFinishLeavesFirstWhileTheTrafficResumesNoSpentSnapshot) {
  const auto r = seq({{200, 8}, {70, 1}});
  const auto turn1 = seq({{1, 16}, {50, 1}});
  const auto turn2 = seq({{1, 24}, {51, 1}});  // turn 1's 16 tokens and 8 more
  for (bool resume_spent : {false, true}) {
    SCOPED_TRACE(resume_spent ? "a resume lands on the spent finish" : "no resume lands on it");
    Harness h(small_config());
    const std::size_t r_snaps[] = {8}, snaps1[] = {16}, snaps2[] = {24};
    ASSERT_EQ(h.serve(r, r_snaps).error, "");  // 1 use, 8 tokens back to the root
    ASSERT_EQ(h.serve(turn1, snaps1).error, "");
    ASSERT_EQ(h.serve(turn2, snaps2).error, "");  // resumes at 16, keeps 24: 16 is spent
    // Without the discount the finish at 16 (2 uses x 16 tokens) outweighs R (1 x 8).
    for (std::size_t i = 0; i <= PrefixCache::kSpentWindow; ++i) {
      auto a = h.cache->admit(turn2);  // resumes at 24, the path's end: not spent
      ASSERT_TRUE(a);
      ASSERT_EQ(a->cached_tokens, 24u);
      ASSERT_TRUE(h.cache->release(a->lock));
    }
    if (resume_spent) {
      auto a = h.cache->admit(turn1);  // stops at 16 again, as a new branch would
      ASSERT_TRUE(a);
      ASSERT_EQ(a->cached_tokens, 16u);
      ASSERT_TRUE(h.cache->release(a->lock));
    }
    ASSERT_INVARIANTS(h);
    auto freed = h.cache->evict({0, 1, Tier::kGpu});
    ASSERT_TRUE(freed);
    ASSERT_EQ(freed->snapshots, 1u);
    ASSERT_INVARIANTS(h);
    const Residency spent = h.cache->inspect(turn1).back().snapshot;
    const Residency once = h.cache->inspect(r).back().snapshot;
    if (resume_spent) {
      EXPECT_EQ(spent, Residency::kGpu);
      EXPECT_NE(once, Residency::kGpu);
    } else {
      EXPECT_NE(spent, Residency::kGpu);
      EXPECT_EQ(once, Residency::kGpu);
    }
    EXPECT_EQ(h.cache->inspect(turn2).back().snapshot, Residency::kGpu);
  }
}

// Issue 36: while spent snapshots are discounted (a conversation keeps one snapshot, its last
// finish), evicting a GPU KV leaf takes the snapshot at its end with it, so its value counts
// that snapshot's gap per byte of both: a short leaf under a snapshot that resumes little
// leaves before a longer one whose snapshot resumes a long prefix. Without the discount they
// tie on tokens per page and the older goes first, as before.
TEST(EvictionOrder, GpuKvLeafCountsTheSnapshotAtItsEndWhileSpentSnapshotsAreDiscounted) {
  const auto p = seq({{1, 24}, {50, 1}});
  const auto q = seq({{100, 8}, {60, 1}});
  const auto w = seq({{300, 8}, {80, 1}});
  for (bool discounted : {false, true}) {
    SCOPED_TRACE(discounted ? "discounted" : "not yet");
    Harness h(small_config());
    const std::size_t p_snaps[] = {8, 24}, q_snaps[] = {8}, w_snaps[] = {8};
    ASSERT_EQ(h.serve(p, p_snaps).error, "");  // older: leaf [8, 24), its snapshot 16 back
    ASSERT_EQ(h.serve(q, q_snaps).error, "");  // newer: leaf [0, 8), its snapshot 8 back
    ASSERT_EQ(h.serve(w, w_snaps).error, "");  // the newest
    // Resumes of W's snapshot, the end of its path: not spent, so the window fills.
    for (std::size_t i = 0; discounted && i <= PrefixCache::kSpentWindow; ++i) {
      auto a = h.cache->admit(w);
      ASSERT_TRUE(a);
      ASSERT_TRUE(h.cache->release(a->lock));
    }
    auto freed = h.cache->evict({1, 0, Tier::kGpu});
    ASSERT_TRUE(freed);
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->inspect(q).at(0).kv, discounted ? Residency::kHost : Residency::kGpu);
    EXPECT_EQ(h.cache->inspect(p).back().kv, discounted ? Residency::kGpu : Residency::kHost);
  }
}

}  // namespace
}  // namespace radixtier
