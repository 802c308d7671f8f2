// One host byte budget: snapshots live in pieces of the host page pool (issue 11, part B).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

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

// --- device to device: live snapshot slots <-> GPU pages (issue 21) -------------------------

CacheConfig d2d_config() {
  CacheConfig c = piece_config();  // 48-byte pages, 200-byte snapshots: 5 pieces, the last 8 B
  c.gpu_pages = 8;
  c.gpu_snapshot_slots = 3;
  return c;
}

std::vector<SlotPieceCopy> slot_pieces(std::uint32_t slot, std::span<const std::uint32_t> pages,
                                       bool to_slot, std::size_t page_bytes) {
  std::vector<SlotPieceCopy> out;
  for (std::size_t k = 0; k < pages.size(); ++k)
    out.push_back({GpuSlotId(slot), k * page_bytes, GpuPageId(pages[k]), to_slot});
  return out;
}

void fill_pattern(std::span<std::byte> bytes, unsigned seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::byte>((i * 37 + seed) % 251 + 1);
}

/// Every byte of the four arenas.
std::vector<std::byte> all_bytes(HostArenas& m) {
  std::vector<std::byte> out;
  auto add = [&](std::span<const std::byte> s) { out.insert(out.end(), s.begin(), s.end()); };
  for (std::uint32_t i = 0; i < m.gpu_pages(); ++i) add(m.gpu_page(GpuPageId(i)));
  for (std::uint32_t i = 0; i < m.host_pages(); ++i) add(m.host_page(HostPageId(i)));
  for (std::uint32_t i = 0; i < m.gpu_slots(); ++i) add(m.gpu_snapshot(GpuSlotId(i)));
  for (std::uint32_t i = 0; i < m.host_slots(); ++i) add(m.host_snapshot(HostSlotId(i)));
  return out;
}

constexpr std::byte kUntouched{0x5A};

