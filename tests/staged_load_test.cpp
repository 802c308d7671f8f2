// Staged loads (issue 25 item 4): a store match larger than the host pool goes store -> a few
// host staging pages -> GPU, a chunk at a time, and lands byte-exact; a chunk that fails
// anywhere in the stream resumes the request shallower with the right bytes and leaks
// nothing. Real bytes throughout (cache_harness.hpp): the memory store keeps what the
// "model" wrote, and a restart poisons every GPU and host byte before the store serves it.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <thread>

#include "cache_harness.hpp"
#include "memory_store_engine.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {
namespace {

using namespace testing;  // the harness and the memory store

#define ASSERT_INVARIANTS(h) ASSERT_EQ((h).cache->check_invariants(), "")

// 64 GPU pages and a host pool of 9 pages (4 + one snapshot of 5 pages: 200 bytes in 48-byte
// pages), slices of 3 pages: the 40-page prompt below is 4x the host pool.
CacheConfig staging_config(std::uint32_t host_pages = 4) {
  CacheConfig c = small_config();
  c.gpu_pages = 64;
  c.host_pages = host_pages;
  c.host_snapshot_slots = 1;
  c.host_free_low_watermark = 0;
  c.host_free_high_watermark = 0;
  return c;
}

// 160 tokens (40 pages), snapshots at 80 and 160: after a restart the tree is two store-only
// nodes of 20 pages, [0, 80) and [80, 160).
const std::vector<Token> kPrompt = seq({{500, 160}, {7, 1}});
constexpr std::size_t kSnaps[] = {80, 160};

struct Rig {
  MemoryStoreEngine store;
  Harness h;
  explicit Rig(const CacheConfig& c = staging_config())
      : store(c, 400), h(c, HostTransferEngine::Mode::kThreaded, &store) {
    store.attach(h.memory);
  }
  /// Puts the whole match on the store only: a cache of the same geometry with host room
  /// serves the prompt and persists it, then this one restarts on the store (its tree is
  /// rebuilt from the records; every GPU and host byte is poisoned first).
  void put_on_store() {
    {
      CacheConfig roomy = h.config;
      roomy.host_pages = 64;
      Harness writer(roomy, HostTransferEngine::Mode::kThreaded, &store);
      store.attach(writer.memory);
      const Harness::Served s = writer.serve(kPrompt, kSnaps, 2);
      ASSERT_EQ(s.error, "");
      ASSERT_TRUE(writer.cache->persist().is_ok());
    }
    store.attach(h.memory);
    ASSERT_TRUE(h.restart(false).is_ok());
    ASSERT_EQ(h.cache->match(kPrompt).usable_tokens, 160u);
    const auto nodes = h.cache->inspect(kPrompt);
    ASSERT_EQ(nodes.size(), 2u);
    for (const NodeInfo& n : nodes) {
      ASSERT_EQ(n.kv, Residency::kNone);
      ASSERT_TRUE(n.kv_on_store);
    }
  }
  /// The match on the store only, admitted while the store holds its reads in flight.
  Admission admit_held() {
    put_on_store();
    store.hold(true);
    auto a = h.cache->admit(kPrompt);
    if (!a) throw std::runtime_error(a.status().to_string());
    return *a;
  }
  /// The store's reads go on (those held and the next ones).
  void let_go() {
    store.hold(false);
    store.release();
  }
  /// Serves the prompt once more: no error, every reused byte right, resumed at `cached`.
  void serve(std::size_t cached) {
    const Harness::Served s = h.serve(kPrompt, kSnaps, 2);
    EXPECT_EQ(s.error, "");
    EXPECT_TRUE(s.bytes_ok);  // every page of the path and the snapshot, byte by byte
    EXPECT_EQ(s.cached, cached);
  }
  /// The record of KV page `page` of the prompt.
  RecordId page_record(std::size_t page) const {
    for (const StoredRecord& r : store.records()) {
      if (r.desc.kind == RecordKind::kKvPage && r.desc.boundary == (page + 1) * 4) return r.id;
    }
    return RecordId();
  }
  RecordId snapshot_record(std::size_t boundary) const {
    for (const StoredRecord& r : store.records()) {
      if (r.desc.kind == RecordKind::kSnapshot && r.desc.boundary == boundary) return r.id;
    }
    return RecordId();
  }
  /// Nothing in flight, nothing leaked: after flush() every pool is free again.
  void expect_no_leak() {
    h.cache->drain();
    ASSERT_INVARIANTS(h);
    EXPECT_EQ(h.cache->in_flight(), 0u);
    h.cache->flush();
    ASSERT_INVARIANTS(h);
    const Occupancy o = h.cache->occupancy();
    EXPECT_EQ(o.gpu_pages_free, h.config.gpu_pages);
    EXPECT_EQ(o.host_pages_free, h.config.host_pool_pages());
    EXPECT_EQ(o.gpu_slots_free, h.config.gpu_snapshot_slots);
    EXPECT_EQ(store.record_count(), 0u);
  }
};

TEST(StagedLoad, AMatchLargerThanTheHostPoolLandsByteExactOnGpu) {
  Rig r;
  r.put_on_store();
  r.serve(160u);
  const CacheStats st = r.h.cache->stats();
  EXPECT_EQ(st.staged_loads, 1u);
  EXPECT_EQ(st.kv_pages_loaded, 40u);
  EXPECT_EQ(st.snapshots_loaded, 1u);
  EXPECT_EQ(st.hit_tokens_store, 160u);
  // Through a window of 9 host pages: chunks of 3 pages (one slice each), never more.
  EXPECT_LE(st.host_bytes_peak, r.h.config.host_pool_pages() * r.h.config.page_bytes);
  EXPECT_GE(st.copies_h2d, 40u / 3);
  ASSERT_INVARIANTS(r.h);
  // The nodes are Gpu + Store: no host copy was kept of what was staged.
  for (const NodeInfo& n : r.h.cache->inspect(kPrompt)) {
    EXPECT_EQ(n.kv, Residency::kGpu);
    EXPECT_TRUE(n.kv_on_store);
  }
  r.expect_no_leak();
}

TEST(StagedLoad, AnyHostPoolThatHoldsTheSnapshotAndAPageServesTheWholeMatch) {
  // Host pools of 6 pages (the snapshot's 5 and one page of KV at a time) and 15 pages are
  // staged through; one of 69 pages holds the match (40 pages and the snapshot): it is loaded
  // whole, as before, and keeps its host copy.
  for (const std::uint32_t host_pages : {1u, 10u, 64u}) {
    Rig r(staging_config(host_pages));
    r.put_on_store();
    r.serve(160u);
    const bool staged = host_pages < 40;
    EXPECT_EQ(r.h.cache->stats().staged_loads, staged ? 1u : 0u) << host_pages;
    for (const NodeInfo& n : r.h.cache->inspect(kPrompt)) {
      EXPECT_EQ(n.kv, staged ? Residency::kGpu : Residency::kBoth) << host_pages;
    }
    r.expect_no_leak();
  }
}

TEST(StagedLoad, PollAloneAdvancesTheLoadToTheEnd) {
  Rig r;
  const Admission a = r.admit_held();  // the first reads stay in flight
  EXPECT_TRUE(a.promoting);
  EXPECT_EQ(a.cached_tokens, 160u);
  ASSERT_EQ(*r.h.cache->poll(a.lock), TransferState::kPending);
  const auto nodes = r.h.cache->inspect(kPrompt);
  EXPECT_EQ(nodes[0].kv_copy, Xfer::kStage);
  EXPECT_EQ(nodes[1].snapshot_copy, Xfer::kStage);
  EXPECT_GT(r.h.cache->in_flight(), 0u);
  ASSERT_INVARIANTS(r.h);  // mid-stream: staging pages, destinations, records
  r.let_go();
  TransferState state = TransferState::kPending;
  for (int i = 0; i < 100000 && state == TransferState::kPending; ++i) {
    state = *r.h.cache->poll(a.lock);
    if (i % 16 == 0) {
      ASSERT_INVARIANTS(r.h);
    }
    std::this_thread::yield();
  }
  ASSERT_EQ(state, TransferState::kDone);
  auto pages = r.h.cache->path_pages(a.lock);
  ASSERT_TRUE(pages.is_ok());
  ASSERT_EQ(pages->size(), 40u);
  for (std::size_t i = 0; i < pages->size(); ++i) EXPECT_TRUE(r.h.page_ok((*pages)[i], kPrompt, i));
  auto slot = r.h.cache->path_snapshot(a.lock);
  ASSERT_TRUE(slot.is_ok());
  EXPECT_TRUE(r.h.snapshot_ok(*slot, std::span<const Token>(kPrompt).first(160)));
  ASSERT_TRUE(r.h.cache->release(a.lock).is_ok());
  r.expect_no_leak();
}

TEST(StagedLoad, ASecondAdmissionRidesOnTheStagedLoad) {
  Rig r;
  const Admission a = r.admit_held();
  auto b = r.h.cache->admit(kPrompt);  // the same path, in flight: nothing more to take
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->cached_tokens, 160u);
  EXPECT_EQ(r.h.cache->stats().staged_loads, 1u);
  r.let_go();
  for (LockId lock : {b->lock, a.lock}) {
    auto resumed = r.h.cache->wait(lock);
    ASSERT_TRUE(resumed.is_ok());
    EXPECT_EQ(*resumed, 160u);
    auto pages = r.h.cache->path_pages(lock);
    ASSERT_TRUE(pages.is_ok());
    for (std::size_t i = 0; i < pages->size(); ++i)
      EXPECT_TRUE(r.h.page_ok((*pages)[i], kPrompt, i));
  }
  ASSERT_TRUE(r.h.cache->release(a.lock).is_ok());
  ASSERT_TRUE(r.h.cache->release(b->lock).is_ok());
  r.expect_no_leak();
}

