// TransferBatch::after on the engines that ship (issue 33): a batch moves no byte before the
// tickets it runs after landed, a failed one fails it, and an id never issued is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cache_harness.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"
#include "sim/counting_transfer_engine.hpp"

namespace radixtier {
namespace {

CacheConfig engine_config() {
  CacheConfig c = testing::small_config();
  c.slice_pages = 2;
  return c;
}

void fill(std::span<std::byte> s, std::uint8_t v) {
  std::fill(s.begin(), s.end(), std::byte{v});
}
bool all(std::span<const std::byte> s, std::byte v) {
  return std::all_of(s.begin(), s.end(), [&](std::byte b) { return b == v; });
}

// host page 0 -> GPU page 0 (a promotion), then GPU page 0 -> live slot 0 (a fill after it).
TransferBatch promote_page0() {
  TransferBatch b;
  b.direction = Direction::kHostToDevice;
  b.pages.push_back({GpuPageId(0), HostPageId(0)});
  return b;
}
TransferBatch fill_slot0(std::vector<TicketId> after) {
  TransferBatch b;
  b.direction = Direction::kDeviceToDevice;
  b.slot_pieces.push_back({GpuSlotId(0), 0, GpuPageId(0), true});
  b.after = std::move(after);
  return b;
}

TEST(HostTransferEngineAfter, ManualCompleteRunsWhatItRunsAfterFirst) {
  const CacheConfig c = engine_config();
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
  fill(mem.host_page(HostPageId(0)), 7);
  fill(mem.gpu_page(GpuPageId(0)), 1);  // stale bytes a fill run first would copy
  auto up = engine.submit(promote_page0());
  ASSERT_TRUE(up);
  auto down = engine.submit(fill_slot0({up->id()}));
  ASSERT_TRUE(down);
  // Completing the dependent first copies the promotion's bytes, not the stale page.
  ASSERT_TRUE(engine.complete(down->id()));
  EXPECT_EQ(engine.poll(up->id()), TransferState::kDone);
  EXPECT_EQ(engine.poll(down->id()), TransferState::kDone);
  EXPECT_TRUE(all(mem.gpu_snapshot(GpuSlotId(0)).first(c.page_bytes), std::byte{7}));
  EXPECT_FALSE(engine.complete(up->id()));  // ran once
}

TEST(HostTransferEngineAfter, AFailedTicketFailsTheOneAfterItAndPoisonsItsDestination) {
  for (auto mode : {HostTransferEngine::Mode::kManual, HostTransferEngine::Mode::kThreaded}) {
    const CacheConfig c = engine_config();
    HostArenas mem(c);
    HostTransferEngine engine(mem, c.slice_pages, mode);
    fill(mem.host_page(HostPageId(0)), 7);
    fill(mem.gpu_snapshot(GpuSlotId(0)), 3);
    engine.fail_nth_submission(0);
    auto up = engine.submit(promote_page0());
    ASSERT_TRUE(up);
    auto down = engine.submit(fill_slot0({up->id()}));
    ASSERT_TRUE(down);
    EXPECT_EQ(engine.wait(down->id()), TransferState::kFailed);
    EXPECT_EQ(engine.wait(up->id()), TransferState::kFailed);
    EXPECT_TRUE(
        all(mem.gpu_snapshot(GpuSlotId(0)).first(c.page_bytes), HostTransferEngine::kPoison));
  }
}

TEST(HostTransferEngineAfter, ThreadedRunsNothingBeforeADelayedTicketItRunsAfter) {
  const CacheConfig c = engine_config();
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kThreaded);
  fill(mem.host_page(HostPageId(0)), 9);
  fill(mem.gpu_page(GpuPageId(0)), 1);
  auto up = engine.submit(promote_page0());
  ASSERT_TRUE(up);
  engine.delay_ticket(up->id());
  auto down = engine.submit(fill_slot0({up->id()}));
  ASSERT_TRUE(down);
  // The worker may have taken the promotion before the delay; either way the fill lands
  // only after it and copies its bytes.
  engine.resume(up->id());
  EXPECT_EQ(engine.wait(down->id()), TransferState::kDone);
  EXPECT_EQ(engine.poll(up->id()), TransferState::kDone);
  EXPECT_TRUE(all(mem.gpu_snapshot(GpuSlotId(0)).first(c.page_bytes), std::byte{9}));
}

TEST(HostTransferEngineAfter, AnIdNeverIssuedIsRefusedAndNothingIsCopied) {
  const CacheConfig c = engine_config();
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
  fill(mem.gpu_page(GpuPageId(0)), 4);
  fill(mem.gpu_snapshot(GpuSlotId(0)), 3);
  auto r = engine.submit(fill_slot0({TicketId(12)}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("never issued"), std::string::npos) << r.status().message();
  EXPECT_TRUE(engine.pending().empty());
  EXPECT_EQ(engine.stats().batches, 0u);
  EXPECT_TRUE(all(mem.gpu_snapshot(GpuSlotId(0)), std::byte{3}));
}

TEST(HostTransferEngineAfter, AReleasedTicketCountsAsLanded) {
  const CacheConfig c = engine_config();
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
  fill(mem.host_page(HostPageId(0)), 6);
  TicketId first;
  {
    auto up = engine.submit(promote_page0());
    ASSERT_TRUE(up);
    first = up->id();
  }  // waited for and released
  auto down = engine.submit(fill_slot0({first}));
  ASSERT_TRUE(down);
  EXPECT_EQ(engine.wait(down->id()), TransferState::kDone);
  EXPECT_TRUE(all(mem.gpu_snapshot(GpuSlotId(0)).first(c.page_bytes), std::byte{6}));
}

TEST(HostTransferEngineAfter, AFailedTicketReleasedBeforeTheOneAfterItRunsStillFailsIt) {
  const CacheConfig c = engine_config();
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
  fill(mem.gpu_snapshot(GpuSlotId(0)), 3);
  engine.fail_nth_submission(0);
  auto up = engine.submit(promote_page0());
  ASSERT_TRUE(up);
  auto down = engine.submit(fill_slot0({up->id()}));
  ASSERT_TRUE(down);
  ASSERT_TRUE(engine.complete(up->id()));
  up->reset();                          // the caller reaped the failure; the fill has not run yet
  fill(mem.gpu_page(GpuPageId(0)), 5);  // the freed page taken and written by someone else
  EXPECT_EQ(engine.wait(down->id()), TransferState::kFailed);
  EXPECT_TRUE(all(mem.gpu_snapshot(GpuSlotId(0)).first(c.page_bytes), HostTransferEngine::kPoison));
}

TEST(CountingTransferEngineAfter, WaitCompletesWhatItRunsAfterAndRefusesUnknownIds) {
  const CacheConfig c = engine_config();
  sim::CountingTransferEngine engine(c, sim::CountingTransferEngine::Completion::kAtWait);
  auto up = engine.submit(promote_page0());
  ASSERT_TRUE(up);
  auto down = engine.submit(fill_slot0({up->id()}));
  ASSERT_TRUE(down);
  EXPECT_EQ(engine.poll(up->id()), TransferState::kPending);
  EXPECT_EQ(engine.wait(down->id()), TransferState::kDone);
  EXPECT_EQ(engine.poll(up->id()), TransferState::kDone);  // landed first
  auto bad = engine.submit(fill_slot0({TicketId(99)}));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine.stats().rejected, 1u);
  EXPECT_EQ(engine.stats().d2d.batches, 1u);  // the refused one counted nothing
}

}  // namespace
}  // namespace radixtier
