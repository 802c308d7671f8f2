// Regression tests of issue 9 (bugs 1-3, items 5-7): each failed before its fix.
#include <gtest/gtest.h>

#include <stdexcept>

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

/// Pushes every unlocked page out of the GPU (to host, write-back).
void demote_all_kv(Harness& h) {
  give_pages(h, take_pages(h, h.config.gpu_pages));
}
/// Pushes every unpinned snapshot out of the GPU.
void demote_all_snapshots(Harness& h) {
  // Cached GPU snapshots are pages of the GPU pool (issue 21): ask for all of them.
  auto freed = h.cache->evict({0, 1u << 20, Tier::kGpu});
  ASSERT_TRUE(freed) << freed.status().to_string();
}

CacheConfig two_slot_config() {
  CacheConfig c = small_config();
  c.gpu_snapshot_slots = 2;
  return c;
}

// ---- bug 1 ----------------------------------------------------------------------------

TEST(CacheHardeningBug1, FailedAdmissionLeavesNoEmptyLeaf) {
  // Written for recency order (which victim a slot comes from decides the path taken).
  CacheConfig config = two_slot_config();
  config.snapshot_eviction = SnapshotEviction::kLru;
  Harness h(config);
  const auto p = seq({{1, 9}});
  const auto q = seq({{100, 9}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  ASSERT_EQ(h.serve(q, snaps).error, "");
  ASSERT_INVARIANTS(h);
  demote_all_kv(h);
  ASSERT_INVARIANTS(h);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->promoting);
  const auto pending = h.engine.pending();
  ASSERT_EQ(pending.size(), 2u);  // the promotion, then the fill of the live slot after it
  const TicketId p_promotion = pending[0];
  // Fails whenever it runs: the next admission that needs a slot waits for P's fill, which
  // holds one until it lands and runs after this promotion (issue 33).
  h.engine.fail_ticket(p_promotion);
  ASSERT_TRUE(h.cache->release(a->lock));  // without waiting
  ASSERT_INVARIANTS(h);
  const GpuSlotId held = take_slot(h);
  ASSERT_INVARIANTS(h);
  auto b = h.cache->admit(q);
  ASSERT_TRUE(b);
  ASSERT_TRUE(h.cache->release(b->lock));
  ASSERT_INVARIANTS(h);
  // Waits on P's own promotion for a slot; it fails and keeps P's host copy (issue 15 item 5),
  // so the admission counts P's pages again and promotes them itself.
  auto c = h.cache->admit(p);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cached_tokens, 8u);
  EXPECT_TRUE(c->promoting);
  ASSERT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(c->lock));
  ASSERT_INVARIANTS(h);
  h.cache->drain();
  ASSERT_INVARIANTS(h);
  h.cache->drop_host();
  ASSERT_INVARIANTS(h);
  give_slot(h, held);
  // Nothing leaked: every page of the host pool is free again once the host tier is dropped.
  EXPECT_EQ(h.cache->occupancy().host_pages_free, h.config.host_pool_pages());
  auto again = h.serve(p, snaps);
  EXPECT_EQ(again.error, "");
  EXPECT_TRUE(again.bytes_ok);
  ASSERT_INVARIANTS(h);
}

// ---- bug 2 ----------------------------------------------------------------------------