// Failures mid-stream (rule 7): each fault resumes the request above the node it hits (the
// snapshot at 80 when it is in node 2, [80, 160)) with every byte right, erases only records
// that failed their check (with the rest of their node), and leaves nothing behind. The
// request recomputes what failed and inserts it, so the prompt is then reused whole.
struct Fault {
  const char* what;
  std::function<void(Rig&)> inject;
  std::size_t resumes_at;
  std::uint64_t records_lost;
  std::uint64_t copies_failed;
};

TEST(StagedLoad, AFailureMidStreamResumesAboveItWithTheRightBytes) {
  const Fault faults[] = {
      {"a corrupt record in node 2", [](Rig& r) { r.store.corrupt(r.page_record(30)); }, 80, 20, 0},
      {"a corrupt record in node 1", [](Rig& r) { r.store.corrupt(r.page_record(4)); }, 0, 20, 0},
      // The snapshot is read first, then pages 0-24; page 25 fails (the records stay).
      {"an I/O error", [](Rig& r) { r.store.io_error_next_reads(1, 1 + 25); }, 80, 0, 0},
      // Submits: the snapshot's read, then one per KV chunk of 3 pages: the 9th is chunk 7,
      // pages 21-23, in node 2.
      {"a refused read", [](Rig& r) { r.store.refuse_next(1, 8); }, 80, 0, 0},
      // Copies to GPU in the same order: chunk 7's fails after its first slice with its
      // destination poisoned; none of it may reach the request.
      {"a failed copy", [](Rig& r) { r.h.engine.fail_nth_submission(8); }, 80, 0, 1},
      // The KV all lands; the request resumes from the snapshot at 80 (loaded from the store
      // next) and its insert finds the KV of [80, 160) in the tree.
      {"a corrupt snapshot", [](Rig& r) { r.store.corrupt(r.snapshot_record(160)); }, 80, 1, 0},
  };
  for (const Fault& f : faults) {
    SCOPED_TRACE(f.what);
    Rig r;
    r.put_on_store();
    const std::size_t records = r.store.record_count();
    f.inject(r);
    r.serve(f.resumes_at);
    ASSERT_INVARIANTS(r.h);
    const CacheStats st = r.h.cache->stats();
    EXPECT_EQ(st.staged_loads, 1u);
    EXPECT_EQ(st.store_records_lost, f.records_lost);
    EXPECT_EQ(st.transfers_failed, f.copies_failed);
    EXPECT_EQ(st.store_failures, f.copies_failed == 0 ? 1u : 0u);
    if (f.records_lost == 0) {
      EXPECT_EQ(r.store.record_count(), records);  // an I/O error or a refusal erases nothing
    }
    r.serve(160u);
    r.expect_no_leak();
  }
}

TEST(StagedLoad, ReleasedWhileInFlightTheLoadStillEndsClean) {
  Rig r;
  const Admission a = r.admit_held();
  ASSERT_TRUE(r.h.cache->release(a.lock).is_ok());  // no wait(): the load goes on alone
  ASSERT_INVARIANTS(r.h);
  r.let_go();
  r.h.cache->drain();
  ASSERT_INVARIANTS(r.h);
  EXPECT_EQ(r.h.cache->match(kPrompt).gpu_usable_tokens, 160u);
  r.serve(160u);
  r.expect_no_leak();
}

}  // namespace
}  // namespace radixtier
