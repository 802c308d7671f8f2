// The device copies of PrefixCache as tracked transfers (issue 33): the fill of a live slot and
// the materialization of a snapshot at insert are submitted without waiting and reaped by
// poll(); admit() and insert() add no host wait; a fill resuming from a snapshot still being
// materialized runs after it; release() while a fill is in flight leaves the slot to the copy;
// a failed device copy degrades to recompute; stream_wait() hands out the ids early.
#include <gtest/gtest.h>

#include "cache_harness.hpp"

namespace radixtier {
namespace {

using testing::Harness;
using testing::seq;
using testing::small_config;

#define EXPECT_INVARIANTS(h) EXPECT_EQ((h).cache->check_invariants(), "")

/// A harness whose device copies stay pending until the test completes them.
struct DeviceHarness : Harness {
  DeviceHarness() : Harness(small_config()) { engine.set_device_copies_at_submit(false); }
  /// Inserts `p` (whole pages computed by a request) with a snapshot at its end; the lock is
  /// released. Returns the insert's result.
  InsertResult insert_with_snapshot(std::span<const Token> p) {
    auto a = cache->admit(p);
    EXPECT_TRUE(a);
    const std::size_t pages = p.size() / config.page_size;
    auto ids = cache->alloc_pages(a->lock, pages);
    EXPECT_TRUE(ids);
    for (std::size_t i = 0; i < pages; ++i) fill_page((*ids)[i], p, i);
    auto slot = cache->alloc_snapshot_slot(a->lock);
    EXPECT_TRUE(slot);
    fill_snapshot(*slot, p);
    auto ins = cache->insert(a->lock, p, *ids, *slot);
    EXPECT_TRUE(ins);
    EXPECT_TRUE(cache->release(a->lock));
    return *ins;
  }
};

TEST(PrefixCacheDeviceCopies, InsertAndAdmitSubmitTheirCopiesWithoutAHostWait) {
  DeviceHarness h;
  const auto p = seq({{1, 8}, {9, 1}});
  const auto prefix = std::span(p).first(8);
  const CacheStats s0 = h.cache->stats();
  const InsertResult ins = h.insert_with_snapshot(prefix);
  EXPECT_TRUE(ins.snapshot_taken);  // the slot is the copy's now
  EXPECT_EQ(h.cache->stats().host_waits, s0.host_waits);
  EXPECT_EQ(h.cache->device_copies_in_flight(), 1u);  // the materialization
  EXPECT_EQ(h.cache->inspect(prefix).back().snapshot_copy, Xfer::kMaterialize);
  EXPECT_INVARIANTS(h);
  // An admission resuming from the arriving snapshot: its fill runs after the copy.
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->cached_tokens, 8u);
  EXPECT_TRUE(a->promoting);
  EXPECT_EQ(h.cache->stats().host_waits, s0.host_waits);
  EXPECT_EQ(*h.cache->poll(a->lock), TransferState::kPending);
  EXPECT_EQ(h.cache->path_snapshot(a->lock).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_INVARIANTS(h);
  // Completing the fill first runs the materialization before it (TransferBatch::after).
  const auto pending = h.engine.pending();
  ASSERT_EQ(pending.size(), 2u);
  ASSERT_TRUE(h.engine.complete(pending[1]));
  EXPECT_EQ(*h.cache->poll(a->lock), TransferState::kDone);
  EXPECT_EQ(h.cache->device_copies_in_flight(), 0u);
  auto slot = h.cache->path_snapshot(a->lock);
  ASSERT_TRUE(slot);
  EXPECT_TRUE(h.snapshot_ok(*slot, prefix));
  EXPECT_EQ(h.cache->stats().host_waits, s0.host_waits);
  EXPECT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_INVARIANTS(h);
}

TEST(PrefixCacheDeviceCopies, ReleaseWhileTheFillIsInFlightLeavesTheSlotToTheCopy) {
  DeviceHarness h;
  const auto p = seq({{1, 8}, {9, 1}});
  h.insert_with_snapshot(std::span(p).first(8));
  h.cache->drain();
  const std::uint32_t free_slots = h.cache->occupancy().gpu_slots_free;
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_EQ(h.engine.pending().size(), 1u);  // the fill
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_INVARIANTS(h);
  // The copy still writes the slot: it is not free until it lands (rule 5).
  EXPECT_EQ(h.cache->occupancy().gpu_slots_free, free_slots - 1);
  EXPECT_EQ(h.cache->inspect(p)[0].snapshot_locks, 1u);  // its source stays locked
  ASSERT_TRUE(h.engine.complete(h.engine.pending()[0]));
  h.cache->poll();
  EXPECT_EQ(h.cache->occupancy().gpu_slots_free, free_slots);
  EXPECT_EQ(h.cache->inspect(p)[0].snapshot_locks, 0u);
  EXPECT_INVARIANTS(h);
}

TEST(PrefixCacheDeviceCopies, AFailedMaterializationFailsTheFillAfterItAndResumesAtTheRoot) {
  DeviceHarness h;
  const auto p = seq({{1, 8}, {9, 1}});
  h.engine.fail_nth_submission(0);  // the materialization (the insert's first copy)
  h.insert_with_snapshot(std::span(p).first(8));
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->cached_tokens, 8u);
  auto w = h.cache->wait(a->lock);  // runs both: the fill fails with its source
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, 0u);  // recompute: never the poisoned bytes
  EXPECT_EQ(*h.cache->poll(a->lock), TransferState::kDone);
  EXPECT_EQ(h.cache->path_snapshot(a->lock).status().code(), ErrorCode::kNotFound);
  EXPECT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_FALSE(h.cache->match(p).snapshot_on_gpu);
  EXPECT_INVARIANTS(h);
}

