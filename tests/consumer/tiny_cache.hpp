// The consumers' cache: a small PrefixCache on the host engine, from installed headers only.
#pragma once

#include <cstdio>
#include <memory>

#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"

struct TinyCache {
  radixtier::CacheConfig config;
  radixtier::HostArenas memory;
  radixtier::HostTransferEngine engine;
  std::unique_ptr<radixtier::PrefixCache> cache;  ///< null when create() failed (said on stderr)

  static radixtier::CacheConfig config_of(std::uint32_t gpu_pages, std::uint32_t host_pages) {
    radixtier::CacheConfig c;
    c.page_size = 4;
    c.gpu_pages = gpu_pages;
    c.host_pages = host_pages;
    c.gpu_snapshot_slots = 2;
    c.host_snapshot_slots = host_pages > 0 ? 2 : 0;
    c.page_bytes = 64;
    c.snapshot_bytes = 128;
    return c;
  }
  TinyCache(std::uint32_t gpu_pages, std::uint32_t host_pages)
      : config(config_of(gpu_pages, host_pages)),
        memory(config),
        engine(memory, config.slice_pages) {
    auto r = radixtier::PrefixCache::create(config, engine);
    if (r) {
      cache = std::move(r).value();
    } else {
      std::fprintf(stderr, "create: %s\n", r.status().to_string().c_str());
    }
  }
};
