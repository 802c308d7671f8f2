// Peer parity (issue 15 items 5, 6, 7 and 10): failed copies keep intact data, explicit
// eviction and sizes, lookup without load-back and the load-back threshold, the per-path
// snapshot cap. Each test failed before its item was built.
#include <gtest/gtest.h>

#include "cache_harness.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "side_request.hpp"

namespace radixtier {
namespace {

using testing::give_pages;
using testing::give_slot;
using testing::Harness;
using testing::seq;
using testing::small_config;
using testing::take_pages;
using testing::take_slot;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

/// Pushes every unlocked page of KV (and, cost-aware, its snapshot) to host.
void demote_all_kv(Harness& h) {
  give_pages(h, take_pages(h, h.config.gpu_pages - h.cache->sizes().gpu.kv_pages_locked));
}

// ---- item 5: failed copies keep intact data ------------------------------------------

// A failed demotion keeps the intact GPU copy; the room comes from the next victim.
TEST(PeerParityItem5, FailedDemotionKeepsTheGpuCopyAndTheNextVictimMakesTheRoom) {
  Harness h(small_config());
  const auto p = seq({{1, 8}, {50, 1}});
  const auto q = seq({{100, 8}, {60, 1}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps).error, "");  // older: the first victim
  ASSERT_EQ(h.serve(q, snaps).error, "");
  h.engine.fail_nth_submission(0);  // P's demotion fails when it runs
  const auto pages = take_pages(h, h.cache->occupancy().gpu_pages_free + 2);
  // 4 KV pages and two cached snapshots of snapshot_pages() = 5 GPU pages each.
  ASSERT_EQ(pages.size(), h.config.gpu_pages - 4 - 2 * 5 + 2);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->stats().transfers_failed, 1u);
  ASSERT_EQ(h.cache->inspect(p).size(), 1u);
  EXPECT_EQ(h.cache->inspect(p)[0].kv, Residency::kGpu);  // kept, not dropped
  EXPECT_EQ(h.cache->inspect(p)[0].snapshot, Residency::kGpu);
  // The next victim made the room: in the one GPU pool that is Q's snapshot (5 pages >= 2).
  EXPECT_EQ(h.cache->inspect(q)[0].snapshot, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(q)[0].kv, Residency::kGpu);
  EXPECT_EQ(h.cache->stats().kv_pages_dropped_gpu, 0u);
  give_pages(h, pages);
  const CacheStats before = h.cache->stats();
  auto again = h.serve(p, snaps);  // straight from the GPU copy, byte-exact
  EXPECT_EQ(again.cached, 8u);
  EXPECT_TRUE(again.bytes_ok);
  EXPECT_EQ(h.cache->stats().kv_pages_promoted, before.kv_pages_promoted);
  ASSERT_INVARIANTS(h);
}

// The same for a cached GPU snapshot (pages of the GPU pool): the snapshot whose demotion
// failed keeps its GPU pages, the next one in the snapshot order leaves instead.
TEST(PeerParityItem5, FailedSnapshotDemotionKeepsTheGpuSnapshot) {
  Harness h(small_config());
  std::vector<std::vector<Token>> prompts;
  const std::size_t snaps[] = {8};
  for (Token i = 0; i < 4; ++i) {  // four snapshots of 5 GPU pages each, oldest first
    prompts.push_back(seq({{Token(100 * (i + 1)), 8}, {1, 1}}));
    ASSERT_EQ(h.serve(prompts.back(), snaps).error, "");
  }
  ASSERT_EQ(h.cache->sizes().gpu.snapshots_evictable, 4u);
  h.engine.fail_nth_submission(0);
  const std::uint32_t free_before = h.cache->occupancy().gpu_pages_free;
  auto freed = h.cache->evict({0, 1, Tier::kGpu});
  ASSERT_TRUE(freed) << freed.status().to_string();
  EXPECT_EQ(freed->snapshots, 1u);
  EXPECT_EQ(h.cache->occupancy().gpu_pages_free, free_before + 5);
  EXPECT_EQ(h.cache->stats().transfers_failed, 1u);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(prompts[0])[0].snapshot, Residency::kGpu);  // its copy failed
  EXPECT_EQ(h.cache->inspect(prompts[1])[0].snapshot, Residency::kHost);
  EXPECT_EQ(h.cache->stats().snapshots_dropped, 0u);
  auto again = h.serve(prompts[0], snaps);
  EXPECT_EQ(again.cached, 8u);
  EXPECT_TRUE(again.bytes_ok);
  ASSERT_INVARIANTS(h);
}

