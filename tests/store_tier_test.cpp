// The store tier below host (issue 13 items 1-3): host victims demote to the store instead of
// being dropped, come back store -> host -> GPU byte-exact, survive a restart (the tree is
// rebuilt from the records), and every fault degrades to recompute. Real bytes throughout:
// the harness's model writes a function of the whole prefix into every page and snapshot, the
// memory store copies them, and a restart poisons all GPU and host memory.
#include <gtest/gtest.h>

#include <algorithm>

#include "cache_harness.hpp"
#include "memory_store_engine.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::MemoryStoreEngine;
using testing::seq;
using testing::small_config;

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

// 32 GPU pages, a host pool of 16 pages + 2 snapshots (4 pages each: 200 bytes in 48-byte
// pages), so host fills after a few prompts and its victims must go somewhere.
CacheConfig store_config() {
  CacheConfig c = small_config();
  c.host_pages = 16;
  c.host_snapshot_slots = 2;
  c.host_free_low_watermark = 0;  // on-demand demotion only (the watermark has its own test)
  c.host_free_high_watermark = 0;
  return c;
}

struct Rig {
  MemoryStoreEngine store;
  Harness h;
  explicit Rig(const CacheConfig& c = store_config(), std::uint64_t slots = 400)
      : store(c, slots), h(c, HostTransferEngine::Mode::kThreaded, &store) {
    store.attach(h.memory);
  }
};

// Prompt i: 16 tokens (4 pages) of its own and the token always computed; snapshot at 16.
std::vector<Token> prompt(int i) {
  return seq({{1000 * (i + 1), 16}, {7, 1}});
}
constexpr std::size_t kSnapAt[] = {16};

void serve_all(Rig& r, int from, int to) {
  for (int i = from; i < to; ++i) {
    const Harness::Served s = r.h.serve(prompt(i), kSnapAt, 2);
    ASSERT_EQ(s.error, "") << "prompt " << i;
    ASSERT_TRUE(s.bytes_ok) << "prompt " << i;
    r.h.cache->drain();
    ASSERT_INVARIANTS(r.h) << "prompt " << i;
  }
}

bool on_store(const PrefixCache& cache, const std::vector<Token>& p) {
  const auto nodes = cache.inspect(p);
  if (nodes.empty()) return false;
  for (const NodeInfo& n : nodes) {
    if (!n.kv_on_store) return false;
  }
  return nodes.back().snapshot_on_store;
}

TEST(StoreTier, HostVictimsGoToTheStoreAndComeBackByteExact) {
  Rig r;
  serve_all(r, 0, 20);  // 20 x 4 pages through 32 GPU and 16 host pages
  const CacheStats st = r.h.cache->stats();
  EXPECT_GT(st.kv_pages_stored, 0u);
  EXPECT_GT(st.snapshots_stored, 0u);
  EXPECT_TRUE(on_store(*r.h.cache, prompt(0)));
  // Prompt 0 is on the store only now; it comes back whole.
  const Harness::Served s = r.h.serve(prompt(0), kSnapAt, 2);
  EXPECT_EQ(s.error, "");
  EXPECT_TRUE(s.bytes_ok);
  EXPECT_EQ(s.cached, 16u);
  EXPECT_GE(r.h.cache->stats().kv_pages_loaded, 4u);
  EXPECT_GE(r.h.cache->stats().snapshots_loaded, 1u);
  EXPECT_GE(r.h.cache->stats().hit_tokens_store, 16u);
  ASSERT_INVARIANTS(r.h);
}

