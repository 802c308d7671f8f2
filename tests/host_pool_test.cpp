// One host byte budget: snapshots live in pieces of the host page pool (issue 11, part B).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cache_harness.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"
#include "side_request.hpp"
#include "sim/counting_transfer_engine.hpp"

namespace radixtier {
namespace {

CacheConfig piece_config() {
  CacheConfig c;
  c.page_size = 4;
  c.gpu_pages = 4;
  c.host_pages = 8;
  c.gpu_snapshot_slots = 2;
  c.host_snapshot_slots = 1;
  c.page_bytes = 48;
  c.snapshot_bytes = 200;  // 5 pages, the last one partly filled
  c.slice_pages = 2;
  return c;
}

TEST(HostPool, HostBytesFreeIsTheFreePagesOfTheOnePool) {
  testing::Harness h(testing::small_config());
  const std::uint64_t page = h.config.page_bytes;
  EXPECT_EQ(h.cache->host_bytes_free(), std::uint64_t{h.config.host_pool_pages()} * page);
  const std::size_t snaps[] = {8};
  ASSERT_EQ(h.serve(testing::seq({{1, 9}}), snaps).error, "");
  // Everything out of the GPU: its KV and its snapshot now take host pages.
  testing::give_pages(h, testing::take_pages(h, h.config.gpu_pages));
  std::vector<GpuSlotId> slots;
  for (std::uint32_t i = 0; i < h.config.gpu_snapshot_slots; ++i) {
    slots.push_back(testing::take_slot(h));
  }
  for (GpuSlotId s : slots) testing::give_slot(h, s);
  h.cache->drain();
  const std::uint64_t free = h.cache->host_bytes_free();
  EXPECT_LT(free, std::uint64_t{h.config.host_pool_pages()} * page);
  EXPECT_EQ(free, std::uint64_t{h.cache->occupancy().host_pages_free} * page);
  h.cache->drop_host();
  EXPECT_EQ(h.cache->host_bytes_free(), std::uint64_t{h.config.host_pool_pages()} * page);
  ASSERT_EQ(h.cache->check_invariants(), "");
}

TEST(HostPool, SnapshotPagesAndPoolSize) {
  const CacheConfig c = piece_config();
  EXPECT_EQ(c.snapshot_pages(), 5u);
  EXPECT_EQ(c.host_pool_pages(), 8u + 5u);
}

TEST(HostPool, SnapshotPiecesRoundTripThroughScatteredHostPages) {
  const CacheConfig c = piece_config();
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
  auto slot = mem.gpu_snapshot(GpuSlotId(1));
  std::iota(reinterpret_cast<unsigned char*>(slot.data()),
            reinterpret_cast<unsigned char*>(slot.data()) + slot.size(), 1);
  const std::vector<std::byte> want(slot.begin(), slot.end());
  // Five host pages, out of order and not contiguous, the last beyond host_pages.
  const std::uint32_t pages[5] = {12, 3, 7, 0, 10};
  TransferBatch down;
  down.direction = Direction::kDeviceToHost;
  for (std::size_t i = 0; i < 5; ++i)
    down.pieces.push_back({GpuSlotId(1), i * c.page_bytes, HostPageId(pages[i])});
  auto t = engine.submit(std::move(down));
  ASSERT_TRUE(t);
  ASSERT_EQ(t->wait(), TransferState::kDone);
  EXPECT_TRUE(
      std::equal(want.begin() + 48, want.begin() + 96, mem.host_page(HostPageId(3)).begin()));
  std::fill(slot.begin(), slot.end(), std::byte{0});
  TransferBatch up;
  up.direction = Direction::kHostToDevice;
  for (std::size_t i = 0; i < 5; ++i)
    up.pieces.push_back({GpuSlotId(0), i * c.page_bytes, HostPageId(pages[i])});
  auto u = engine.submit(std::move(up));
  ASSERT_TRUE(u);
  ASSERT_EQ(u->wait(), TransferState::kDone);
  auto back = mem.gpu_snapshot(GpuSlotId(0));
  EXPECT_TRUE(std::equal(want.begin(), want.end(), back.begin()));
  EXPECT_EQ(engine.stats().bytes_d2h, c.snapshot_bytes);
  EXPECT_EQ(engine.stats().bytes_h2d, c.snapshot_bytes);
}

TEST(HostPool, FailedPieceCopyPoisonsItsDestinationAndBadPiecesAreRejected) {
  const CacheConfig c = piece_config();
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
  engine.fail_nth_submission(0);
  TransferBatch down;
  down.direction = Direction::kDeviceToHost;
  down.pieces.push_back({GpuSlotId(0), 4 * c.page_bytes, HostPageId(2)});
  auto t = engine.submit(std::move(down));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->wait(), TransferState::kFailed);
  auto dst = mem.host_page(HostPageId(2));
  EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + 8,
                          [](std::byte b) { return b == HostTransferEngine::kPoison; }));
  for (SnapshotPieceCopy bad : {SnapshotPieceCopy{GpuSlotId(2), 0, HostPageId(0)},
                                SnapshotPieceCopy{GpuSlotId(0), 0, HostPageId(13)},
                                SnapshotPieceCopy{GpuSlotId(0), 5, HostPageId(0)},
                                SnapshotPieceCopy{GpuSlotId(0), 240, HostPageId(0)}}) {
    TransferBatch b;
    b.pieces.push_back(bad);
    EXPECT_EQ(engine.submit(std::move(b)).status().code(), ErrorCode::kInvalidArgument);
    sim::CountingTransferEngine counting(c);
    TransferBatch b2;
    b2.pieces.push_back(bad);
    if (bad.offset % c.page_bytes == 0) {
      EXPECT_EQ(counting.submit(std::move(b2)).status().code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST(HostPool, CountingEngineCountsPieceBytes) {
  const CacheConfig c = piece_config();
  sim::CountingTransferEngine engine(c);
  TransferBatch down;
  down.direction = Direction::kDeviceToHost;
  for (std::size_t i = 0; i < 5; ++i) down.pieces.push_back({GpuSlotId(0), i * 48, HostPageId(i)});
  ASSERT_TRUE(engine.submit(std::move(down)));
  EXPECT_EQ(engine.stats().d2h.bytes, 200u);
  EXPECT_EQ(engine.stats().d2h.snapshots, 1u);
  EXPECT_EQ(engine.stats().d2h.slices, 3u);  // 5 pieces, 2 per slice
}

}  // namespace
}  // namespace radixtier