// A failed promotion keeps the intact host copy: the request recomputes, the next admission
// promotes again and gets the same bytes.
TEST(PeerParityItem5, FailedPromotionKeepsTheHostCopy) {
  Harness h(small_config());
  const auto p = seq({{1, 16}, {50, 1}});
  const std::size_t snaps[] = {16};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  demote_all_kv(h);
  ASSERT_EQ(h.cache->match(p).host_tokens, 16u);
  ASSERT_FALSE(h.cache->match(p).snapshot_on_gpu);
  h.engine.fail_nth_submission(0);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->cached_tokens, 16u);
  ASSERT_TRUE(a->promoting);
  auto resumed = h.cache->wait(a->lock);  // rule 7: nothing that did not arrive is handed out
  ASSERT_TRUE(resumed);
  EXPECT_EQ(*resumed, 0u);
  EXPECT_TRUE(h.cache->path_pages(a->lock)->empty());
  ASSERT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(a->lock));
  ASSERT_INVARIANTS(h);
  const auto path = h.cache->inspect(p);
  ASSERT_FALSE(path.empty());
  for (const NodeInfo& n : path) EXPECT_EQ(n.kv, Residency::kHost);
  EXPECT_EQ(path.back().snapshot, Residency::kHost);
  EXPECT_EQ(h.cache->match(p).usable_tokens, 16u);
  auto again = h.serve(p, snaps);  // promotes again, byte-exact
  EXPECT_EQ(again.cached, 16u);
  EXPECT_TRUE(again.bytes_ok);
  EXPECT_EQ(h.cache->stats().kv_pages_promoted, 4u);
  ASSERT_INVARIANTS(h);
}

// An engine that fails every copy: each allocation still ends (the victims that failed are
// dropped once no other is left), admissions recompute, nothing loops, no wrong byte.
TEST(PeerParityItem5, AnEngineThatFailsEveryCopyNeverLoops) {
  Harness h(small_config());
  std::vector<std::vector<Token>> prompts;
  const std::size_t snaps[] = {8, 16};
  for (Token i = 0; i < 3; ++i) {
    prompts.push_back(seq({{Token(100 * (i + 1)), 16}, {1, 1}}));
    ASSERT_EQ(h.serve(prompts.back(), snaps).error, "");
  }
  demote_all_kv(h);  // prompts[*] on host (this one still worked)
  ASSERT_EQ(h.cache->match(prompts[0]).host_tokens, 16u);
  ASSERT_EQ(h.serve(seq({{900, 24}, {1, 1}}), snaps).error, "");  // some GPU data again
  for (std::uint64_t i = 0; i < 400; ++i) h.engine.fail_nth_submission(i);
  // Each victim is tried once per round: a round fails at most one copy per node, so it
  // ends long before the engine's 400 failures run out.
  const std::size_t nodes = h.cache->occupancy().nodes;
  const auto pages = take_pages(h, h.config.gpu_pages - 1);
  ASSERT_EQ(pages.size(), h.config.gpu_pages - 1);
  ASSERT_INVARIANTS(h);
  const std::uint64_t failed = h.cache->stats().transfers_failed;
  EXPECT_GT(failed, 0u);
  EXPECT_LE(failed, nodes);
  std::vector<GpuSlotId> slots;
  for (std::uint32_t i = 0; i < h.config.gpu_snapshot_slots; ++i) {
    slots.push_back(take_slot(h));
    EXPECT_LE(h.cache->stats().transfers_failed - failed, (i + 1) * nodes);
  }
  ASSERT_INVARIANTS(h);
  give_pages(h, pages);
  for (GpuSlotId s : slots) give_slot(h, s);
  for (int round = 0; round < 2; ++round) {
    for (const auto& p : prompts) {
      auto r = h.serve(p, snaps);  // its promotion fails: it recomputes
      EXPECT_EQ(r.error, "");
      EXPECT_TRUE(r.bytes_ok);
      ASSERT_INVARIANTS(h);
    }
  }
}

// ---- item 6: explicit eviction and sizes ---------------------------------------------