TEST(StoreTier, AVictimKeptBelowLeavesWithoutAnotherCopy) {
  // The rule the GPU follows with a clean host copy holds one tier down: prompt 0, loaded back
  // from the store, keeps its records; when host evicts it again it is freed, not rewritten.
  Rig r;
  serve_all(r, 0, 20);
  ASSERT_TRUE(on_store(*r.h.cache, prompt(0)));
  ASSERT_EQ(r.h.serve(prompt(0), kSnapAt, 2).cached, 16u);
  r.h.cache->drain();
  serve_all(r, 20, 40);  // pushes prompt 0 out of GPU and host again
  ASSERT_TRUE(on_store(*r.h.cache, prompt(0)));
  EXPECT_EQ(r.h.cache->inspect(prompt(0)).front().kv, Residency::kNone) << "store only again";
  // Prompt 0's records, by their path hashes: one per page and one snapshot at its end.
  const std::vector<Token> p0 = prompt(0);
  const std::size_t page = r.h.config.page_size;
  std::vector<PathHash> paths;
  PathHash end = PathHash::root();
  for (std::size_t at = 0; at < 16; at += page) {
    end = extend_path(end, std::span<const Token>(p0).subspan(at, page));
    paths.push_back(end);
  }
  std::size_t kv_records = 0, snapshot_records = 0;
  for (const StoredRecord& rec : r.store.records()) {
    if (rec.desc.kind == RecordKind::kSnapshot) {
      snapshot_records += rec.desc.path == end;
    } else {
      kv_records += std::count(paths.begin(), paths.end(), rec.desc.node_path());
    }
  }
  EXPECT_EQ(kv_records, paths.size()) << "prompt 0's pages were written once";
  EXPECT_EQ(snapshot_records, 1u) << "and its snapshot";
  ASSERT_INVARIANTS(r.h);
}

TEST(StoreTier, WithoutAStoreTheSameTrafficLosesThePrefix) {
  // The control: the same config and traffic without a store reuse nothing of prompt 0.
  Harness h(store_config(), HostTransferEngine::Mode::kThreaded);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(h.serve(prompt(i), kSnapAt, 2).error, "");
    h.cache->drain();
  }
  EXPECT_EQ(h.serve(prompt(0), kSnapAt, 2).cached, 0u);
}

TEST(StoreTier, GracefulRestartServesEveryPrefixFromTheStore) {
  Rig r;
  serve_all(r, 0, 6);
  ASSERT_TRUE(r.h.restart(true).is_ok());
  EXPECT_GT(r.h.cache->stats().restored_kv_pages, 0u);
  EXPECT_GT(r.h.cache->stats().restored_snapshots, 0u);
  ASSERT_INVARIANTS(r.h);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(r.h.cache->match(prompt(i)).usable_tokens, 16u) << "prompt " << i;
  }
  for (int i = 0; i < 6; ++i) {
    const Harness::Served s = r.h.serve(prompt(i), kSnapAt, 2);
    EXPECT_EQ(s.error, "") << "prompt " << i;
    EXPECT_TRUE(s.bytes_ok) << "prompt " << i;
    EXPECT_EQ(s.cached, 16u) << "prompt " << i;
    r.h.cache->drain();
    ASSERT_INVARIANTS(r.h);
  }
}

TEST(StoreTier, RestartRebuildsBranchesAsOneTree) {
  // Two prompts sharing 8 tokens, with snapshots at 8 and 16: the rebuilt tree has the
  // shared node, its snapshot and both branches.
  Rig r;
  const auto a = seq({{1, 8}, {100, 8}, {7, 1}});
  const auto b = seq({{1, 8}, {200, 8}, {7, 1}});
  const std::size_t snaps[] = {8, 16};
  ASSERT_EQ(r.h.serve(a, snaps, 2).error, "");
  ASSERT_EQ(r.h.serve(b, snaps, 2).error, "");
  r.h.cache->drain();
  ASSERT_TRUE(r.h.restart(true).is_ok());
  ASSERT_INVARIANTS(r.h);
  const auto nodes = r.h.cache->inspect(b);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].boundary, 8u);
  EXPECT_TRUE(nodes[0].snapshot_on_store);
  const auto shared = seq({{1, 8}, {300, 8}, {7, 1}});
  EXPECT_EQ(r.h.cache->match(shared).usable_tokens, 8u);
  for (const auto& p : {a, b}) {
    const Harness::Served s = r.h.serve(p, snaps, 2);
    EXPECT_TRUE(s.bytes_ok);
    EXPECT_EQ(s.cached, 16u);
  }
}