TEST(CacheHardeningBug2, HopelessAdmissionEvictsNothing) {
  Harness h(two_slot_config());
  const auto p = seq({{1, 9}});
  const auto r = seq({{500, 40}, {9, 1}});
  const std::size_t snaps_p[] = {8};
  const std::size_t snaps_r[] = {40};
  ASSERT_EQ(h.serve(p, snaps_p).error, "");
  demote_all_kv(h);
  demote_all_snapshots(h);
  ASSERT_EQ(h.cache->match(p).host_tokens, 8u);  // P is on host only
  ASSERT_EQ(h.serve(r, snaps_r).error, "");      // R: 10 pages and a snapshot on GPU
  ASSERT_INVARIANTS(h);
  // Running requests hold every free page and both snapshot slots.
  const auto pages = take_pages(h, h.cache->occupancy().gpu_pages_free);
  const GpuSlotId s1 = take_slot(h);
  const GpuSlotId s2 = take_slot(h);  // demotes R's snapshot
  ASSERT_INVARIANTS(h);
  ASSERT_EQ(h.cache->match(r).host_tokens, 0u);
  const CacheStats before = h.cache->stats();
  // P needs 2 GPU pages and a slot; no slot can be had, so no page may be made either.
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->cached_tokens, 0u);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->stats().kv_pages_demoted, before.kv_pages_demoted);
  EXPECT_EQ(h.cache->stats().kv_pages_dropped_gpu, before.kv_pages_dropped_gpu);
  EXPECT_EQ(h.cache->match(r).host_tokens, 0u) << "R's KV was evicted for nothing";
  ASSERT_TRUE(h.cache->release(a->lock));
  give_pages(h, pages);
  give_slot(h, s1);
  give_slot(h, s2);
  ASSERT_INVARIANTS(h);
  auto back = h.serve(r, snaps_r);
  EXPECT_EQ(back.cached, 40u);
  EXPECT_TRUE(back.bytes_ok);
}

// ---- bug 3 ----------------------------------------------------------------------------

TEST(CacheHardeningBug3, WriteThroughCompletionKeepsTheRecencyOfUse) {
  CacheConfig config = small_config(WritePolicy::kWriteThrough);
  config.snapshot_eviction = SnapshotEviction::kLru;  // recency alone decides
  Harness h(config);
  const auto a = seq({{1, 9}});
  const auto b = seq({{100, 9}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(a, snaps).error, "");  // used first
  ASSERT_EQ(h.serve(b, snaps).error, "");  // used second
  const auto pending = h.engine.pending();
  ASSERT_EQ(pending.size(), 2u);
  // B's write-through lands before A's: neither copy is a use.
  ASSERT_TRUE(h.engine.complete(pending[1]));
  h.cache->poll();
  ASSERT_INVARIANTS(h);
  ASSERT_TRUE(h.engine.complete(pending[0]));
  h.cache->poll();
  ASSERT_INVARIANTS(h);
  // Evicting one node's KV evicts the least recently used: A.
  auto kv = h.cache->evict({1, 0, Tier::kGpu});
  ASSERT_TRUE(kv);
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->match(a).host_tokens, 8u) << "A was used first and must go first";
  EXPECT_EQ(h.cache->match(b).host_tokens, 0u);
  // The same for snapshots (pages of the one GPU pool, their own order).
  auto snap = h.cache->evict({0, 1, Tier::kGpu});
  ASSERT_TRUE(snap);
  EXPECT_EQ(snap->snapshots, 1u);
  ASSERT_INVARIANTS(h);
  EXPECT_FALSE(h.cache->match(a).snapshot_on_gpu);
  EXPECT_TRUE(h.cache->match(b).snapshot_on_gpu);
  auto back = h.serve(a, snaps);
  EXPECT_EQ(back.cached, 8u);
  EXPECT_TRUE(back.bytes_ok);
  ASSERT_INVARIANTS(h);
}

// ---- item 5: capacities and bounds ----------------------------------------------------