TEST(PeerParityItem6, EvictFreesWhatItIsAskedOnEachTierAndSizesTellWhatIsLeft) {
  Harness h(small_config());
  const auto p = seq({{1, 8}, {50, 1}});
  const auto q = seq({{100, 8}, {60, 1}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  ASSERT_EQ(h.serve(q, snaps).error, "");
  CacheSizes s = h.cache->sizes();
  EXPECT_EQ(s.gpu.kv_pages_evictable, 4u);
  EXPECT_EQ(s.gpu.kv_pages_locked, 0u);
  EXPECT_EQ(s.gpu.snapshots_evictable, 2u);
  // A cached GPU snapshot spans snapshot_pages() = 5 GPU pages of the one pool.
  EXPECT_EQ(s.gpu.bytes_evictable, 4u * 48 + 2u * 5u * 48);
  EXPECT_EQ(s.host, TierSizes{});

  // A running request locks P's KV. Its snapshot is copied into the request's live slot at
  // admission (issue 21), so the cached one is not locked.
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  s = h.cache->sizes();
  EXPECT_EQ(s.gpu.kv_pages_locked, 2u);
  EXPECT_EQ(s.gpu.kv_pages_evictable, 2u);
  EXPECT_EQ(s.gpu.snapshots_locked, 0u);
  EXPECT_EQ(s.gpu.snapshots_evictable, 2u);
  EXPECT_EQ(s.gpu.bytes_locked, 2u * 48);

  const CacheStats stats = h.cache->stats();
  auto none = h.cache->evict({0, 0, Tier::kGpu});
  ASSERT_TRUE(none);
  EXPECT_EQ(*none, EvictResult{});
  EXPECT_EQ(h.cache->stats(), stats);

  // 5 tokens round up to 2 pages: Q's node. KV and snapshots share the GPU pool but are
  // asked for apart: KV alone leaves Q's snapshot on the GPU.
  auto kv_only = h.cache->evict({5, 0, Tier::kGpu});
  ASSERT_TRUE(kv_only) << kv_only.status().to_string();
  EXPECT_EQ(kv_only->kv_pages, 2u);
  EXPECT_EQ(kv_only->snapshots, 0u);
  EXPECT_EQ(kv_only->bytes, 2u * 48);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(q)[0].snapshot, Residency::kGpu);
  // One snapshot: the least recent is Q's (the admission refreshed P's); its 5 pages go to
  // host.
  auto freed = h.cache->evict({0, 1, Tier::kGpu});
  ASSERT_TRUE(freed) << freed.status().to_string();
  EXPECT_EQ(freed->kv_pages, 0u);
  EXPECT_EQ(freed->snapshots, 1u);
  EXPECT_EQ(freed->bytes, 5u * 48);
  EXPECT_EQ(h.cache->inspect(q)[0].snapshot, Residency::kHost);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->inspect(q)[0].kv, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(p)[0].kv, Residency::kGpu);
  s = h.cache->sizes();
  EXPECT_EQ(s.gpu.kv_pages_evictable, 0u);
  EXPECT_EQ(s.host.kv_pages_evictable, 2u);
  EXPECT_EQ(s.host.snapshots_evictable, 1u);
  EXPECT_EQ(s.host.bytes_evictable, (2u + 5u) * 48);  // a host snapshot spans 5 pages

  // Asking for more than is unlocked frees what there is (P's snapshot): not an error.
  auto more = h.cache->evict({1000, 9, Tier::kGpu});
  ASSERT_TRUE(more);
  EXPECT_EQ(more->kv_pages, 0u);
  EXPECT_EQ(more->snapshots, 1u);
  EXPECT_EQ(h.cache->inspect(p)[0].kv, Residency::kGpu);  // the locked path stays
  EXPECT_EQ(h.cache->inspect(p)[0].snapshot, Residency::kHost);

  // Host: the snapshot alone first, then the KV.
  auto host_snap = h.cache->evict({0, 1, Tier::kHost});
  ASSERT_TRUE(host_snap);
  EXPECT_EQ(host_snap->kv_pages, 0u);
  EXPECT_EQ(host_snap->snapshots, 1u);
  EXPECT_EQ(host_snap->bytes, 5u * 48);
  ASSERT_INVARIANTS(h);
  auto host_kv = h.cache->evict({8, 0, Tier::kHost});
  ASSERT_TRUE(host_kv);
  EXPECT_EQ(host_kv->kv_pages, 2u);
  EXPECT_TRUE(h.cache->inspect(q).empty());
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->sizes().host.kv_pages_evictable, 0u);
  EXPECT_EQ(h.cache->sizes().host.snapshots_evictable, 1u);  // P's

  ASSERT_TRUE(h.cache->release(a->lock));
  s = h.cache->sizes();
  EXPECT_EQ(s.gpu.kv_pages_locked, 0u);
  EXPECT_EQ(s.gpu.kv_pages_evictable, 2u);
  EXPECT_EQ(s.gpu.snapshots_evictable, 0u);  // P's is on host
  // Bad input changes nothing.
  auto bad = h.cache->evict({4, 0, static_cast<Tier>(7)});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(h.cache->sizes(), s);
}