TEST(StoreTier, CrashKeepsOnlyWhatWasWrittenAndServesItExactly) {
  // No persist(): only what host had demoted to the store survives.
  Rig r;
  serve_all(r, 0, 20);
  const std::size_t records = r.store.record_count();
  ASSERT_GT(records, 0u);
  ASSERT_TRUE(r.h.restart(false).is_ok());
  ASSERT_INVARIANTS(r.h);
  std::size_t reused = 0;
  for (int i = 0; i < 20; ++i) {
    const Harness::Served s = r.h.serve(prompt(i), kSnapAt, 2);
    EXPECT_EQ(s.error, "") << "prompt " << i;
    EXPECT_TRUE(s.bytes_ok) << "prompt " << i;
    reused += s.cached;
    r.h.cache->drain();
    ASSERT_INVARIANTS(r.h);
  }
  EXPECT_GT(reused, 0u);
}

TEST(StoreTier, ACorruptRecordIsRecomputedNeverServed) {
  Rig r;
  serve_all(r, 0, 20);
  ASSERT_TRUE(on_store(*r.h.cache, prompt(0)));
  // Corrupt every record of prompt 0's pages: the record ids are the first ones written.
  const auto records = r.store.records();
  for (const StoredRecord& rec : records) {
    if (rec.desc.kind == RecordKind::kKvPage && rec.desc.tokens.front() == 1000)
      r.store.corrupt(rec.id);
  }
  const Harness::Served s = r.h.serve(prompt(0), kSnapAt, 2);
  EXPECT_EQ(s.error, "");
  EXPECT_TRUE(s.bytes_ok);
  EXPECT_EQ(s.cached, 0u);  // its first page was lost: nothing above it is usable
  EXPECT_GE(r.h.cache->stats().store_records_lost, 1u);
  r.h.cache->drain();
  ASSERT_INVARIANTS(r.h);
  // Recomputed and inserted again: the next request reuses it.
  EXPECT_EQ(r.h.serve(prompt(0), kSnapAt, 2).cached, 16u);
}

TEST(StoreTier, AnIoErrorOnReadKeepsTheRecordForTheNextAdmission) {
  Rig r;
  serve_all(r, 0, 20);
  ASSERT_TRUE(on_store(*r.h.cache, prompt(0)));
  r.store.io_error_next_reads(1);
  const Harness::Served s = r.h.serve(prompt(0), kSnapAt, 2);
  EXPECT_EQ(s.error, "");
  EXPECT_TRUE(s.bytes_ok);
  EXPECT_LT(s.cached, 16u);
  EXPECT_EQ(r.h.cache->stats().store_records_lost, 0u);
  r.h.cache->drain();
  ASSERT_INVARIANTS(r.h);
}

TEST(StoreTier, AFailedWriteDropsTheVictimAsWithoutAStore) {
  Rig r;
  r.store.fail_next_writes(1000);
  serve_all(r, 0, 20);
  EXPECT_GT(r.store.failed_writes, 0u);
  EXPECT_EQ(r.store.record_count(), 0u);
  EXPECT_EQ(r.h.cache->stats().kv_pages_stored, 0u);
  const Harness::Served s = r.h.serve(prompt(0), kSnapAt, 2);
  EXPECT_TRUE(s.bytes_ok);
  EXPECT_EQ(s.cached, 0u);
  ASSERT_INVARIANTS(r.h);
}

TEST(StoreTier, ARefusedLoadFallsBackAndChangesNothingOnTheStore) {
  Rig r;
  serve_all(r, 0, 20);
  const std::size_t records = r.store.record_count();
  r.store.refuse_next(1);
  const Harness::Served s = r.h.serve(prompt(0), kSnapAt, 2);
  EXPECT_EQ(s.error, "");
  EXPECT_TRUE(s.bytes_ok);
  EXPECT_GE(r.store.record_count(), records - 8);  // only room-making erases
  r.h.cache->drain();
  ASSERT_INVARIANTS(r.h);
}

