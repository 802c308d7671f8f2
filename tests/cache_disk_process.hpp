// The cache over a real disk store, as one process runs it (tests of the store tier end to
// end): a tiny geometry whose host pool is too small for its prompts, the store's config, a
// Process (arenas, engine, store, cache; destroyed cache first) and the prompts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache_harness.hpp"
#include "radixtier/disk/disk_store.hpp"
#include "radixtier/disk/disk_store_engine.hpp"

namespace radixtier::testing {

constexpr std::size_t kPrompts = 6;
constexpr std::size_t kPromptTokens = 32;  // 8 pages of 4 tokens, a snapshot at the end

/// GPU room for about one prompt and its extension, host room for one prompt's KV and
/// snapshot (8 + 5 pages; a load from disk is staged on host): the earlier prompts have to
/// go to disk.
inline CacheConfig tiny_config() {
  CacheConfig c = small_config();
  // 12 pages of KV and room for two cached snapshots of snapshot_pages() = 5 pages each (issue
  // 21: cached GPU snapshots are pages of the GPU pool; the slots are live slots only), the
  // GPU bytes of the 12 pages and 2 snapshot slots this config had before.
  c.gpu_pages = 12 + 2 * 5;
  c.gpu_snapshot_slots = 2;
  c.host_pages = 16;
  c.host_snapshot_slots = 2;
  return c;
}

inline disk::DiskStoreConfig store_config(const std::string& dir, const CacheConfig& c) {
  disk::DiskStoreConfig d;
  d.directory = dir;
  d.fingerprint.page_tokens = c.page_size;
  d.fingerprint.page_bytes = c.page_bytes;
  d.fingerprint.snapshot_bytes = c.snapshot_bytes;
  d.fingerprint.model_id = "harness-model";
  d.fingerprint.weights_version = "v1";
  d.budget_bytes = 4096 * c.page_bytes;
  d.journal_batch = 16;
  d.io.kind = disk::IoEngineKind::kThreadPool;
  d.io.io_threads = 2;
  return d;
}

/// One process's cache: the harness (arenas, engine, cache) over an open disk store. The
/// cache goes first, then the store engine, then the store (a clean exit).
struct Process {
  std::unique_ptr<disk::DiskStore> store;
  std::unique_ptr<disk::DiskStoreEngine> store_engine;
  std::unique_ptr<Harness> h;
  Status created;

  Process(const CacheConfig& c, const disk::DiskStoreConfig& d) {
    h = std::make_unique<Harness>(c, HostTransferEngine::Mode::kThreaded);
    h->cache.reset();  // the harness's own cache has no store: replace it
    auto s = disk::DiskStore::open(d);
    if (!s) {
      created = s.status();
      return;
    }
    store = std::move(s).value();
    store_engine = std::make_unique<disk::DiskStoreEngine>(*store, h->memory);
    auto made = PrefixCache::create(c, h->engine, store_engine.get());
    if (!made) {
      created = made.status();
      return;
    }
    h->cache = std::move(made).value();
    h->store = store_engine.get();
  }
  ~Process() {
    if (h) h->cache.reset();
    store_engine.reset();
    store.reset();
  }
  PrefixCache& cache() { return *h->cache; }
  /// Lets every copy in flight land (GPU <-> host and host <-> disk).
  void drain() { cache().drain(); }
};

inline std::vector<Token> prompt(std::size_t i) {
  return seq({{static_cast<Token>(1000 * (i + 1)), kPromptTokens}});
}

/// The prompt extended by one page: its usable match is the whole prompt (the snapshot at
/// its end), the last page is computed.
inline std::vector<Token> extended(std::size_t i) {
  auto p = prompt(i);
  for (Token t = 0; t < 4; ++t) p.push_back(static_cast<Token>(7 + t));
  return p;
}

inline const std::size_t kSnapshotAtEnd[] = {kPromptTokens};

/// Serves every prompt once (a snapshot at its end), so that the earlier ones are pushed
/// GPU -> host -> disk by the later ones.
inline void fill(Process& p) {
  for (std::size_t i = 0; i < kPrompts; ++i) {
    const auto q = prompt(i);
    const auto s = p.h->serve(q, kSnapshotAtEnd);
    ASSERT_TRUE(s.error.empty()) << "prompt " << i << ": " << s.error;
    ASSERT_TRUE(s.bytes_ok);
    p.drain();
  }
}

}  // namespace radixtier::testing