// The host part of a locked path is locked too (a promotion in flight included).
TEST(PeerParityItem6, HostCopiesOfALockedPathAreLocked) {
  Harness h(small_config());
  const auto p = seq({{1, 8}, {50, 1}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  demote_all_kv(h);
  EXPECT_EQ(h.cache->sizes().host.kv_pages_evictable, 2u);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->promoting);
  CacheSizes s = h.cache->sizes();
  EXPECT_EQ(s.host.kv_pages_locked, 2u);
  EXPECT_EQ(s.host.kv_pages_evictable, 0u);
  EXPECT_EQ(s.host.snapshots_locked, 1u);
  EXPECT_EQ(s.gpu.kv_pages_locked, 2u);  // the promotion's destinations
  auto host = h.cache->evict({100, 10, Tier::kHost});
  ASSERT_TRUE(host);
  EXPECT_EQ(host->kv_pages, 0u);
  EXPECT_EQ(host->snapshots, 0u);
  ASSERT_TRUE(h.cache->wait(a->lock));
  ASSERT_TRUE(h.cache->release(a->lock));
  ASSERT_INVARIANTS(h);
}

// ---- item 7: lookup without load-back, the load-back threshold ------------------------

/// P: 16 tokens, snapshots at 8 and 16; [0, 8) stays on GPU, [8, 16) goes to host.
void serve_then_demote_the_leaf(Harness& h, const std::vector<Token>& p) {
  const std::size_t snaps[] = {8, 16};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  // GPU snapshots are pages of the one GPU pool: push out exactly the leaf's KV and its
  // snapshot at 16, with [0, 8) and its snapshot pinned by a request meanwhile.
  auto hold = h.cache->admit(std::span(p).first(9));
  ASSERT_TRUE(hold);
  ASSERT_EQ(hold->cached_tokens, 8u);
  auto freed = h.cache->evict({1, 1, Tier::kGpu});
  ASSERT_TRUE(freed) << freed.status().to_string();
  ASSERT_EQ(freed->kv_pages, 2u);
  ASSERT_EQ(freed->snapshots, 1u);
  ASSERT_TRUE(h.cache->release(hold->lock));
  ASSERT_EQ(h.cache->match(p).host_tokens, 8u);
  ASSERT_FALSE(h.cache->match(p).snapshot_on_gpu);
}

TEST(PeerParityItem7, PeekReportsHostHitsWithoutPromotingOrRefreshing) {
  Harness h(small_config());
  const auto p = seq({{1, 16}, {50, 1}});
  serve_then_demote_the_leaf(h, p);
  const auto q = seq({{100, 8}, {60, 1}});
  const std::size_t q_snaps[] = {8};
  ASSERT_EQ(h.serve(q, q_snaps).error, "");  // used after P
  const Occupancy occupancy = h.cache->occupancy();
  const CacheStats stats = h.cache->stats();
  const auto path = h.cache->inspect(p);
  for (int i = 0; i < 3; ++i) {
    auto m = h.cache->peek(p);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->usable_tokens, 16u);
    EXPECT_EQ(m->host_tokens, 8u);
    EXPECT_FALSE(m->snapshot_on_gpu);
    EXPECT_EQ(m->gpu_usable_tokens, 8u);
    EXPECT_EQ(m->resume_tokens, 16u);  // default threshold: any load-back is worth it
    EXPECT_TRUE(m->load_back);
  }
  EXPECT_EQ(h.cache->occupancy(), occupancy);
  EXPECT_EQ(h.cache->stats(), stats);
  EXPECT_EQ(h.cache->inspect(p), path);
  EXPECT_TRUE(h.engine.pending().empty());
  EXPECT_EQ(h.cache->in_flight(), 0u);
  // Recency untouched: P's GPU page pair [0, 8) is older than Q's and leaves first (KV order).
  auto freed = h.cache->evict({1, 0, Tier::kGpu});
  ASSERT_TRUE(freed);
  EXPECT_EQ(freed->kv_pages, 2u);
  EXPECT_EQ(h.cache->inspect(p)[0].kv, Residency::kHost);
  EXPECT_EQ(h.cache->inspect(q)[0].kv, Residency::kGpu);
  // The last token is computed: peek on 9 tokens matches 8.
  EXPECT_EQ(h.cache->peek(std::span(p).first(9))->usable_tokens, 8u);
  EXPECT_FALSE(h.cache->peek(std::span<const Token>{}));
  ASSERT_INVARIANTS(h);
}