TEST(StoreTier, ALoadInFlightIsPendingUntilItLands) {
  Rig r;
  serve_all(r, 0, 20);
  ASSERT_TRUE(on_store(*r.h.cache, prompt(0)));
  r.store.hold(true);
  const auto p = prompt(0);
  auto a = r.h.cache->admit(p);
  ASSERT_TRUE(a.is_ok());
  EXPECT_TRUE(a->promoting);
  EXPECT_EQ(a->cached_tokens, 16u);
  ASSERT_INVARIANTS(r.h);
  EXPECT_EQ(*r.h.cache->poll(a->lock), TransferState::kPending);
  EXPECT_FALSE(r.h.cache->path_pages(a->lock).is_ok());  // nothing handed out before it lands
  const auto nodes = r.h.cache->inspect(p);
  EXPECT_EQ(nodes.back().kv_copy, Xfer::kLoad);
  r.store.release();
  r.store.hold(false);
  auto resumed = r.h.cache->wait(a->lock);
  ASSERT_TRUE(resumed.is_ok());
  EXPECT_EQ(*resumed, 16u);
  auto pages = r.h.cache->path_pages(a->lock);
  ASSERT_TRUE(pages.is_ok());
  for (std::size_t i = 0; i < pages->size(); ++i) EXPECT_TRUE(r.h.page_ok((*pages)[i], p, i));
  auto slot = r.h.cache->path_snapshot(a->lock);
  ASSERT_TRUE(slot.is_ok());
  EXPECT_TRUE(r.h.snapshot_ok(*slot, std::span<const Token>(p).first(16)));
  ASSERT_TRUE(r.h.cache->release(a->lock).is_ok());
  ASSERT_INVARIANTS(r.h);
}

TEST(StoreTier, ASmallStoreEvictsItsOwnVictimsAndStaysWithinBudget) {
  Rig r(store_config(), 24);  // room for ~3 prompts (4 pages + a 5-slot snapshot each)
  serve_all(r, 0, 30);
  EXPECT_LE(r.store.record_count(), 24u);
  EXPECT_GT(r.store.erased, 0u);  // the store made its own room
  // The most recent victims are the ones kept; every prefix still served is exact.
  for (int i = 0; i < 30; ++i) {
    const Harness::Served s = r.h.serve(prompt(i), kSnapAt, 2);
    ASSERT_TRUE(s.bytes_ok) << "prompt " << i;
    r.h.cache->drain();
    ASSERT_INVARIANTS(r.h);
  }
}

TEST(StoreTier, FlushEmptiesTheStoreToo) {
  Rig r;
  serve_all(r, 0, 20);
  ASSERT_GT(r.store.record_count(), 0u);
  r.h.cache->flush();
  EXPECT_EQ(r.store.record_count(), 0u);
  ASSERT_INVARIANTS(r.h);
  ASSERT_TRUE(r.h.restart(false).is_ok());
  EXPECT_EQ(r.h.cache->occupancy().nodes, 1u);
}

TEST(StoreTier, OnlyTheDefaultNamespaceGoesToTheStore) {
  Rig r;
  r.h.request_options.ns = NamespaceId(3);
  serve_all(r, 0, 20);
  EXPECT_EQ(r.store.record_count(), 0u);
  ASSERT_INVARIANTS(r.h);
}

TEST(StoreTier, AStoreOfAnotherGeometryIsRefused) {
  CacheConfig c = store_config();
  CacheConfig other = c;
  other.page_size = 8;
  MemoryStoreEngine store(other, 100);
  HostArenas memory(c);
  HostTransferEngine engine(memory, c.slice_pages);
  auto made = PrefixCache::create(c, engine, &store);
  ASSERT_FALSE(made.is_ok());
  EXPECT_EQ(made.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("page_size"), std::string::npos);
}