TEST(CacheHardeningItem5, CreateRefusesAConfigLargerThanTheEnginesArenas) {
  HostArenas mem(small_config());
  HostTransferEngine engine(mem, 3, HostTransferEngine::Mode::kManual);
  struct Case {
    const char* field;
    void (*mutate)(CacheConfig&);
    const char* mine;
    const char* engines;
  };
  const Case cases[] = {
      {"gpu_pages", [](CacheConfig& c) { c.gpu_pages = 33; }, "33", "32"},
      // The one host pool: 64 KV pages + 8 snapshots x 5 pages = 104 pages in the arena.
      {"host_pages", [](CacheConfig& c) { c.host_pages = 65; }, "65", "104"},
      {"gpu_snapshot_slots", [](CacheConfig& c) { c.gpu_snapshot_slots = 5; }, "5", "4"},
      {"host_snapshot_slots", [](CacheConfig& c) { c.host_snapshot_slots = 9; }, "9", "104"},
      {"page_bytes", [](CacheConfig& c) { c.page_bytes = 64; }, "64", "48"},
      {"snapshot_bytes", [](CacheConfig& c) { c.snapshot_bytes = 100; }, "100", "200"},
  };
  for (const Case& k : cases) {
    CacheConfig c = small_config();
    k.mutate(c);
    auto r = PrefixCache::create(c, engine);
    ASSERT_FALSE(r) << k.field;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    const std::string& m = r.status().message();
    EXPECT_NE(m.find(k.field), std::string::npos) << m;
    EXPECT_NE(m.find(k.mine), std::string::npos) << m;
    EXPECT_NE(m.find(k.engines), std::string::npos) << m;
  }
  // Smaller pools than the arenas are fine: the cache uses the first ids.
  CacheConfig smaller = small_config();
  smaller.gpu_pages = 16;
  smaller.host_snapshot_slots = 2;
  EXPECT_TRUE(PrefixCache::create(smaller, engine));
  EXPECT_TRUE(PrefixCache::create(small_config(), engine));
}

TEST(CacheHardeningItem5, ArenaAccessIsBoundsCheckedInEveryBuild) {
  HostArenas mem(small_config());
  EXPECT_EQ(mem.gpu_page(GpuPageId(31)).size(), 48u);
  EXPECT_THROW((void)mem.gpu_page(GpuPageId(32)), std::out_of_range);
  EXPECT_THROW((void)mem.gpu_page(GpuPageId()), std::out_of_range);
  EXPECT_THROW((void)mem.host_page(HostPageId(104)), std::out_of_range);  // 64 + 8 x 5
  EXPECT_THROW((void)mem.gpu_snapshot(GpuSlotId(4)), std::out_of_range);
  EXPECT_THROW((void)mem.host_snapshot(HostSlotId(8)), std::out_of_range);
  try {
    (void)mem.host_page(HostPageId(110));
    ADD_FAILURE() << "no throw";
  } catch (const std::out_of_range& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("host_page#110"), std::string::npos) << m;
    EXPECT_NE(m.find("104"), std::string::npos) << m;
  }
}

/// A HostTransferEngine that refuses the next submissions, as an engine refuses a batch it
/// cannot run.
class RefusingEngine final : public TransferEngine {
 public:
  RefusingEngine(HostArenas& mem, std::size_t slice)
      : inner_(mem, slice, HostTransferEngine::Mode::kManual) {}
  Result<Ticket> submit(TransferBatch batch) override {
    if (refuse_ > 0) {
      --refuse_;
      return Status(ErrorCode::kInvalidArgument, "the copy queue is shut down");
    }
    auto t = inner_.submit(std::move(batch));
    if (!t) return t.status();
    // Re-issue the ticket against this engine so that reset() comes back here.
    const TicketId id = t->id();
    owned_.push_back(std::move(*t));
    return Ticket(this, id);
  }
  TransferState poll(TicketId id) override { return inner_.poll(id); }
  TransferState wait(TicketId id) override { return inner_.wait(id); }
  void release(TicketId id) override {
    for (auto it = owned_.begin(); it != owned_.end(); ++it) {
      if (it->id() == id) {
        owned_.erase(it);  // the inner ticket waits, then forgets the job
        return;
      }
    }
  }
  std::size_t slice_pages() const override { return inner_.slice_pages(); }
  EngineCapacity capacity() const override { return inner_.capacity(); }

  void refuse(int n) { refuse_ = n; }

 private:
  HostTransferEngine inner_;
  std::vector<Ticket> owned_;
  int refuse_ = 0;
};