TEST(PeerParityItem7, BelowTheThresholdAdmissionResumesAtTheGpuBoundary) {
  CacheConfig c = small_config();
  c.load_back_min_tokens = 12;  // the host part adds 8 tokens: not worth a copy
  Harness h(c);
  const auto p = seq({{1, 16}, {50, 1}});
  serve_then_demote_the_leaf(h, p);
  auto m = h.cache->peek(p);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->usable_tokens, 16u);
  EXPECT_EQ(m->resume_tokens, 8u);
  EXPECT_FALSE(m->load_back);
  const CacheStats before = h.cache->stats();
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->cached_tokens, 8u);
  EXPECT_FALSE(a->promoting);
  EXPECT_EQ(a->host_tokens, 0u);
  EXPECT_TRUE(h.engine.pending().empty());  // nothing copied
  auto table = h.cache->path_pages(a->lock);
  ASSERT_TRUE(table);
  ASSERT_EQ(table->size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) EXPECT_TRUE(h.page_ok((*table)[i], p, i));
  EXPECT_TRUE(h.snapshot_ok(*h.cache->path_snapshot(a->lock), std::span(p).first(8)));
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_EQ(h.cache->stats().bytes_h2d, before.bytes_h2d);
  EXPECT_EQ(h.cache->inspect(p)[1].kv, Residency::kHost);  // still there for a deeper one
  ASSERT_INVARIANTS(h);

  // At the threshold the load-back is worth it.
  c.load_back_min_tokens = 8;
  Harness at(c);
  serve_then_demote_the_leaf(at, p);
  EXPECT_TRUE(at.cache->peek(p)->load_back);
  auto b = at.cache->admit(p);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->cached_tokens, 16u);
  EXPECT_TRUE(b->promoting);
  ASSERT_TRUE(at.cache->wait(b->lock));
  ASSERT_TRUE(at.cache->release(b->lock));
  ASSERT_INVARIANTS(at);
}

TEST(PeerParityItem7, ConfigRejectsAThresholdNothingCouldReach) {
  CacheConfig c = small_config();
  c.load_back_min_tokens = c.gpu_pages * c.page_size;
  EXPECT_TRUE(c.validate());
  c.load_back_min_tokens += 1;
  const Status s = c.validate();
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("load_back_min_tokens"), std::string::npos) << s.message();
}

// ---- item 10: the per-path snapshot cap ----------------------------------------------

/// Snapshot residency along `tokens`, shallow first.
std::vector<Residency> snapshots_along(Harness& h, std::span<const Token> tokens) {
  std::vector<Residency> out;
  for (const NodeInfo& n : h.cache->inspect(tokens)) out.push_back(n.snapshot);
  return out;
}

// One long conversation with a snapshot at every chunk keeps at most K on its path.
TEST(PeerParityItem10, ALongConversationKeepsAtMostKSnapshotsOnItsPath) {
  CacheConfig c = small_config();
  c.max_snapshots_per_path = 2;
  Harness h(c);
  const auto p = seq({{1, 40}, {50, 1}});
  const std::size_t snaps[] = {8, 16, 24, 32, 40};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  ASSERT_INVARIANTS(h);
  std::size_t kept = 0;
  for (Residency r : snapshots_along(h, p)) kept += r != Residency::kNone;
  EXPECT_EQ(kept, 2u);
  EXPECT_EQ(h.cache->stats().snapshots_dropped, 3u);
  EXPECT_GE(h.cache->occupancy().gpu_slots_free, 2u);  // the other slots stay for others
  // What is left resumes byte-exact.
  auto again = h.serve(p, snaps);
  EXPECT_GT(again.cached, 0u);
  EXPECT_TRUE(again.bytes_ok);
  ASSERT_INVARIANTS(h);
}