TEST(StoreTier, PersistWritesGpuOnlyDataThroughHost) {
  // A GPU-only prefix (host empty) is on the store after persist().
  Rig r;
  serve_all(r, 0, 1);
  ASSERT_FALSE(on_store(*r.h.cache, prompt(0)));
  ASSERT_TRUE(r.h.cache->persist().is_ok());
  EXPECT_TRUE(on_store(*r.h.cache, prompt(0)));
  EXPECT_GE(r.store.syncs, 1u);
  ASSERT_INVARIANTS(r.h);
  Harness plain(store_config(), HostTransferEngine::Mode::kThreaded);
  EXPECT_EQ(plain.cache->persist().code(), ErrorCode::kFailedPrecondition);
}

TEST(StoreTier, TheHostWatermarkWritesAheadSoRoomRarelyWaits) {
  auto waits = [](double low, double high) {
    CacheConfig c = store_config();
    c.host_pages = 64;
    c.host_free_low_watermark = low;
    c.host_free_high_watermark = high;
    Rig r(c, 1000);
    for (int i = 0; i < 40; ++i) {
      const Harness::Served s = r.h.serve(prompt(i), kSnapAt, 2);
      EXPECT_TRUE(s.bytes_ok);
      r.h.cache->poll();  // a scheduler step: the writes ahead land and are reaped
      r.h.cache->drain();
      EXPECT_EQ(r.h.cache->check_invariants(), "");
    }
    return r.h.cache->stats().store_copy_waits;
  };
  const std::uint64_t off = waits(0, 0);
  const std::uint64_t on = waits(0.15, 0.3);
  EXPECT_GT(off, 0u);
  EXPECT_LT(on, off);
}

TEST(StoreTier, SizesAndEvictCoverTheStore) {
  Rig r;
  serve_all(r, 0, 20);
  const CacheSizes s = r.h.cache->sizes();
  EXPECT_GT(s.store.kv_pages_evictable, 0u);
  EXPECT_GT(s.store.snapshots_evictable, 0u);
  EXPECT_EQ(s.store.kv_pages_locked, 0u);
  auto freed = r.h.cache->evict({1u << 20, 1u << 20, Tier::kStore});
  ASSERT_TRUE(freed.is_ok());
  EXPECT_EQ(freed->kv_pages, s.store.kv_pages_evictable);
  EXPECT_EQ(freed->snapshots, s.store.snapshots_evictable);
  EXPECT_EQ(r.store.record_count(), 0u);
  ASSERT_INVARIANTS(r.h);
  Harness plain(store_config(), HostTransferEngine::Mode::kThreaded);
  EXPECT_EQ(plain.cache->evict({4, 0, Tier::kStore}).status().code(), ErrorCode::kInvalidArgument);
}

TEST(StoreTier, APinNeedsThePrefixInMemory) {
  Rig r;
  serve_all(r, 0, 20);
  ASSERT_TRUE(on_store(*r.h.cache, prompt(0)));
  const auto p = prompt(0);
  auto pinned = r.h.cache->pin(std::span<const Token>(p).first(16));
  ASSERT_FALSE(pinned.is_ok());
  EXPECT_EQ(pinned.status().code(), ErrorCode::kFailedPrecondition);
  ASSERT_INVARIANTS(r.h);
}

TEST(StoreTier, ThePerPathCapDropsStoreSnapshotsToo) {
  // A cap of one snapshot per path with the first snapshot on the store only: attaching a
  // deeper one drops a snapshot from every tier (it used to loop on the store copy).
  CacheConfig c = store_config();
  c.max_snapshots_per_path = 1;
  Rig r(c);
  const auto a = seq({{1, 8}, {7, 1}});
  const std::size_t at8[] = {8};
  ASSERT_EQ(r.h.serve(a, at8, 2).error, "");
  r.h.cache->drain();
  ASSERT_TRUE(r.h.restart(true).is_ok());  // everything on the store only
  const auto b = seq({{1, 8}, {50, 8}, {7, 1}});
  const std::size_t at16[] = {16};
  const Harness::Served s = r.h.serve(b, at16, 2);
  EXPECT_EQ(s.error, "");
  EXPECT_TRUE(s.bytes_ok);
  ASSERT_INVARIANTS(r.h);
}

}  // namespace
}  // namespace radixtier