TEST(CacheHardeningItem5, TheEnginesRefusalReachesTheCaller) {
  const CacheConfig c = small_config();
  HostArenas mem(c);
  RefusingEngine engine(mem, c.slice_pages);
  auto made = PrefixCache::create(c, engine);
  ASSERT_TRUE(made);
  PrefixCache& cache = **made;
  const auto p = seq({{1, 8}, {9, 1}});
  // Serve p by hand: 2 pages and a snapshot at 8.
  auto a = cache.admit(p);
  ASSERT_TRUE(a);
  auto pages = cache.alloc_pages(a->lock, 2);
  ASSERT_TRUE(pages);
  auto slot = cache.alloc_snapshot_slot(a->lock);
  ASSERT_TRUE(slot);
  ASSERT_TRUE(cache.insert(a->lock, std::span(p).first(8), *pages, *slot));
  ASSERT_TRUE(cache.release(a->lock));
  // A side request (one token: it matches nothing) allocates under pressure.
  const Token one[] = {-1};
  const LockId side = cache.admit(one)->lock;
  // A refused demotion fails the allocation that needed it, with the engine's words.
  engine.refuse(1);
  auto all = cache.alloc_pages(side, c.gpu_pages);
  ASSERT_FALSE(all);
  EXPECT_EQ(all.status().code(), ErrorCode::kTransferFailed);
  EXPECT_NE(all.status().message().find("the copy queue is shut down"), std::string::npos)
      << all.status().to_string();
  EXPECT_EQ(cache.check_invariants(), "");
  // The refused demotion moved nothing, so it lost nothing: p is still on GPU.
  EXPECT_EQ(cache.match(p).usable_tokens, 8u);
  EXPECT_EQ(cache.match(p).host_tokens, 0u);
  // Now demote p for real, then refuse its promotion: admit() fails with the engine's words
  // and p stays on host, whole.
  auto room = cache.alloc_pages(side, c.gpu_pages);
  ASSERT_TRUE(room) << room.status().to_string();
  ASSERT_TRUE(cache.free_pages(side, *room));
  ASSERT_EQ(cache.match(p).host_tokens, 8u);
  const Occupancy before = cache.occupancy();
  engine.refuse(1);
  auto refused = cache.admit(p);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), ErrorCode::kTransferFailed);
  EXPECT_NE(refused.status().message().find("the copy queue is shut down"), std::string::npos)
      << refused.status().to_string();
  EXPECT_EQ(cache.check_invariants(), "");
  EXPECT_EQ(cache.occupancy(), before);
  EXPECT_EQ(cache.match(p).usable_tokens, 8u);
  auto ok = cache.admit(p);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->cached_tokens, 8u);
  auto resumed = cache.wait(ok->lock);
  ASSERT_TRUE(resumed);
  EXPECT_EQ(*resumed, 8u);
  ASSERT_TRUE(cache.release(ok->lock));
  EXPECT_EQ(cache.check_invariants(), "");
}

// ---- item 6: partial failures ---------------------------------------------------------

TEST(CacheHardeningItem6, PollOfAnUnknownLockIsAnErrorNotAFailedCopy) {
  Harness h(small_config());
  auto unknown = h.cache->poll(LockId(12345));
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.status().code(), ErrorCode::kNotFound);
  auto a = h.cache->admit(seq({{1, 9}}));
  ASSERT_TRUE(a);
  auto known = h.cache->poll(a->lock);
  ASSERT_TRUE(known);
  EXPECT_EQ(*known, TransferState::kDone);
  ASSERT_TRUE(h.cache->release(a->lock));
  auto released = h.cache->poll(a->lock);
  ASSERT_FALSE(released);
  EXPECT_EQ(released.status().code(), ErrorCode::kNotFound);
  ASSERT_INVARIANTS(h);
}

