// CPU tests of the CUDA engine's copy planning (no CUDA needed): layouts, run merging,
// registration-chunk breaks and byte slicing.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "radixtier/cuda/transfer_plan.hpp"

namespace radixtier::cuda {
namespace {

constexpr std::uintptr_t kBase = 0x10000000;

std::vector<ItemPair> run(std::uint32_t device, std::uint32_t host, std::uint32_t n) {
  std::vector<ItemPair> v;
  for (std::uint32_t i = 0; i < n; ++i) v.push_back({device + i, host + i});
  return v;
}

std::size_t total(const std::vector<Piece>& pieces) {
  std::size_t n = 0;
  for (const Piece& p : pieces) n += p.bytes;
  return n;
}

TEST(CudaPlan, Qwen3NextGeometry) {
  const KvGeometry kv = KvGeometry::qwen3_next();
  EXPECT_EQ(kv.page_bytes(), 24576u * 64);
  EXPECT_EQ(kv.chunk_bytes(), 65536u);
  EXPECT_EQ(GdnGeometry::qwen3_next().snapshot_bytes(), 77266944u);
}

TEST(CudaPlan, LayerFirstLayoutOffsets) {
  const KvGeometry kv = KvGeometry::qwen3_next();
  const DeviceLayout l = kv_layer_first(kBase, kv, 100);
  ASSERT_TRUE(l.validate("kv").is_ok());
  ASSERT_EQ(l.segments.size(), 24u);
  EXPECT_EQ(l.item_bytes(), kv.page_bytes());
  // [2, layers, pages, ...]: V of layer 3 for page 7.
  const StridedSegment& v3 = l.segments[12 + 3];
  EXPECT_EQ(v3.base + 7 * v3.item_stride, kBase + ((1 * 12 + 3) * 100 + 7) * kv.chunk_bytes());
  EXPECT_TRUE(l.aligned_to(16));
}

TEST(CudaPlan, LayerFirstPiecesPerPageAndChunk) {
  const KvGeometry kv = KvGeometry::qwen3_next();
  const DeviceLayout l = kv_layer_first(kBase, kv, 1000);
  std::vector<Piece> pieces;
  append_item_pieces(l, run(10, 20, 128), 0, pieces);
  // The host side of one chunk is strided across pages: no merge is possible.
  EXPECT_EQ(pieces.size(), 128u * 24);
  EXPECT_EQ(total(pieces), 128 * kv.page_bytes());
  EXPECT_EQ(pieces[1].device, l.segments[1].base + 10 * kv.chunk_bytes());
  EXPECT_EQ(pieces[1].host_offset, 20 * kv.page_bytes() + kv.chunk_bytes());
}

TEST(CudaPlan, PageFirstRunsMergeIntoOnePiece) {
  const std::size_t page = 4096;
  const DeviceLayout l = contiguous_items(kBase, page, 1000);
  std::vector<Piece> pieces;
  std::vector<ItemPair> pairs = run(5, 50, 10);
  const auto tail = run(100, 60, 4);  // device jumps, host continues: a new piece
  pairs.insert(pairs.end(), tail.begin(), tail.end());
  pairs.push_back({104, 70});  // device continues, host jumps: a new piece
  append_item_pieces(l, pairs, 0, pieces);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].device, kBase + 5 * page);
  EXPECT_EQ(pieces[0].host_offset, 50 * page);
  EXPECT_EQ(pieces[0].bytes, 10 * page);
  EXPECT_EQ(pieces[1].bytes, 4 * page);
  EXPECT_EQ(pieces[2].bytes, page);
}

TEST(CudaPlan, MergeStopsAtHostRegistrationChunks) {
  const std::size_t page = 4096;
  const DeviceLayout l = contiguous_items(kBase, page, 1000);
  std::vector<Piece> pieces;
  append_item_pieces(l, run(0, 0, 10), 3 * page, pieces);
  ASSERT_EQ(pieces.size(), 4u);  // host pages 0-2, 3-5, 6-8, 9
  EXPECT_EQ(pieces[1].host_offset, 3 * page);
  EXPECT_EQ(pieces[3].bytes, page);
  EXPECT_EQ(total(pieces), 10 * page);
}

TEST(CudaPlan, AdjacentSegmentsOfOneItemMerge) {
  // Two segments laid out back to back inside each device item: one piece per item.
  DeviceLayout l;
  l.items = 8;
  l.segments = {{kBase, 100, 60}, {kBase + 60, 100, 40}};
  std::vector<Piece> pieces;
  append_item_pieces(l, std::vector<ItemPair>{{2, 5}}, 0, pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].device, kBase + 200);
  EXPECT_EQ(pieces[0].host_offset, 500u);
  EXPECT_EQ(pieces[0].bytes, 100u);
}

TEST(CudaPlan, SnapshotByteSlicesAreBounded) {
  const GdnGeometry g = GdnGeometry::qwen3_next();
  const DeviceLayout l = snapshot_layer_first(kBase, kBase + (std::size_t{1} << 32), g, 4);
  ASSERT_TRUE(l.validate("snapshots").is_ok());
  EXPECT_EQ(l.item_bytes(), g.snapshot_bytes());
  const std::size_t slice = 8 * KvGeometry::qwen3_next().page_bytes();
  const std::vector<ItemPair> pairs = {{0, 2}, {3, 0}};
  std::size_t bytes = 0, calls = 0;
  std::size_t host_next[2] = {2 * l.item_bytes(), 0};
  const std::size_t n = for_each_byte_slice(l, pairs, 0, slice, [&](std::span<const Piece> s) {
    std::size_t b = 0;
    for (const Piece& p : s) {
      b += p.bytes;
      // Host bytes are produced in order within each snapshot.
      const int which = p.host_offset >= 2 * l.item_bytes() ? 0 : 1;
      EXPECT_EQ(p.host_offset, host_next[which]);
      host_next[which] += p.bytes;
    }
    EXPECT_LE(b, slice);
    bytes += b;
    ++calls;
    return true;
  });
  EXPECT_EQ(n, calls);
  EXPECT_EQ(bytes, 2 * g.snapshot_bytes());
  EXPECT_EQ(n, (2 * g.snapshot_bytes() + slice - 1) / slice);
}

TEST(CudaPlan, ByteSlicingStopsWhenAsked) {
  const DeviceLayout l = contiguous_items(kBase, 1000, 4);
  std::size_t calls = 0;
  const std::vector<ItemPair> pairs = {{0, 0}, {1, 1}};
  EXPECT_EQ(
      for_each_byte_slice(l, pairs, 0, 300, [&](std::span<const Piece>) { return ++calls < 2; }),
      2u);
  EXPECT_EQ(calls, 2u);
}

TEST(CudaPlan, RejectsBadLayouts) {
  DeviceLayout l;
  EXPECT_FALSE(l.validate("kv").is_ok());  // no items
  l.items = 4;
  EXPECT_FALSE(l.validate("kv").is_ok());  // no segments
  l.segments = {{kBase, 10, 20}};          // items overlap
  const Status s = l.validate("kv");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos);
  l.segments = {{0, 20, 20}};
  EXPECT_FALSE(l.validate("kv").is_ok());  // null base
  l.segments = {{kBase + 4, 20, 20}};
  EXPECT_TRUE(l.validate("kv").is_ok());
  EXPECT_FALSE(l.aligned_to(16));
  EXPECT_EQ(slice_count(129, 128), 2u);
  EXPECT_EQ(slice_count(0, 128), 0u);
}

}  // namespace
}  // namespace radixtier::cuda
