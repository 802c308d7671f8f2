#include "radixtier/config.hpp"

#include <cstdint>
#include <string>

namespace radixtier {

const char* to_string(WritePolicy policy) {
  return policy == WritePolicy::kWriteBack ? "write-back" : "write-through";
}

const char* to_string(SnapshotEviction eviction) {
  switch (eviction) {
    case SnapshotEviction::kCostAware:
      return "cost-aware";
    case SnapshotEviction::kLru:
      return "lru";
    case SnapshotEviction::kUtility:
      return "utility";
  }
  return "?";
}

Status CacheConfig::validate() const {
  auto bad = [](const char* field, const char* why) {
    return invalid_argument(std::string("CacheConfig.") + field + ": " + why);
  };
  if (page_size == 0) return bad("page_size", "must be at least 1 token");
  if (gpu_pages == 0) return bad("gpu_pages", "must be at least 1 page");
  if (gpu_snapshot_slots == 0) return bad("gpu_snapshot_slots", "must be at least 1 slot");
  if (page_bytes == 0) return bad("page_bytes", "must be at least 1 byte");
  if (snapshot_bytes == 0) return bad("snapshot_bytes", "must be at least 1 byte");
  if (slice_pages == 0) return bad("slice_pages", "must be at least 1 page");
  // Each pool is one arena of bytes on its engine: a size that wraps would allocate a sliver
  // and be indexed past its end, so every product stays below 2^63 bytes.
  const auto fits = [](std::uint64_t a, std::uint64_t b) {
    std::uint64_t n = 0;
    return !__builtin_mul_overflow(a, b, &n) && n <= std::uint64_t{PTRDIFF_MAX};
  };
  if (page_bytes > PTRDIFF_MAX / 2 || snapshot_bytes > PTRDIFF_MAX / 2)
    return bad(page_bytes > PTRDIFF_MAX / 2 ? "page_bytes" : "snapshot_bytes",
               "must be below 2^62 bytes");
  if (!fits(gpu_pages, page_bytes))
    return bad("page_bytes", "gpu_pages x page_bytes (the GPU pool) reaches 2^63 bytes");
  if (!fits(gpu_snapshot_slots, snapshot_bytes))
    return bad("snapshot_bytes",
               "gpu_snapshot_slots x snapshot_bytes (the live slots) reaches 2^63 bytes");
  if (!fits(slice_pages, page_bytes))
    return bad("slice_pages", "slice_pages x page_bytes (one copy slice) reaches 2^63 bytes");
  if (!fits(host_snapshot_slots, snapshot_pages()) || !fits(host_pool_pages(), page_bytes))
    return bad("host_pages",
               "with host_snapshot_slots, the host pool of page_bytes pages reaches 2^63 bytes");
  if (host_pool_pages() >= std::size_t{0xFFFFFFFFu})
    return bad("host_pages", "with host_snapshot_slots, the host pool exceeds 2^32 - 1 pages");
  if (!(host_pin_share >= 0.0 && host_pin_share <= 1.0))
    return bad("host_pin_share", "must be in [0, 1] (a share of the host pool)");
  if (!(gpu_free_low_watermark >= 0.0 && gpu_free_low_watermark < 1.0))
    return bad("gpu_free_low_watermark", "must be in [0, 1) (a fraction of each GPU pool)");
  if (!(gpu_free_high_watermark >= gpu_free_low_watermark && gpu_free_high_watermark < 1.0))
    return bad("gpu_free_high_watermark",
               "must be in [gpu_free_low_watermark, 1) (a fraction of each GPU pool)");
  if (!(host_free_low_watermark >= 0.0 && host_free_low_watermark < 1.0))
    return bad("host_free_low_watermark", "must be in [0, 1) (a fraction of the host pool)");
  if (!(host_free_high_watermark >= host_free_low_watermark && host_free_high_watermark < 1.0))
    return bad("host_free_high_watermark",
               "must be in [host_free_low_watermark, 1) (a fraction of the host pool)");
  if (write_policy == WritePolicy::kWriteThrough && host_pages == 0)
    return bad("write_policy", "write-through needs a host tier (host_pages > 0)");
  if (std::uint64_t{load_back_min_tokens} > std::uint64_t{gpu_pages} * page_size)
    return bad("load_back_min_tokens",
               ("is " + std::to_string(load_back_min_tokens) + ", more than the " +
                std::to_string(std::uint64_t{gpu_pages} * page_size) +
                " tokens the GPU pool holds: nothing would ever be loaded back")
                   .c_str());
  // The GPU pool holds the running requests' KV and the cached snapshots (snapshot_pages()
  // pages each); the live slots only hold running requests' state, never a cached snapshot.
  // Below one page of KV plus one snapshot, insert() could never materialize a snapshot:
  // every admission would recompute from the root, without an error anywhere.
  const std::size_t per = snapshot_pages();
  if (std::size_t{gpu_pages} < per + 1)
    return bad("gpu_pages",
               ("is " + std::to_string(gpu_pages) +
                " pages; the GPU pool holds the running requests' KV and the cached snapshots (" +
                std::to_string(per) +
                " pages each: snapshot_bytes / page_bytes rounded up), so it cannot hold a page "
                "of KV and one snapshot and would never cache a snapshot: give it at least " +
                std::to_string(per + 1) + " pages (more to keep several requests' KV and " +
                "snapshots), or a smaller snapshot_bytes")
                   .c_str());
  const std::uint64_t snapshots_held = std::uint64_t{gpu_pages} / per + host_pool_pages() / per;
  if (max_snapshots_per_path > snapshots_held)
    return bad("max_snapshots_per_path",
               ("is " + std::to_string(max_snapshots_per_path) + ", more than the " +
                std::to_string(snapshots_held) +
                " snapshots the GPU and host pools can hold together: the cap would never bind")
                   .c_str());
  return Status::ok();
}

}  // namespace radixtier