TEST(CacheHardeningItem6, FailedSnapshotPromotionResumesAtTheNextUsableBoundary) {
  Harness h(small_config());
  const auto p = seq({{1, 16}, {9, 1}});
  const std::size_t snaps[] = {8, 16};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  demote_all_snapshots(h);  // the KV stays on GPU, both snapshots go to host
  ASSERT_INVARIANTS(h);
  ASSERT_FALSE(h.cache->match(p).snapshot_on_gpu);
  ASSERT_EQ(h.cache->match(p).host_tokens, 0u);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->cached_tokens, 16u);
  ASSERT_TRUE(a->promoting);  // only the snapshot at 16 moves
  const auto pending = h.engine.pending();
  ASSERT_EQ(pending.size(), 2u);  // and the fill of the live slot, ordered after it
  EXPECT_EQ(*h.cache->poll(a->lock), TransferState::kPending);
  h.engine.fail_ticket(pending[0]);
  ASSERT_TRUE(h.engine.complete(pending[0]));
  EXPECT_EQ(*h.cache->poll(a->lock), TransferState::kFailed);  // a failed copy is a state
  ASSERT_INVARIANTS(h);
  auto w = h.cache->wait(a->lock);
  ASSERT_TRUE(w) << w.status().to_string();
  EXPECT_EQ(*w, 8u);
  EXPECT_EQ(*h.cache->poll(a->lock), TransferState::kDone);
  ASSERT_INVARIANTS(h);
  // The KV is good: the request resumes at 8, whose snapshot the cache promoted instead.
  auto table = h.cache->path_pages(a->lock);
  ASSERT_TRUE(table);
  ASSERT_EQ(table->size(), 2u);
  for (std::size_t i = 0; i < table->size(); ++i) EXPECT_TRUE(h.page_ok((*table)[i], p, i));
  auto slot = h.cache->path_snapshot(a->lock);
  ASSERT_TRUE(slot);
  EXPECT_TRUE(h.snapshot_ok(*slot, std::span(p).first(8)));
  // Recomputing 8..16 finds the KV in the tree and gives the tree its snapshot back.
  // (The request's own pages and slot: rule 9.)
  const std::vector<GpuPageId> mine = *h.cache->alloc_pages(a->lock, 2);
  for (std::size_t i = 0; i < 2; ++i) h.fill_page(mine[i], p, 2 + i);
  const GpuSlotId snap = *h.cache->alloc_snapshot_slot(a->lock);
  h.fill_snapshot(snap, std::span(p).first(16));
  std::vector<GpuPageId> full = *table;
  full.insert(full.end(), mine.begin(), mine.end());
  auto ins = h.cache->insert(a->lock, std::span(p).first(16), full, snap);
  ASSERT_TRUE(ins) << ins.status().to_string();
  EXPECT_EQ(ins->not_taken, mine);
  EXPECT_TRUE(ins->snapshot_taken);
  EXPECT_TRUE(h.cache->free_pages(a->lock, mine));
  ASSERT_TRUE(h.cache->release(a->lock));
  ASSERT_INVARIANTS(h);
  auto again = h.serve(p, snaps);
  EXPECT_EQ(again.cached, 16u);
  EXPECT_TRUE(again.bytes_ok);
  ASSERT_INVARIANTS(h);
}

TEST(CacheHardeningItem6, FailedKvPromotionResumesAboveTheLostNode) {
  Harness h(small_config());
  const auto p = seq({{1, 16}, {9, 1}});
  const std::size_t snaps[] = {8, 16};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  // Evict the leaf only (KV and snapshot): [0, 8) stays on GPU, [8, 16) goes to host.
  demote_leaf_below(h, p, 8);
  ASSERT_INVARIANTS(h);
  ASSERT_EQ(h.cache->match(p).host_tokens, 8u);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->cached_tokens, 16u);
  const auto pending = h.engine.pending();
  ASSERT_EQ(pending.size(), 2u);  // the promotion, then the fill of the live slot after it
  h.engine.fail_ticket(pending[0]);
  auto w = h.cache->wait(a->lock);
  ASSERT_TRUE(w) << w.status().to_string();
  EXPECT_EQ(*w, 8u);
  ASSERT_INVARIANTS(h);
  auto table = h.cache->path_pages(a->lock);
  ASSERT_TRUE(table);
  ASSERT_EQ(table->size(), 2u);
  for (std::size_t i = 0; i < table->size(); ++i) EXPECT_TRUE(h.page_ok((*table)[i], p, i));
  auto slot = h.cache->path_snapshot(a->lock);
  ASSERT_TRUE(slot);
  EXPECT_TRUE(h.snapshot_ok(*slot, std::span(p).first(8)));
  ASSERT_TRUE(h.cache->release(a->lock));
  ASSERT_INVARIANTS(h);
  // The failed copy kept the host copy (issue 15 item 5): the next admission can promote it.
  EXPECT_EQ(h.cache->match(p).usable_tokens, 16u);
  EXPECT_EQ(h.cache->match(p).host_tokens, 8u);
}