// The snapshot dropped is the one whose loss costs the fewest recompute tokens (not the
// oldest), never the one a running request resumes from.
TEST(PeerParityItem10, TheCapDropsTheCheapestUnpinnedSnapshot) {
  for (bool pin : {false, true}) {
    SCOPED_TRACE(pin ? "12 pinned" : "none pinned");
    CacheConfig c = small_config();
    c.max_snapshots_per_path = 2;
    Harness h(c);
    const auto y = seq({{1, 24}, {50, 1}});
    auto ya = h.cache->admit(y);  // before anything is cached: Y computes all of it itself
    ASSERT_TRUE(ya);
    ASSERT_EQ(ya->cached_tokens, 0u);
    const auto p = seq({{1, 12}, {60, 1}});
    const std::size_t p_snaps[] = {8, 12};  // gaps 8 and 4
    ASSERT_EQ(h.serve(p, p_snaps).error, "");
    std::optional<LockId> pinned;
    if (pin) {
      auto a = h.cache->admit(p);  // resumes from 12
      ASSERT_TRUE(a);
      ASSERT_EQ(a->cached_tokens, 12u);
      pinned = a->lock;
    }
    auto pages = h.cache->alloc_pages(ya->lock, 6);
    ASSERT_TRUE(pages);
    for (std::size_t i = 0; i < 6; ++i) h.fill_page((*pages)[i], y, i);
    auto slot = h.cache->alloc_snapshot_slot(ya->lock);
    ASSERT_TRUE(slot);
    h.fill_snapshot(*slot, std::span(y).first(24));
    auto ins = h.cache->insert(ya->lock, std::span(y).first(24), *pages, *slot);  // gap 12
    ASSERT_TRUE(ins) << ins.status().to_string();
    EXPECT_TRUE(ins->snapshot_taken);
    ASSERT_INVARIANTS(h);
    const auto along = snapshots_along(h, y);
    ASSERT_EQ(along.size(), 3u);
    if (!pin) {
      // Costs 8 (oldest), 4, 12: the one at 12 goes, though recency would take 8's.
      EXPECT_EQ(along,
                (std::vector<Residency>{Residency::kGpu, Residency::kNone, Residency::kGpu}));
    } else {
      // 12 is pinned: the next cheapest, 8, goes; the running request keeps its bytes.
      EXPECT_EQ(along,
                (std::vector<Residency>{Residency::kNone, Residency::kGpu, Residency::kGpu}));
      ASSERT_TRUE(h.cache->wait(*pinned));
      EXPECT_TRUE(h.snapshot_ok(*h.cache->path_snapshot(*pinned), std::span(p).first(12)));
      ASSERT_TRUE(h.cache->release(*pinned));
    }
    ASSERT_TRUE(h.cache->free_pages(ya->lock, ins->not_taken));
    ASSERT_TRUE(h.cache->release(ya->lock));
    ASSERT_INVARIANTS(h);
    auto again = h.serve(y, {});
    EXPECT_EQ(again.cached, 24u);
    EXPECT_TRUE(again.bytes_ok);
  }
}