TEST(PrefixCacheDeviceCopies, AFailedFillAloneResumesAtTheRootAndKeepsTheCachedSnapshot) {
  DeviceHarness h;
  const auto p = seq({{1, 8}, {9, 1}});
  h.insert_with_snapshot(std::span(p).first(8));
  h.cache->drain();
  h.engine.fail_nth_submission(0);  // the fill
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  auto w = h.cache->wait(a->lock);
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, 0u);
  ASSERT_TRUE(h.cache->release(a->lock));
  EXPECT_TRUE(h.cache->match(p).snapshot_on_gpu);  // the source was intact
  auto again = h.serve(p, {});
  EXPECT_EQ(again.cached, 8u);
  EXPECT_TRUE(again.bytes_ok);
  EXPECT_INVARIANTS(h);
}

TEST(PrefixCacheDeviceCopies, EvictionDoesNotTakeASnapshotWhoseCopyIsInFlight) {
  DeviceHarness h;
  const auto p = seq({{1, 8}, {9, 1}});
  h.insert_with_snapshot(std::span(p).first(8));
  ASSERT_EQ(h.cache->device_copies_in_flight(), 1u);
  // The watermark-free evict() of every snapshot: it lets the copy land first, then demotes.
  auto r = h.cache->evict({0, 4, Tier::kGpu});
  ASSERT_TRUE(r);
  EXPECT_EQ(h.cache->device_copies_in_flight(), 0u);
  EXPECT_INVARIANTS(h);
  h.cache->drain();
  auto again = h.serve(p, {});
  EXPECT_EQ(again.cached, 8u);
  EXPECT_TRUE(again.bytes_ok);
}

TEST(PrefixCacheDeviceCopies, StreamWaitHandsOutTheIdsBeforeTheCopiesLand) {
  DeviceHarness h;
  const auto p = seq({{1, 16}, {9, 1}});
  const std::size_t snaps[] = {16};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  h.cache->drain();
  ASSERT_TRUE(h.cache->evict({16, 1, Tier::kGpu}));  // all of it to host
  h.cache->drain();
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->promoting);
  EXPECT_EQ(h.cache->path_pages(a->lock).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(h.cache->stream_wait(LockId(), nullptr).code(), ErrorCode::kNotFound);
  const CacheStats before = h.cache->stats();
  // The host engine has no streams: it waits (counted), for layer 0's KV batch and the fill.
  ASSERT_TRUE(h.cache->stream_wait(a->lock, nullptr, 0));
  EXPECT_GT(h.cache->stats().host_waits, before.host_waits);
  auto pages = h.cache->path_pages(a->lock);
  auto slot = h.cache->path_snapshot(a->lock);
  ASSERT_TRUE(pages && slot);
  EXPECT_EQ(*h.cache->poll(a->lock), TransferState::kDone);
  for (std::size_t i = 0; i < pages->size(); ++i) EXPECT_TRUE(h.page_ok((*pages)[i], p, i));
  EXPECT_TRUE(h.snapshot_ok(*slot, std::span(p).first(16)));
  EXPECT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(a->lock));
}

TEST(PrefixCacheDeviceCopies, StreamWaitReportsACopyKnownToHaveFailed) {
  DeviceHarness h;
  const auto p = seq({{1, 16}, {9, 1}});
  const std::size_t snaps[] = {16};
  ASSERT_EQ(h.serve(p, snaps).error, "");
  h.cache->drain();
  ASSERT_TRUE(h.cache->evict({16, 1, Tier::kGpu}));
  h.cache->drain();
  h.engine.fail_nth_submission(0);  // the promotion
  auto a = h.cache->admit(p);
  ASSERT_TRUE(a);
  ASSERT_TRUE(h.engine.complete(h.engine.pending()[0]));
  EXPECT_EQ(h.cache->stream_wait(a->lock, nullptr, 0).code(), ErrorCode::kTransferFailed);
  EXPECT_EQ(h.cache->path_pages(a->lock).status().code(), ErrorCode::kFailedPrecondition);
  auto w = h.cache->wait(a->lock);
  ASSERT_TRUE(w);
  EXPECT_LT(*w, 16u);
  EXPECT_INVARIANTS(h);
  ASSERT_TRUE(h.cache->release(a->lock));
}

}  // namespace
}  // namespace radixtier