// ---- item 7: inspect, flush, equality ------------------------------------------------

TEST(CacheHardeningItem7, InspectReportsEveryNodeOnThePathAndChangesNothing) {
  Harness h(small_config());
  const auto p = seq({{1, 16}, {9, 1}});
  const std::size_t snaps[] = {8, 16};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  // [0, 8) stays on GPU, [8, 16) and its snapshot go to host; then an admission starts
  // promoting them.
  demote_leaf_below(h, p, 8);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->promoting);
  const Occupancy occupancy = h.cache->occupancy();
  const CacheStats stats = h.cache->stats();
  const auto pending = h.engine.pending().size();
  const auto path = h.cache->inspect(p);
  ASSERT_EQ(path.size(), 2u);
  const NodeInfo& top = path[0];
  EXPECT_EQ(top.boundary, 8u);
  EXPECT_EQ(top.tokens, 8u);
  EXPECT_EQ(top.matched, 8u);
  EXPECT_EQ(top.kv, Residency::kGpu);
  EXPECT_EQ(top.snapshot, Residency::kGpu);
  EXPECT_EQ(top.kv_copy, Xfer::kNone);
  EXPECT_EQ(top.locks, 1u);
  EXPECT_EQ(top.snapshot_locks, 0u);
  const NodeInfo& leaf = path[1];
  EXPECT_EQ(leaf.boundary, 16u);
  EXPECT_EQ(leaf.kv, Residency::kHost);  // the GPU side is the copy's destination
  EXPECT_EQ(leaf.kv_copy, Xfer::kPromote);
  // Its snapshot was pushed out of the GPU pool with its KV and comes back with it.
  EXPECT_EQ(leaf.snapshot, Residency::kHost);
  EXPECT_EQ(leaf.snapshot_copy, Xfer::kPromote);
  EXPECT_EQ(leaf.locks, 1u);
  EXPECT_EQ(leaf.snapshot_locks, 1u);
  EXPECT_STREQ(to_string(leaf.kv), "host");
  EXPECT_STREQ(to_string(leaf.kv_copy), "promote");
  // A query that ends inside a node reports it as partly matched; other tokens, nothing.
  const auto partial = h.cache->inspect(std::span(p).first(12));
  ASSERT_EQ(partial.size(), 2u);
  EXPECT_EQ(partial[1].matched, 12u);
  EXPECT_EQ(partial[1].boundary, 16u);
  EXPECT_TRUE(h.cache->inspect(seq({{900, 8}})).empty());
  // Read-only.
  EXPECT_EQ(h.cache->occupancy(), occupancy);
  EXPECT_EQ(h.cache->stats(), stats);
  EXPECT_EQ(h.engine.pending().size(), pending);
  ASSERT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->wait(a->lock));
  EXPECT_EQ(h.cache->inspect(p)[1].kv, Residency::kBoth);
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_EQ(h.cache->inspect(p)[1].locks, 0u);
  ASSERT_INVARIANTS(h);
}