TEST(HostPool, DeviceToDeviceMaterializesASlotIntoPagesAndResumesItIntoAnother) {
  for (auto mode : {HostTransferEngine::Mode::kManual, HostTransferEngine::Mode::kThreaded}) {
    SCOPED_TRACE(mode == HostTransferEngine::Mode::kManual ? "manual" : "threaded");
    const CacheConfig c = d2d_config();
    HostArenas mem(c);
    HostTransferEngine engine(mem, c.slice_pages, mode);
    for (std::uint32_t i = 0; i < c.gpu_pages; ++i) {
      auto page = mem.gpu_page(GpuPageId(i));
      std::fill(page.begin(), page.end(), kUntouched);
    }
    fill_pattern(mem.gpu_snapshot(GpuSlotId(0)), 3);
    fill_pattern(mem.gpu_snapshot(GpuSlotId(1)), 7);
    auto other = mem.gpu_snapshot(GpuSlotId(2));
    std::fill(other.begin(), other.end(), std::byte{0});
    const auto slot1 = mem.gpu_snapshot(GpuSlotId(1));
    const std::vector<std::byte> want(slot1.begin(), slot1.end());
    const std::vector<std::byte> slot0_before(mem.gpu_snapshot(GpuSlotId(0)).begin(),
                                              mem.gpu_snapshot(GpuSlotId(0)).end());
    const auto host_before = [&] {
      std::vector<std::byte> h;
      for (std::uint32_t i = 0; i < mem.host_pages(); ++i) {
        auto p = mem.host_page(HostPageId(i));
        h.insert(h.end(), p.begin(), p.end());
      }
      return h;
    }();

    // Materialize slot 1 into five GPU pages, not ascending.
    const std::uint32_t pages[5] = {6, 1, 4, 0, 3};
    TransferBatch down;
    down.direction = Direction::kDeviceToDevice;
    down.slot_pieces = slot_pieces(1, pages, false, c.page_bytes);
    auto t = engine.submit(std::move(down));
    ASSERT_TRUE(t) << t.status().to_string();
    ASSERT_EQ(t->wait(), TransferState::kDone);
    for (std::size_t k = 0; k < 5; ++k) {
      const std::size_t n = std::min(c.page_bytes, c.snapshot_bytes - k * c.page_bytes);
      auto page = mem.gpu_page(GpuPageId(pages[k]));
      EXPECT_TRUE(std::equal(want.begin() + k * c.page_bytes, want.begin() + k * c.page_bytes + n,
                             page.begin()))
          << "piece " << k;
      // The last piece is 8 bytes: the rest of its page is left as it was.
      EXPECT_TRUE(
          std::all_of(page.begin() + n, page.end(), [](std::byte b) { return b == kUntouched; }))
          << "piece " << k;
    }
    for (std::uint32_t free_page : {2u, 5u, 7u}) {
      auto page = mem.gpu_page(GpuPageId(free_page));
      EXPECT_TRUE(
          std::all_of(page.begin(), page.end(), [](std::byte b) { return b == kUntouched; }));
    }

    // Resume the pages into slot 2, the pieces listed in another order.
    TransferBatch up;
    up.direction = Direction::kDeviceToDevice;
    up.slot_pieces = slot_pieces(2, pages, true, c.page_bytes);
    std::swap(up.slot_pieces[0], up.slot_pieces[4]);
    std::swap(up.slot_pieces[1], up.slot_pieces[2]);
    auto u = engine.submit(std::move(up));
    ASSERT_TRUE(u) << u.status().to_string();
    ASSERT_EQ(u->wait(), TransferState::kDone);
    auto resumed = mem.gpu_snapshot(GpuSlotId(2));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), resumed.begin(), resumed.end()));
    auto slot0 = mem.gpu_snapshot(GpuSlotId(0));
    EXPECT_TRUE(std::equal(slot0_before.begin(), slot0_before.end(), slot0.begin(), slot0.end()));
    auto slot1_after = mem.gpu_snapshot(GpuSlotId(1));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), slot1_after.begin(), slot1_after.end()));
    std::vector<std::byte> host_after;
    for (std::uint32_t i = 0; i < mem.host_pages(); ++i) {
      auto p = mem.host_page(HostPageId(i));
      host_after.insert(host_after.end(), p.begin(), p.end());
    }
    EXPECT_EQ(host_after, host_before);  // nothing went through the host tier

    const HostEngineStats s = engine.stats();
    EXPECT_EQ(s.bytes_d2d, 2 * c.snapshot_bytes);
    EXPECT_EQ(s.bytes_d2h, 0u);
    EXPECT_EQ(s.bytes_h2d, 0u);
    EXPECT_EQ(s.batches, 2u);
    EXPECT_EQ(s.slices, 2u * 3);  // 5 pieces, 2 per slice
    EXPECT_EQ(s.failed, 0u);
  }
}