// A snapshot attached inside a path (a split) after deeper ones exist: the victim may be below
// it. (Looking only above it dropped every branch-point snapshot in the sim's agent scenario.)
TEST(PeerParityItem10, TheCapLooksBelowASnapshotAttachedInsideAPath) {
  CacheConfig c = small_config();
  c.max_snapshots_per_path = 2;
  Harness h(c);
  const auto y = seq({{1, 8}, {50, 1}});
  auto ya = h.cache->admit(y);  // before anything is cached
  ASSERT_TRUE(ya);
  const auto p = seq({{1, 32}, {60, 1}});
  const std::size_t p_snaps[] = {12, 32};  // nodes [0, 12), [12, 24), [24, 32)
  ASSERT_EQ(h.serve(p, p_snaps, 3).error, "");
  ASSERT_EQ(snapshots_along(h, p),
            (std::vector<Residency>{Residency::kGpu, Residency::kNone, Residency::kGpu}));
  auto pages = h.cache->alloc_pages(ya->lock, 2);
  ASSERT_TRUE(pages);
  for (std::size_t i = 0; i < 2; ++i) h.fill_page((*pages)[i], y, i);
  auto slot = h.cache->alloc_snapshot_slot(ya->lock);
  ASSERT_TRUE(slot);
  h.fill_snapshot(*slot, std::span(y).first(8));
  // Splits [0, 12) at 8: snapshots at 8 (gap 8), 12 (gap 4), 32 (gap 20) on one path.
  auto ins = h.cache->insert(ya->lock, std::span(y).first(8), *pages, *slot);
  ASSERT_TRUE(ins) << ins.status().to_string();
  EXPECT_TRUE(ins->snapshot_taken);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(snapshots_along(h, p), (std::vector<Residency>{Residency::kGpu, Residency::kNone,
                                                           Residency::kNone, Residency::kGpu}));
  ASSERT_TRUE(h.cache->free_pages(ya->lock, ins->not_taken));
  ASSERT_TRUE(h.cache->release(ya->lock));
  auto again = h.serve(p, {});
  EXPECT_EQ(again.cached, 32u);
  EXPECT_TRUE(again.bytes_ok);
  ASSERT_INVARIANTS(h);
}

TEST(PeerParityItem10, ConfigRejectsACapThatCouldNeverBind) {
  CacheConfig c = small_config();
  // 32 / 5 = 6 snapshots in the GPU pool + (64 + 8 x 5) / 5 = 20 on host.
  c.max_snapshots_per_path = 26;
  EXPECT_TRUE(c.validate());
  c.max_snapshots_per_path = 27;
  const Status s = c.validate();
  ASSERT_FALSE(s);
  EXPECT_NE(s.message().find("max_snapshots_per_path"), std::string::npos) << s.message();
}

// The cached snapshots live in the GPU pool's pages, not in the live slots (issue 34 item 3):
// 1000 pages of 64 bytes hold 250 snapshots of 256 bytes, whatever gpu_snapshot_slots is.
TEST(CacheConfigValidate, CountsTheGpuPoolsSnapshotsNotTheLiveSlots) {
  CacheConfig c;
  c.page_size = 4;
  c.gpu_pages = 1000;
  c.gpu_snapshot_slots = 2;
  c.page_bytes = 64;
  c.snapshot_bytes = 256;
  c.max_snapshots_per_path = 10;
  EXPECT_TRUE(c.validate()) << c.validate().message();
  c.max_snapshots_per_path = 250;
  EXPECT_TRUE(c.validate()) << c.validate().message();
  c.max_snapshots_per_path = 251;  // no host tier: 250 is all there is
  EXPECT_FALSE(c.validate());
}

// A GPU pool that cannot hold a page of KV and one snapshot would never cache a snapshot
// (every request recomputes from the root, no error anywhere): refused, saying what to size.
TEST(CacheConfigValidate, RefusesAGpuPoolThatCannotHoldKvAndOneSnapshot) {
  CacheConfig c;
  c.page_size = 4;
  c.gpu_pages = 3;
  c.gpu_snapshot_slots = 2;
  c.host_pages = 64;
  c.page_bytes = 64;
  c.snapshot_bytes = 256;  // snapshot_pages() = 4
  ASSERT_EQ(c.snapshot_pages(), 4u);
  for (std::uint32_t pages : {3u, 4u}) {
    c.gpu_pages = pages;
    const Status s = c.validate();
    ASSERT_FALSE(s) << pages;
    EXPECT_NE(s.message().find("CacheConfig.gpu_pages"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("at least 5 pages"), std::string::npos) << s.message();
  }
  c.gpu_pages = 5;
  EXPECT_TRUE(c.validate()) << c.validate().message();
  // And at 5 pages one request does cache its snapshot (what the rule promises).
  Harness h([&] {
    CacheConfig k = c;
    k.gpu_free_low_watermark = k.gpu_free_high_watermark = 0;
    return k;
  }());
  const auto p = seq({{1, 4}, {9, 1}});
  const std::size_t snaps[] = {4};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  EXPECT_EQ(h.serve(p, snaps).cached, 4u);
}

}  // namespace
}  // namespace radixtier