TEST(CacheHardeningItem7, FlushDropsEveryUnpinnedCopyOnEveryTier) {
  Harness h(small_config(WritePolicy::kWriteThrough));
  const Occupancy empty = h.cache->occupancy();
  const auto keep = seq({{1, 16}, {9, 1}});
  const std::size_t snaps[] = {8, 16};
  ASSERT_EQ(h.serve(keep, snaps).error, "");
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(h.serve(seq({{Token(1000 * (i + 1)), 24}, {9, 1}}), snaps).error, "");
  }
  demote_all_snapshots(h);  // some snapshots on host only, some on both tiers
  ASSERT_INVARIANTS(h);
  auto a = h.cache->admit(keep);  // pins keep's path; its snapshot at 16 until it is copied
  ASSERT_TRUE(a);
  ASSERT_EQ(a->cached_tokens, 16u);
  ASSERT_TRUE(h.cache->wait(a->lock));
  const auto held = take_pages(h, 2);  // a running request's pages are not the cache's
  // One more request leaves its write-through copies in flight for the flush.
  const std::size_t at8[] = {8};
  ASSERT_EQ(h.serve(seq({{5000, 8}, {9, 1}}), at8).error, "");
  EXPECT_FALSE(h.engine.pending().empty());
  h.cache->flush();
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->in_flight(), 0u);
  // Only the locked path is left: its KV (both tiers). The snapshot it resumed from is in the
  // request's live slot (issue 21), so the cached one is not pinned and goes too.
  const auto path = h.cache->inspect(keep);
  ASSERT_EQ(path.size(), 2u);
  EXPECT_EQ(path[0].kv, Residency::kBoth);
  EXPECT_EQ(path[0].snapshot, Residency::kNone);
  EXPECT_EQ(path[1].kv, Residency::kBoth);
  EXPECT_EQ(path[1].snapshot, Residency::kNone);
  EXPECT_EQ(h.cache->occupancy().nodes, 3u);  // root + the path
  // The path's 4 KV pages and the 2 pages the side request holds.
  EXPECT_EQ(h.cache->occupancy().gpu_pages_free, h.config.gpu_pages - 4 - 2);
  auto table = h.cache->path_pages(a->lock);
  ASSERT_TRUE(table);
  for (std::size_t i = 0; i < table->size(); ++i) EXPECT_TRUE(h.page_ok((*table)[i], keep, i));
  auto slot = h.cache->path_snapshot(a->lock);
  ASSERT_TRUE(slot);
  EXPECT_TRUE(h.snapshot_ok(*slot, std::span(keep).first(16)));
  const CacheStats after_flush = h.cache->stats();
  EXPECT_GT(after_flush.kv_pages_dropped_gpu, 0u);
  EXPECT_GT(after_flush.kv_pages_dropped_host, 0u);
  EXPECT_GT(after_flush.snapshots_dropped, 0u);
  ASSERT_TRUE(h.cache->release(a->lock));
  give_pages(h, held);
  h.cache->flush();
  ASSERT_INVARIANTS(h);
  EXPECT_EQ(h.cache->occupancy(), empty);  // as created
  // Nothing to drop: flush changes nothing, stats included.
  const CacheStats stats = h.cache->stats();
  h.cache->flush();
  EXPECT_EQ(h.cache->stats(), stats);
  EXPECT_EQ(h.cache->occupancy(), empty);
  auto again = h.serve(keep, snaps);
  EXPECT_EQ(again.cached, 0u);
  EXPECT_TRUE(again.bytes_ok);
  ASSERT_INVARIANTS(h);
}

// ---- found by the fuzzer (CI, stop 16) ------------------------------------------------

