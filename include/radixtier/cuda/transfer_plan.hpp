// Copy planning for the CUDA transfer engine: pure host logic, no CUDA headers.
//
// A device pool (GPU KV pages or GPU snapshot slots) is described as a list of strided
// segments: item i's segment s lives at `segments[s].base + i * segments[s].item_stride` and
// is `segments[s].bytes` long. This covers every layout serving engines use:
//
//   - one tensor [2, layers, pages, page_size, kv_heads, head_dim] (layer-first, the common
//     GPU layout): 2*layers segments, each `page_size*kv_heads*head_dim*dtype` bytes, stride
//     one chunk, bases `pages` chunks apart;
//   - one K and one V tensor per layer (separate allocations): the same, with any bases;
//   - page-first pools [pages, ...] and snapshot slots: one segment, stride = item bytes;
//   - per-layer recurrent and conv state tensors [layers, slots, ...] for snapshots.
//
// The host pool is always item-first: item i is `item_bytes` contiguous bytes at
// `i * item_bytes`, its segments in order, so one host page is one contiguous copy.
//
// A Piece is a byte range contiguous on both sides. The planner walks the copies of a slice
// item by item, segment by segment, and merges a piece into the previous one whenever both its
// device and host ranges continue the previous piece: runs of consecutive pages become one
// piece in page-first layouts, and adjacent segments of one item merge in any layout. No piece
// crosses a multiple of `host_chunk_bytes` on the host side: a merge stops there, and a
// segment that straddles one (an item larger than, or not dividing, the chunk) is split there
// (the pinned pool registers its memory in chunks, and one DMA must stay inside one
// registration).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::cuda {

struct StridedSegment {
  std::uintptr_t base = 0;      ///< device address of item 0's segment
  std::size_t item_stride = 0;  ///< bytes between the segment of item i and item i+1
  std::size_t bytes = 0;        ///< bytes of the segment per item
};

struct DeviceLayout {
  std::vector<StridedSegment> segments;
  std::uint32_t items = 0;  ///< pages or snapshot slots in the pool
  /// The model layer of each segment (empty: unknown). Set by kv_layer_first and
  /// kv_per_layer; the CUDA engine orders promotions layer by layer with it.
  std::vector<std::uint32_t> segment_layers;

  /// Bytes of one item (the host item size): the sum of the segment sizes.
  std::size_t item_bytes() const;
  /// Rejects empty layouts, zero sizes, null bases, segments whose items overlap and
  /// segment_layers that do not name one layer per segment.
  Status validate(const char* what) const;
  /// 1 + the largest entry of segment_layers; 0 when it is empty.
  std::uint32_t layers() const;
  /// True when every base, stride and size is a multiple of `alignment`.
  bool aligned_to(std::size_t alignment) const;
};

/// Attention KV geometry of one page: all attention layers, K and V.
struct KvGeometry {
  std::uint32_t layers = 0;  ///< full-attention layers
  std::uint32_t page_size = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t dtype_bytes = 0;

  /// Bytes of one (K or V, layer) chunk of one page.
  std::size_t chunk_bytes() const {
    return std::size_t{page_size} * kv_heads * head_dim * dtype_bytes;
  }
  std::size_t page_bytes() const { return 2 * std::size_t{layers} * chunk_bytes(); }
  /// Qwen3-Next-80B: 12 full-attention layers, 2 KV heads of 256, bf16, 64-token pages.
  static KvGeometry qwen3_next(std::uint32_t page_size = 64) { return {12, page_size, 2, 256, 2}; }
};

/// Gated DeltaNet recurrent-state geometry of one snapshot.
struct GdnGeometry {
  std::uint32_t layers = 0;  ///< GDN layers
  std::uint32_t hk = 0, hv = 0, dk = 0, dv = 0, conv_kernel = 0;
  std::uint32_t state_dtype_bytes = 4;  ///< recurrent state (fp32)
  std::uint32_t conv_dtype_bytes = 2;   ///< conv state (bf16)

  std::size_t state_bytes() const { return std::size_t{hv} * dk * dv * state_dtype_bytes; }
  std::size_t conv_bytes() const {
    return (2 * std::size_t{hk} * dk + std::size_t{hv} * dv) * (conv_kernel - 1) * conv_dtype_bytes;
  }
  std::size_t snapshot_bytes() const { return layers * (state_bytes() + conv_bytes()); }
  /// Qwen3-Next-80B: 36 GDN layers, Hk 16, Hv 32, Dk = Dv = 128, conv kernel 4.
  static GdnGeometry qwen3_next() { return {36, 16, 32, 128, 128, 4, 4, 2}; }
};

/// One tensor [2, layers, pages, page_size, kv_heads, head_dim] at `base`.
DeviceLayout kv_layer_first(std::uintptr_t base, const KvGeometry& g, std::uint32_t pages);
/// Separate K and V tensors per layer, each [pages, page_size, kv_heads, head_dim].
DeviceLayout kv_per_layer(std::span<const std::uintptr_t> k_bases,
                          std::span<const std::uintptr_t> v_bases, const KvGeometry& g,
                          std::uint32_t pages);
/// Item-first pool: item i is `item_bytes` contiguous bytes at base + i * item_bytes.
DeviceLayout contiguous_items(std::uintptr_t base, std::size_t item_bytes, std::uint32_t items);
/// Snapshot slots as two tensors: conv state [layers, slots, conv] at `conv_base` and
/// recurrent state [layers, slots, Hv, Dk, Dv] at `state_base`.
DeviceLayout snapshot_layer_first(std::uintptr_t conv_base, std::uintptr_t state_base,
                                  const GdnGeometry& g, std::uint32_t slots);

/// A (device item, host item) pair of one copy.
struct ItemPair {
  std::uint32_t device = 0;
  std::uint32_t host = 0;
};

/// A byte range contiguous on the device and on the host.
struct Piece {
  std::uintptr_t device = 0;
  std::size_t host_offset = 0;  ///< from the host pool's base
  std::size_t bytes = 0;
};

/// Appends the pieces of `pairs` to `out` (not cleared), merging contiguous runs and splitting
/// at every multiple of `host_chunk_bytes` (0: no registration boundary).
void append_item_pieces(const DeviceLayout& layout, std::span<const ItemPair> pairs,
                        std::size_t host_chunk_bytes, std::vector<Piece>& out);
/// The same for the segments `segments` (indices into layout.segments, in the order given)
/// of every item: the pieces of one layer group.
void append_item_pieces(const DeviceLayout& layout, std::span<const ItemPair> pairs,
                        std::size_t host_chunk_bytes, std::span<const std::uint32_t> segments,
                        std::vector<Piece>& out);

/// Number of slices of at most `slice_items` items that `items` items need.
inline std::size_t slice_count(std::size_t items, std::size_t slice_items) {
  return slice_items == 0 ? 0 : (items + slice_items - 1) / slice_items;
}

/// Cuts the pieces of `pairs` into slices of at most `slice_bytes` bytes (a piece larger than
/// the room left is split) and calls `emit` once per slice, in order. `emit` returns false to
/// stop. Memory used: one slice's pieces. Returns the number of slices emitted.
std::size_t for_each_byte_slice(const DeviceLayout& layout, std::span<const ItemPair> pairs,
                                std::size_t host_chunk_bytes, std::size_t slice_bytes,
                                const std::function<bool(std::span<const Piece>)>& emit);

}  // namespace radixtier::cuda
