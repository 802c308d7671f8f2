// Where the controls of issue 15 (items 6 and 10: sizes(), the per-path snapshot cap) meet
// host pins and priorities (items 8 and 9): a pin protects as a lock does.
#include <gtest/gtest.h>

#include "cache_harness.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::seq;
using testing::small_config;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

/// Whether the node ending at `boundary` on the path of `tokens` has a snapshot.
bool snapshot_at(Harness& h, std::span<const Token> tokens, std::size_t boundary) {
  for (const NodeInfo& n : h.cache->inspect(tokens))
    if (n.boundary == boundary) return n.snapshot != Residency::kNone;
  return false;
}

// sizes() counts a pinned prefix's host copies as locked, not evictable: evicting "all that
// is evictable" on host must not be promised pages a pin keeps.
TEST(ControlsAndPins, SizesCountPinnedHostCopiesAsLocked) {
  Harness h(small_config());
  const auto system = seq({{1, 8}, {50, 1}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(system, snaps).error, "");
  const CacheSizes before = h.cache->sizes();
  auto pin = h.cache->pin(std::span(system).first(8));
  ASSERT_TRUE(pin) << pin.status().to_string();
  const CacheSizes s = h.cache->sizes();
  EXPECT_EQ(s.host.kv_pages_locked, 2u);
  EXPECT_EQ(s.host.snapshots_locked, 1u);
  EXPECT_EQ(s.host.kv_pages_evictable, before.host.kv_pages_evictable);
  // Evicting everything on host leaves exactly the locked part.
  auto freed = h.cache->evict(EvictRequest{1u << 20, 1u << 20, Tier::kHost});
  ASSERT_TRUE(freed) << freed.status().to_string();
  EXPECT_EQ(h.cache->sizes().host.kv_pages_evictable, 0u);
  EXPECT_EQ(h.cache->inspect(system).at(0).kv, Residency::kBoth);
  ASSERT_TRUE(h.cache->unpin(*pin));
  EXPECT_EQ(h.cache->sizes().host.kv_pages_locked, 0u);
  ASSERT_INVARIANTS(h);
}

/// Y computes all of `tokens` (whole pages) itself and inserts them with a snapshot at
/// the end; the pages the tree already has stay Y's and are freed at release.
void compute_and_insert(Harness& h, LockId y, std::span<const Token> tokens) {
  auto pages = h.cache->alloc_pages(y, tokens.size() / h.ps());
  ASSERT_TRUE(pages);
  for (std::size_t i = 0; i < pages->size(); ++i) h.fill_page((*pages)[i], tokens, i);
  auto slot = h.cache->alloc_snapshot_slot(y);
  ASSERT_TRUE(slot);
  h.fill_snapshot(*slot, tokens);
  auto ins = h.cache->insert(y, tokens, *pages, *slot);
  ASSERT_TRUE(ins) << ins.status().to_string();
  ASSERT_TRUE(ins->snapshot_taken);
}

// The per-path cap never drops a pinned snapshot, and drops lower-priority ones first. Y is
// admitted before anything is cached, so it resumes from no snapshot (one a request
// resumes from is never dropped, which would hide what is tested here).
TEST(ControlsAndPins, TheSnapshotCapKeepsAPinnedSnapshot) {
  for (bool pinned : {false, true}) {
    SCOPED_TRACE(pinned ? "the cheapest one pinned" : "none pinned");
    CacheConfig c = small_config();
    c.max_snapshots_per_path = 1;
    Harness h(c);
    const auto y = seq({{1, 24}, {60, 1}});
    auto ya = h.cache->admit(y);
    ASSERT_TRUE(ya);
    ASSERT_EQ(ya->cached_tokens, 0u);
    const auto a = seq({{1, 8}, {50, 1}});  // a snapshot at 8: the cheaper to lose
    const std::size_t at8[] = {8};
    ASSERT_EQ(h.serve(a, at8).error, "");
    std::optional<PinId> pin;
    if (pinned) {
      auto p = h.cache->pin(std::span(a).first(8));
      ASSERT_TRUE(p) << p.status().to_string();
      pin = *p;
    }
    compute_and_insert(h, ya->lock, std::span(y).first(24));  // gaps 8 and 16
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(snapshot_at(h, y, 8), pinned);
    EXPECT_EQ(snapshot_at(h, y, 24), !pinned);
    ASSERT_TRUE(h.cache->release(ya->lock));
    if (pin) {
      ASSERT_TRUE(h.cache->unpin(*pin));
    }
    ASSERT_INVARIANTS(h);
  }
}

TEST(ControlsAndPins, TheSnapshotCapDropsTheLowerPriorityBeforeTheCheaper) {
  for (RetentionPriority high : {kDefaultPriority, RetentionPriority{90}}) {
    SCOPED_TRACE("the cheaper snapshot at priority " + std::to_string(high));
    CacheConfig c = small_config();
    c.max_snapshots_per_path = 1;
    Harness h(c);
    const auto y = seq({{1, 24}, {60, 1}});
    auto ya = h.cache->admit(y);  // default priority
    ASSERT_TRUE(ya);
    const auto a = seq({{1, 8}, {50, 1}});
    auto aa = h.cache->admit(a, RequestOptions{kDefaultNamespace, high});
    ASSERT_TRUE(aa);
    compute_and_insert(h, aa->lock, std::span(a).first(8));
    ASSERT_TRUE(h.cache->release(aa->lock));
    compute_and_insert(h, ya->lock, std::span(y).first(24));
    ASSERT_INVARIANTS(h);
    const bool kept_high = high > kDefaultPriority;
    EXPECT_EQ(snapshot_at(h, y, 8), kept_high);
    EXPECT_EQ(snapshot_at(h, y, 24), !kept_high);
    ASSERT_TRUE(h.cache->release(ya->lock));
    ASSERT_INVARIANTS(h);
  }
}

}  // namespace
}  // namespace radixtier