// Y, admitted with nothing cached, recomputes P's first pages itself while another
// admission (X) promotes P's host copy; Y's insert keeps those pages (the node is
// promoting) and the tree takes Y's deeper pages. X's promotion then fails. Y's wait()
// used to see the tombstone on its path and move Y's lock up to the root, so the tree
// pages Y still reads became evictable and were handed out. Only the reused prefix is
// Y's to wait for; Y reused nothing.
TEST(CacheHardeningFuzz, AnotherAdmissionsFailedPromotionDoesNotMoveALock) {
  Harness h(small_config());
  const auto p = seq({{1, 9}});
  const auto y = seq({{1, 8}, {50, 9}});  // P's first 8 tokens, then its own
  const std::size_t snaps[] = {8};

  auto ya = h.cache->admit(y);  // before P exists: nothing cached
  ASSERT_TRUE(ya);
  ASSERT_EQ(ya->cached_tokens, 0u);
  ASSERT_EQ(h.serve(p, snaps).error, "");
  h.settle();
  demote_all_kv(h);  // P's KV: host only
  ASSERT_INVARIANTS(h);

  auto xa = h.cache->admit(p);  // promotes P's pages; the copy will fail
  ASSERT_TRUE(xa);
  ASSERT_TRUE(xa->promoting);
  const auto pending = h.engine.pending();
  ASSERT_EQ(pending.size(), 2u);  // the promotion, then the fill of the live slot after it
  h.engine.fail_ticket(pending[0]);

  // Y computes all of its 4 pages and inserts them: P's 2 stay Y's, the tree takes 2.
  auto pages = h.cache->alloc_pages(ya->lock, 4);
  ASSERT_TRUE(pages);
  for (std::size_t i = 0; i < 4; ++i) h.fill_page((*pages)[i], y, i);
  const auto y16 = std::span(y).first(16);
  auto ins = h.cache->insert(ya->lock, y16, *pages, std::nullopt);
  ASSERT_TRUE(ins) << ins.status().to_string();
  EXPECT_EQ(ins->not_taken.size(), 2u);
  ASSERT_INVARIANTS(h);

  auto x_resumed = h.cache->wait(xa->lock);  // X's copy failed: it recomputes
  ASSERT_TRUE(x_resumed);
  EXPECT_EQ(*x_resumed, 0u);
  ASSERT_TRUE(h.cache->release(xa->lock));
  auto resumed = h.cache->wait(ya->lock);
  ASSERT_TRUE(resumed);
  EXPECT_EQ(*resumed, 0u);
  ASSERT_INVARIANTS(h);
  const auto path = h.cache->inspect(y16);
  ASSERT_FALSE(path.empty());
  EXPECT_EQ(path.back().boundary, 16u);
  EXPECT_EQ(path.back().locks, 1u) << "Y's own inserted pages lost their lock";

  // Pressure takes everything evictable; Y's pages keep their bytes.
  const auto held = take_pages(h, h.config.gpu_pages - 4);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(h.page_ok((*pages)[i], y, i)) << "page " << i;
  give_pages(h, held);
  ASSERT_TRUE(h.cache->release(ya->lock));
  ASSERT_INVARIANTS(h);
}

// Computing on a prefix that has not arrived is refused, and changes nothing.
TEST(CacheHardeningFuzz, InsertBeforeTheReusedPrefixArrivedIsRefused) {
  Harness h(small_config());
  const auto p = seq({{1, 9}});
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  h.settle();
  demote_all_kv(h);
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->promoting);
  auto pages = h.cache->alloc_pages(a->lock, 2);
  ASSERT_TRUE(pages);
  const auto before = h.cache->occupancy();
  auto ins = h.cache->insert(a->lock, std::span(p).first(8), *pages, std::nullopt);
  ASSERT_FALSE(ins);
  EXPECT_EQ(ins.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(h.cache->occupancy(), before);
  ASSERT_TRUE(h.cache->wait(a->lock));
  ASSERT_TRUE(h.cache->release(a->lock));
  ASSERT_INVARIANTS(h);
}

TEST(CacheHardeningItem7, StatsAndOccupancyCompareByValue) {
  CacheStats a, b;
  EXPECT_EQ(a, b);
  b.host_bytes_peak = 1;
  EXPECT_NE(a, b);
  b = a;
  b.admissions = 3;
  EXPECT_FALSE(a == b);
  const Occupancy o{1, 2, 3, 4, 5};
  Occupancy p = o;
  EXPECT_EQ(o, p);
  p.nodes = 6;
  EXPECT_NE(o, p);
  p = o;
  p.host_slots_free = 0;
  EXPECT_NE(o, p);
}

}  // namespace
}  // namespace radixtier
