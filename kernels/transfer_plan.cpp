// Copy planning for the CUDA transfer engine (see include/radixtier/cuda/transfer_plan.hpp).
// Pure host logic: it builds on machines without CUDA and is unit-tested on the CPU.
#include <algorithm>
#include <string>

#include "radixtier/cuda/transfer_plan.hpp"

namespace radixtier::cuda {

std::size_t DeviceLayout::item_bytes() const {
  std::size_t total = 0;
  for (const auto& s : segments) total += s.bytes;
  return total;
}

Status DeviceLayout::validate(const char* what) const {
  auto bad = [&](const std::string& why) {
    return invalid_argument(std::string(what) + " layout: " + why);
  };
  if (items == 0) return bad("zero items");
  if (segments.empty()) return bad("no segments");
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const auto& s = segments[i];
    const std::string name = "segment " + std::to_string(i);
    if (s.base == 0) return bad(name + " has a null base");
    if (s.bytes == 0) return bad(name + " has zero bytes");
    if (items > 1 && s.item_stride < s.bytes)
      return bad(name + " stride " + std::to_string(s.item_stride) + " < its size " +
                 std::to_string(s.bytes) + " (items would overlap)");
  }
  if (!segment_layers.empty() && segment_layers.size() != segments.size())
    return bad(std::to_string(segment_layers.size()) + " segment layers for " +
               std::to_string(segments.size()) + " segments");
  return Status::ok();
}

std::uint32_t DeviceLayout::layers() const {
  std::uint32_t n = 0;
  for (std::uint32_t l : segment_layers) n = std::max(n, l + 1);
  return n;
}

bool DeviceLayout::aligned_to(std::size_t alignment) const {
  return std::all_of(segments.begin(), segments.end(), [&](const StridedSegment& s) {
    return s.base % alignment == 0 && s.item_stride % alignment == 0 && s.bytes % alignment == 0;
  });
}

DeviceLayout kv_layer_first(std::uintptr_t base, const KvGeometry& g, std::uint32_t pages) {
  DeviceLayout layout;
  layout.items = pages;
  const std::size_t chunk = g.chunk_bytes();
  const std::size_t tensor = chunk * pages;  // one (K or V, layer) tensor [pages, ...]
  for (std::size_t c = 0; c < 2 * std::size_t{g.layers}; ++c) {
    layout.segments.push_back({base + c * tensor, chunk, chunk});
    layout.segment_layers.push_back(static_cast<std::uint32_t>(c % g.layers));
  }
  return layout;
}

DeviceLayout kv_per_layer(std::span<const std::uintptr_t> k_bases,
                          std::span<const std::uintptr_t> v_bases, const KvGeometry& g,
                          std::uint32_t pages) {
  DeviceLayout layout;
  layout.items = pages;
  const std::size_t chunk = g.chunk_bytes();
  // Host page order matches kv_layer_first: all K layers, then all V layers.
  for (std::size_t l = 0; l < k_bases.size(); ++l) {
    layout.segments.push_back({k_bases[l], chunk, chunk});
    layout.segment_layers.push_back(static_cast<std::uint32_t>(l));
  }
  for (std::size_t l = 0; l < v_bases.size(); ++l) {
    layout.segments.push_back({v_bases[l], chunk, chunk});
    layout.segment_layers.push_back(static_cast<std::uint32_t>(l));
  }
  return layout;
}

DeviceLayout contiguous_items(std::uintptr_t base, std::size_t item_bytes, std::uint32_t items) {
  DeviceLayout layout;
  layout.items = items;
  layout.segments.push_back({base, item_bytes, item_bytes});
  return layout;
}

DeviceLayout snapshot_layer_first(std::uintptr_t conv_base, std::uintptr_t state_base,
                                  const GdnGeometry& g, std::uint32_t slots) {
  DeviceLayout layout;
  layout.items = slots;
  const std::size_t conv = g.conv_bytes(), state = g.state_bytes();
  for (std::size_t l = 0; l < g.layers; ++l) {
    layout.segments.push_back({conv_base + l * slots * conv, conv, conv});
    layout.segments.push_back({state_base + l * slots * state, state, state});
  }
  return layout;
}

