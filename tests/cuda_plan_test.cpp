// CPU tests of the CUDA engine's copy planning (no CUDA needed): layouts, run merging,
// registration-chunk breaks and splits, byte slicing; and the pinned pool's host-memory
// checks (MemAvailable, cgroup limits, NUMA node from sysfs).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "host_memory.hpp"
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

// Every piece lies inside one registration chunk [k * chunk, (k + 1) * chunk).
void expect_inside_chunks(const std::vector<Piece>& pieces, std::size_t chunk) {
  for (const Piece& p : pieces) {
    ASSERT_GT(p.bytes, 0u);
    EXPECT_EQ(p.host_offset / chunk, (p.host_offset + p.bytes - 1) / chunk)
        << "piece at " << p.host_offset << " of " << p.bytes << " B crosses a chunk";
  }
}

TEST(CudaPlan, ItemsStraddlingRegistrationsAreSplit) {
  // 3,000-byte pages, 16 KiB chunks (what the pinned pool does when lcm(item, OS page) is
  // larger than the chunk limit): pages 5 and 10 straddle a boundary.
  const std::size_t page = 3000, chunk = 16384;
  const DeviceLayout l = contiguous_items(kBase, page, 100);
  std::vector<Piece> pieces;
  append_item_pieces(l, run(0, 0, 40), chunk, pieces);
  expect_inside_chunks(pieces, chunk);
  EXPECT_EQ(total(pieces), 40 * page);
  // The run is split exactly at the chunk boundaries: ceil(120000 / 16384) pieces.
  EXPECT_EQ(pieces.size(), (40 * page + chunk - 1) / chunk);
  // Scattered pages: the straddling one is cut in two, the device side follows.
  pieces.clear();
  append_item_pieces(l, std::vector<ItemPair>{{7, 5}}, chunk, pieces);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].host_offset + pieces[0].bytes, chunk);
  EXPECT_EQ(pieces[1].device, pieces[0].device + pieces[0].bytes);
  EXPECT_EQ(pieces[0].bytes + pieces[1].bytes, page);
}

TEST(CudaPlan, LayerFirstSegmentsAreSplitAtRegistrations) {
  // Qwen3-Next pages (1.5 MiB in 64 KiB chunks) with a chunk of 2.5 pages: segments of page
  // 2 straddle; every piece stays inside one registration.
  const KvGeometry kv = KvGeometry::qwen3_next();
  const DeviceLayout l = kv_layer_first(kBase, kv, 64);
  const std::size_t chunk = kv.page_bytes() * 5 / 2 + 4096;
  std::vector<Piece> pieces;
  append_item_pieces(l, run(0, 0, 8), chunk, pieces);
  expect_inside_chunks(pieces, chunk);
  EXPECT_EQ(total(pieces), 8 * kv.page_bytes());
}

TEST(CudaPlan, SnapshotsAcrossSeveralRegistrations) {
  // Snapshots larger than a registration chunk, which does not divide them.
  const GdnGeometry g = GdnGeometry::qwen3_next();
  const DeviceLayout l = snapshot_layer_first(kBase, kBase + (std::size_t{1} << 32), g, 4);
  const std::size_t chunk = (std::size_t{5} << 20) + 4096;
  const std::size_t slice = 8 * KvGeometry::qwen3_next().page_bytes();
  std::size_t bytes = 0;
  for_each_byte_slice(l, std::vector<ItemPair>{{0, 3}, {2, 1}}, chunk, slice,
                      [&](std::span<const Piece> s) {
                        std::vector<Piece> v(s.begin(), s.end());
                        expect_inside_chunks(v, chunk);
                        bytes += total(v);
                        return true;
                      });
  EXPECT_EQ(bytes, 2 * g.snapshot_bytes());
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

TEST(CudaHostMemory, ParsesMeminfoAndCgroupFiles) {
  using namespace detail;
  EXPECT_EQ(
      parse_meminfo_available("MemTotal: 100 kB\nMemFree:  5 kB\nMemAvailable:   23928144 kB\n"),
      std::size_t{23928144} * 1024);
  EXPECT_FALSE(parse_meminfo_available("MemTotal: 100 kB\n").has_value());
  EXPECT_EQ(parse_cgroup_bytes("8589934592\n"), std::size_t{8} << 30);
  EXPECT_FALSE(parse_cgroup_bytes("max\n").has_value());
  EXPECT_FALSE(parse_cgroup_bytes("9223372036854771712\n").has_value());  // v1 unlimited
  EXPECT_FALSE(parse_cgroup_bytes("garbage").has_value());
  EXPECT_EQ(parse_cgroup_inactive_file("anon 5\nfile 9\ninactive_file 4096\nactive_file 1\n"),
            4096u);
  EXPECT_EQ(parse_cgroup_inactive_file("anon 5\n"), 0u);
  auto v2 = parse_memory_cgroup("0::/kubepods/pod1/c1\n");
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->path, "/kubepods/pod1/c1");
  EXPECT_FALSE(v2->v1);
  auto v1 = parse_memory_cgroup("5:cpu,cpuacct:/a\n4:memory:/docker/abc\n0::/\n");
  ASSERT_TRUE(v1.has_value());
  EXPECT_EQ(v1->path, "/docker/abc");
  EXPECT_TRUE(v1->v1);
  EXPECT_FALSE(parse_memory_cgroup("").has_value());
}

TEST(CudaHostMemory, RefusesPoolsTheHostCannotBack) {
  using namespace detail;
  HostMemoryLimits l;
  EXPECT_TRUE(check_host_memory(std::size_t{1} << 50, l).is_ok());  // nothing known
  l.mem_available = std::size_t{100} << 30;
  EXPECT_TRUE(check_host_memory(std::size_t{90} << 30, l).is_ok());
  Status s = check_host_memory(std::size_t{120} << 30, l);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(s.message().find("MemAvailable"), std::string::npos) << s.message();
  l.cgroup_headroom = std::size_t{40} << 30;
  l.cgroup = "/sys/fs/cgroup/kubepods/pod1";
  l.cgroup_limit = std::size_t{64} << 30;
  s = check_host_memory(std::size_t{50} << 30, l);
  EXPECT_EQ(s.code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(s.message().find("/sys/fs/cgroup/kubepods/pod1"), std::string::npos) << s.message();
  EXPECT_TRUE(check_host_memory(std::size_t{30} << 30, l).is_ok());
  // This machine: whatever its limits, a 1 PiB pool does not fit and 4 KiB does.
  const HostMemoryLimits here = read_host_memory_limits();
  EXPECT_TRUE(here.mem_available.has_value());
  EXPECT_FALSE(check_host_memory(std::size_t{1} << 50, here).is_ok());
  EXPECT_TRUE(check_host_memory(4096, here).is_ok());
}

TEST(CudaHostMemory, NumaNodeFromSysfs) {
  using namespace detail;
  EXPECT_EQ(pci_numa_node_path("0000:3B:00.0"), "/sys/bus/pci/devices/0000:3b:00.0/numa_node");
  EXPECT_EQ(parse_numa_node("1\n"), 1);
  EXPECT_EQ(parse_numa_node("-1\n"), -1);
  EXPECT_EQ(parse_numa_node("x"), -1);
  EXPECT_EQ(parse_numa_node(""), -1);
}

}  // namespace
}  // namespace radixtier::cuda
