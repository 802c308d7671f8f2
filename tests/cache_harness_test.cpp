// The test harness itself (tests/cache_harness.hpp): what the property tests at large sizes
// rely on. A request that recomputes KV the tree already holds gets its duplicate pages back
// from insert and frees them at once, so it never holds more than it adds; and when the GPU
// pool really is full, serve() reports a clear out-of-memory refusal that changed nothing.
#include <gtest/gtest.h>

#include "cache_harness.hpp"

namespace radixtier {
namespace {

using testing::Fingerprint;
using testing::Harness;
using testing::seq;
using testing::small_config;

/// 14 pages of a conversation with a snapshot at its end (5 more GPU pages: issue 21), then
/// held by a running request: 19 GPU pages pinned.
struct HeldConversation {
  std::vector<Token> prompt = seq({{100, 56}, {7, 1}});
  LockId lock;

  explicit HeldConversation(Harness& h) {
    const std::size_t snaps[] = {56};
    EXPECT_EQ(h.serve(prompt, snaps).error, "");
    auto a = h.cache->admit(prompt);
    EXPECT_TRUE(a);
    EXPECT_EQ(a->cached_tokens, 56u);
    lock = a->lock;
  }
};

TEST(CacheHarness, ServeFreesDuplicatePagesAsSoonAsInsertHandsThemBack) {
  CacheConfig c = small_config();
  c.gpu_pages = 29;
  Harness h(c);
  HeldConversation held(h);  // locks 14 of the 29 pages
  // Shares the first 10 pages with the held conversation but not its snapshot: it recomputes
  // them, and insert hands back each of those 10 pages (the tree has them, pinned).
  const auto branch = seq({{100, 40}, {900, 16}, {7, 1}});
  const std::size_t snaps[] = {56};
  const auto before = h.cache->occupancy();
  auto r = h.serve(branch, snaps, 2);
  // Keeping the duplicates until the end needs 19 + 10 + 4 pages (+ 5 for its snapshot) of 29.
  EXPECT_EQ(r.error, "");
  EXPECT_FALSE(r.refused);
  EXPECT_TRUE(r.bytes_ok);
  EXPECT_EQ(r.cached, 0u);
  // The branch's own 4 pages and its snapshot's 5 stayed in the tree; every duplicate went back.
  EXPECT_EQ(h.cache->occupancy().gpu_pages_free, before.gpu_pages_free - 4 - 5);
  EXPECT_EQ(h.cache->check_invariants(), "");
  EXPECT_TRUE(h.cache->release(held.lock));
  // The branch is reusable, its bytes intact.
  auto again = h.serve(branch, snaps, 2);
  EXPECT_EQ(again.cached, 56u);
  EXPECT_TRUE(again.bytes_ok);
}

TEST(CacheHarness, AFullGpuPoolIsAClearRefusalThatChangedNothing) {
  CacheConfig c = small_config();
  c.gpu_pages = 21;
  Harness h(c);
  // Locks 14 of the 21 pages; its cached snapshot's 5 are not locked (the request has its
  // own copy in its live slot, issue 21).
  HeldConversation held(h);
  const auto other = seq({{500, 32}, {7, 1}});
  const std::size_t snaps[] = {32};
  auto r = h.serve(other, snaps, 1);  // 2 free pages and the snapshot's 5 fit, the 8th cannot
  EXPECT_TRUE(r.refused);
  EXPECT_NE(r.error.find("GPU pool"), std::string::npos) << r.error;
  EXPECT_EQ(r.refusal_changed, "");
  EXPECT_TRUE(r.bytes_ok);
  EXPECT_EQ(h.cache->check_invariants(), "");
  EXPECT_TRUE(h.cache->release(held.lock));
  EXPECT_EQ(h.serve(other, snaps, 1).error, "");
}

TEST(CacheHarness, FingerprintSeesStatsAndOccupancy) {
  Harness h(small_config());
  const auto p = seq({{1, 12}, {7, 1}});
  const std::vector<Token> known[] = {p};
  const Fingerprint empty = h.fingerprint(known);
  EXPECT_EQ(empty.difference(h.fingerprint(known)), "");
  const std::size_t snaps[] = {12};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  EXPECT_NE(empty.difference(h.fingerprint(known)), "");
  // An admission that matches and is released changes the stats alone.
  const Fingerprint served = h.fingerprint(known);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_EQ(served.difference(h.fingerprint(known)), "stats changed");
  // A page taken from the free list changes the occupancy alone.
  const LockId side = h.side_lock();
  const Fingerprint before = h.fingerprint(known);
  auto page = h.cache->alloc_pages(side, 1);
  ASSERT_TRUE(page);
  EXPECT_EQ(before.difference(h.fingerprint(known)), "occupancy changed");
}

}  // namespace
}  // namespace radixtier