namespace {

// Appends [device, host, bytes) to out, extending the last piece when both sides continue it
// and the range does not start a new registration chunk. A range that crosses a multiple of
// host_chunk_bytes is split there: one DMA never spans two cudaHostRegister ranges.
void push_piece(std::vector<Piece>& out, std::uintptr_t device, std::size_t host, std::size_t bytes,
                std::size_t host_chunk_bytes) {
  while (bytes > 0) {
    const std::size_t take =
        host_chunk_bytes == 0 ? bytes : std::min(bytes, host_chunk_bytes - host % host_chunk_bytes);
    const bool chunk_start = host_chunk_bytes != 0 && host % host_chunk_bytes == 0;
    if (!out.empty() && !chunk_start) {
      Piece& last = out.back();
      if (last.device + last.bytes == device && last.host_offset + last.bytes == host) {
        last.bytes += take;
        device += take;
        host += take;
        bytes -= take;
        continue;
      }
    }
    out.push_back({device, host, take});
    device += take;
    host += take;
    bytes -= take;
  }
}

}  // namespace

void append_item_pieces(const DeviceLayout& layout, std::span<const ItemPair> pairs,
                        std::size_t host_chunk_bytes, std::vector<Piece>& out) {
  const std::size_t item_bytes = layout.item_bytes();
  for (const ItemPair& p : pairs) {
    std::size_t host = std::size_t{p.host} * item_bytes;
    for (const StridedSegment& s : layout.segments) {
      push_piece(out, s.base + std::size_t{p.device} * s.item_stride, host, s.bytes,
                 host_chunk_bytes);
      host += s.bytes;
    }
  }
}

void append_item_pieces(const DeviceLayout& layout, std::span<const ItemPair> pairs,
                        std::size_t host_chunk_bytes, std::span<const std::uint32_t> segments,
                        std::vector<Piece>& out) {
  std::vector<std::size_t> offset(layout.segments.size());  // of each segment in a host item
  std::size_t at = 0;
  for (std::size_t s = 0; s < layout.segments.size(); ++s) {
    offset[s] = at;
    at += layout.segments[s].bytes;
  }
  const std::size_t item_bytes = at;
  for (const ItemPair& p : pairs) {
    for (std::uint32_t s : segments) {
      const StridedSegment& seg = layout.segments[s];
      push_piece(out, seg.base + std::size_t{p.device} * seg.item_stride,
                 std::size_t{p.host} * item_bytes + offset[s], seg.bytes, host_chunk_bytes);
    }
  }
}

std::size_t for_each_byte_slice(const DeviceLayout& layout, std::span<const ItemPair> pairs,
                                std::size_t host_chunk_bytes, std::size_t slice_bytes,
                                const std::function<bool(std::span<const Piece>)>& emit) {
  if (slice_bytes == 0) return 0;
  std::vector<Piece> item;   // the pieces of one item
  std::vector<Piece> slice;  // the slice being filled
  std::size_t filled = 0, emitted = 0;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    item.clear();
    append_item_pieces(layout, pairs.subspan(i, 1), host_chunk_bytes, item);
    for (Piece piece : item) {
      while (piece.bytes > 0) {
        const std::size_t take = std::min(piece.bytes, slice_bytes - filled);
        slice.push_back({piece.device, piece.host_offset, take});
        piece.device += take;
        piece.host_offset += take;
        piece.bytes -= take;
        filled += take;
        if (filled == slice_bytes) {
          ++emitted;
          if (!emit(slice)) return emitted;
          slice.clear();
          filled = 0;
        }
      }
    }
  }
  if (!slice.empty()) {
    ++emitted;
    emit(slice);
  }
  return emitted;
}

}  // namespace radixtier::cuda