TEST(HostPool, DeviceToDeviceBatchesOfTheWrongShapeOrWithBadPiecesAreRejectedWhole) {
  const CacheConfig c = d2d_config();
  HostArenas mem(c);
  HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
  sim::CountingTransferEngine counting(c);
  for (std::uint32_t i = 0; i < c.gpu_pages; ++i) fill_pattern(mem.gpu_page(GpuPageId(i)), i);
  for (std::uint32_t i = 0; i < c.gpu_snapshot_slots; ++i)
    fill_pattern(mem.gpu_snapshot(GpuSlotId(i)), 100 + i);
  const std::vector<std::byte> before = all_bytes(mem);
  const SlotPieceCopy good{GpuSlotId(0), 48, GpuPageId(2), false};
  std::vector<std::pair<const char*, TransferBatch>> bad;
  auto d2d = [&](std::initializer_list<SlotPieceCopy> pieces) {
    TransferBatch b;
    b.direction = Direction::kDeviceToDevice;
    b.slot_pieces = {good};
    b.slot_pieces.insert(b.slot_pieces.end(), pieces);
    return b;
  };
  bad.emplace_back("slot out of range", d2d({{GpuSlotId(3), 0, GpuPageId(1), false}}));
  bad.emplace_back("page out of range", d2d({{GpuSlotId(1), 0, GpuPageId(8), true}}));
  bad.emplace_back("offset not a page multiple", d2d({{GpuSlotId(1), 5, GpuPageId(1), false}}));
  bad.emplace_back("offset past the snapshot", d2d({{GpuSlotId(1), 240, GpuPageId(1), true}}));
  bad.emplace_back("offset at the snapshot's end", d2d({{GpuSlotId(1), 200, GpuPageId(1), true}}));
  {
    TransferBatch b = d2d({});
    b.pages.push_back({GpuPageId(0), HostPageId(0)});
    bad.emplace_back("D2D with a page", std::move(b));
  }
  {
    TransferBatch b = d2d({});
    b.snapshots.push_back({GpuSlotId(0), HostSlotId(0)});
    bad.emplace_back("D2D with a snapshot", std::move(b));
  }
  {
    TransferBatch b = d2d({});
    b.pieces.push_back({GpuSlotId(0), 0, HostPageId(0)});
    bad.emplace_back("D2D with a snapshot piece", std::move(b));
  }
  for (Direction dir : {Direction::kDeviceToHost, Direction::kHostToDevice}) {
    TransferBatch b;
    b.direction = dir;
    b.pages.push_back({GpuPageId(0), HostPageId(0)});
    b.slot_pieces.push_back(good);
    bad.emplace_back(
        dir == Direction::kDeviceToHost ? "D2H with a slot piece" : "H2D with a slot piece",
        std::move(b));
  }
  for (auto& [why, batch] : bad) {
    SCOPED_TRACE(why);
    auto r = engine.submit(batch);
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    auto rc = counting.submit(batch);
    EXPECT_EQ(rc.status().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_TRUE(engine.pending().empty());
  EXPECT_EQ(engine.stats().batches, 0u);
  EXPECT_EQ(engine.stats().slices, 0u);
  EXPECT_EQ(engine.stats().bytes_d2d, 0u);
  EXPECT_EQ(all_bytes(mem), before);
  const sim::CountingStats cs = counting.stats();
  EXPECT_EQ(cs.rejected, bad.size());
  EXPECT_EQ(cs.d2d.batches + cs.d2h.batches + cs.h2d.batches, 0u);
  // The good piece alone goes through.
  TransferBatch ok = d2d({});
  auto t = engine.submit(ok);
  ASSERT_TRUE(t) << t.status().to_string();
  EXPECT_EQ(t->wait(), TransferState::kDone);
  EXPECT_TRUE(counting.submit(ok));
  EXPECT_EQ(counting.stats().d2d.batches, 1u);
}

TEST(HostPool, FailedDeviceToDeviceCopyReportsFailedAndPoisonsItsDestinations) {
  const CacheConfig c = d2d_config();
  const std::uint32_t pages[5] = {7, 0, 5, 2, 6};
  auto poisoned = [](std::span<const std::byte> s) {
    return std::all_of(s.begin(), s.end(),
                       [](std::byte b) { return b == HostTransferEngine::kPoison; });
  };
  {  // fail_ticket on a materialization (manual mode: it runs when completed)
    HostArenas mem(c);
    HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kManual);
    engine.set_device_copies_at_submit(false);  // pending until completed, like the others
    fill_pattern(mem.gpu_snapshot(GpuSlotId(1)), 9);
    TransferBatch b;
    b.direction = Direction::kDeviceToDevice;
    b.slot_pieces = slot_pieces(1, pages, false, c.page_bytes);
    auto t = engine.submit(std::move(b));
    ASSERT_TRUE(t);
    engine.fail_ticket(t->id());
    EXPECT_TRUE(engine.complete(t->id()));
    EXPECT_EQ(t->poll(), TransferState::kFailed);
    EXPECT_EQ(t->wait(), TransferState::kFailed);
    for (std::size_t k = 0; k < 5; ++k) {
      const std::size_t n = std::min(c.page_bytes, c.snapshot_bytes - k * c.page_bytes);
      EXPECT_TRUE(poisoned(mem.gpu_page(GpuPageId(pages[k])).first(n))) << "piece " << k;
    }
    const HostEngineStats s = engine.stats();
    EXPECT_EQ(s.failed, 1u);
    EXPECT_EQ(s.bytes_d2d, 0u);
    EXPECT_EQ(s.slices, 1u);  // it failed after its first slice
  }
  {  // fail_nth_submission on a resume, on the worker thread
    HostArenas mem(c);
    HostTransferEngine engine(mem, c.slice_pages, HostTransferEngine::Mode::kThreaded);
    fill_pattern(mem.gpu_snapshot(GpuSlotId(2)), 11);
    engine.fail_nth_submission(1);
    TransferBatch first;  // the 0th submission: fine
    first.direction = Direction::kDeviceToDevice;
    first.slot_pieces = slot_pieces(2, pages, false, c.page_bytes);
    auto t0 = engine.submit(std::move(first));
    ASSERT_TRUE(t0);
    EXPECT_EQ(t0->wait(), TransferState::kDone);
    TransferBatch b;
    b.direction = Direction::kDeviceToDevice;
    b.slot_pieces = slot_pieces(0, pages, true, c.page_bytes);
    auto t = engine.submit(std::move(b));
    ASSERT_TRUE(t);
    EXPECT_EQ(t->wait(), TransferState::kFailed);
    EXPECT_TRUE(poisoned(mem.gpu_snapshot(GpuSlotId(0))));
    const HostEngineStats s = engine.stats();
    EXPECT_EQ(s.failed, 1u);
    EXPECT_EQ(s.bytes_d2d, c.snapshot_bytes);  // the first batch only
  }
}

TEST(HostPool, CountingEngineCountsDeviceToDeviceApart) {
  const CacheConfig c = d2d_config();
  sim::CountingTransferEngine engine(c);
  const std::uint32_t pages[5] = {7, 0, 5, 2, 6};
  TransferBatch b;
  b.direction = Direction::kDeviceToDevice;
  b.slot_pieces = slot_pieces(1, pages, false, c.page_bytes);
  ASSERT_TRUE(engine.submit(std::move(b)));
  TransferBatch half;  // three of the pieces back into slot 0
  half.direction = Direction::kDeviceToDevice;
  half.slot_pieces = slot_pieces(0, std::span(pages).first(3), true, c.page_bytes);
  ASSERT_TRUE(engine.submit(std::move(half)));
  TransferBatch down;  // a demotion still counts as before
  down.direction = Direction::kDeviceToHost;
  down.pages.push_back({GpuPageId(3), HostPageId(4)});
  ASSERT_TRUE(engine.submit(std::move(down)));
  const sim::CountingStats s = engine.stats();
  EXPECT_EQ(s.d2d.batches, 2u);
  EXPECT_EQ(s.d2d.bytes, 200u + 3 * 48u);
  EXPECT_EQ(s.d2d.pages, 8u);
  EXPECT_EQ(s.d2d.snapshots, 2u);
  EXPECT_EQ(s.d2d.slices, 3u + 2u);  // 5 and 3 pieces, 2 per slice
  EXPECT_EQ(s.d2h.batches, 1u);
  EXPECT_EQ(s.d2h.bytes, 48u);
  EXPECT_EQ(s.d2h.pages, 1u);
  EXPECT_EQ(s.d2h.slices, 1u);
  EXPECT_EQ(s.h2d.batches, 0u);
  EXPECT_EQ(s.h2d.bytes, 0u);
  EXPECT_EQ(s.rejected, 0u);
}

}  // namespace
}  // namespace radixtier
