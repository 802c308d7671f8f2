// The cache kinds the simulator runs: their names, the CacheConfig each runs with from the
// scenario's (the same bytes), and SGLang's default chunk size (see simulator.hpp).
#include <cstdint>
#include <string>

#include "sim/attention_only_cache.hpp"
#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"

namespace radixtier::sim {

const char* to_string(CacheKind kind) {
  switch (kind) {
    case CacheKind::kNode:
      return "node";
    case CacheKind::kIndex:
      return "index";
    case CacheKind::kGpuOnly:
      return "gpu-only";
    case CacheKind::kIdeal:
      return "ideal";
    case CacheKind::kAttentionOnly:
      return "attention-only";
    case CacheKind::kSglangLike:
      return "sglang-like";
    case CacheKind::kSglangUnified:
      return "sglang-unified";
    case CacheKind::kVllmLike:
      return "vllm-like";
  }
  return "?";
}

Result<CacheKind> parse_cache_kind(std::string_view text) {
  for (CacheKind k : {CacheKind::kNode, CacheKind::kAttentionOnly, CacheKind::kSglangLike,
                      CacheKind::kSglangUnified, CacheKind::kVllmLike, CacheKind::kIndex,
                      CacheKind::kGpuOnly, CacheKind::kIdeal}) {
    if (text == to_string(k)) return k;
  }
  return invalid_argument("unknown cache '" + std::string(text) +
                          "' (known: " + std::string(kCacheKindNames) + ")");
}

CacheConfig config_for(CacheKind kind, const CacheConfig& base) {
  CacheConfig c = base;
  switch (kind) {
    case CacheKind::kGpuOnly:
      c.host_pages = 0;
      c.host_snapshot_slots = 0;
      c.write_policy = WritePolicy::kWriteBack;
      break;
    case CacheKind::kAttentionOnly:
      c = AttentionOnlyCache::twin_config(base);
      break;
    case CacheKind::kSglangLike: {
      // HiCache's two host pools (hi_mamba_radix_cache.py, HiMambaRadixCache.__init__: the
      // same hicache_ratio for MHATokenToKVPoolHost and MambaPoolHost) are each that ratio x
      // their device pool, so the host bytes split as the device pools' bytes do. No host
      // bytes: HiCache off (enable_hierarchical_cache defaults to False).
      const std::uint64_t host = std::uint64_t{base.host_pages} * base.page_bytes +
                                 std::uint64_t{base.host_snapshot_slots} * base.snapshot_bytes;
      const double gpu_states =
          static_cast<double>(base.gpu_snapshot_slots) * static_cast<double>(base.snapshot_bytes);
      const double gpu_all =
          gpu_states + static_cast<double>(base.gpu_pages) * static_cast<double>(base.page_bytes);
      const auto state_bytes = static_cast<std::uint64_t>(
          gpu_all > 0 ? static_cast<double>(host) * gpu_states / gpu_all : 0);
      c.host_snapshot_slots = static_cast<std::uint32_t>(state_bytes / base.snapshot_bytes);
      c.host_pages = static_cast<std::uint32_t>(
          (host - std::uint64_t{c.host_snapshot_slots} * base.snapshot_bytes) / base.page_bytes);
      // hicache_write_policy = write_through (HiCache on: there is a host tier)
      c.write_policy = c.host_pages > 0 ? WritePolicy::kWriteThrough : WritePolicy::kWriteBack;
      c.snapshot_eviction = SnapshotEviction::kLru;  // mamba_lru_list / full_lru_list
      break;
    }
    case CacheKind::kSglangUnified:  // SglangLikeCache's one device buffer, HiCache off
      c.host_pages = 0;
      c.host_snapshot_slots = 0;
      c.snapshot_eviction = SnapshotEviction::kLru;
      break;
    case CacheKind::kVllmLike:  // GPU only (the offloading connector is not modelled)
      c.host_pages = 0;
      c.host_snapshot_slots = 0;
      break;
    case CacheKind::kNode:
    case CacheKind::kIndex:
    case CacheKind::kIdeal:
      break;
  }
  return c;
}

std::size_t sglang_chunk_tokens(double hbm_bytes) {
  const double gib = hbm_bytes / static_cast<double>(kGiB);
  if (gib < 35) return 2048;
  if (gib < 60) return 4096;
  if (gib < 160) return 8192;
  return 16384;
}

std::uint32_t sglang_live_slots_per_request(bool extra_buffer) {
  // mamba_ping_pong_track_buffer_size = 2 if enable_overlap_schedule else 1
  return extra_buffer ? 1 + 2 : 1;
}

}  // namespace radixtier::sim
