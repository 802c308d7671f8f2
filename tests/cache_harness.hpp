// Test harness shared by the unit and property tests: a PrefixCache over real byte arenas,
// with a deterministic "model" that writes into each page the bytes a real model would make
// of that prefix (a function of every token up to the page's end), so that any mix-up of
// pages, slots or positions shows as a byte mismatch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "radixtier/cache/prefix_cache.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"

namespace radixtier::testing {

inline std::uint64_t prefix_hash(std::span<const Token> prefix) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (Token t : prefix) {
    h ^= static_cast<std::uint32_t>(t);
    h *= 0x100000001b3ull;
  }
  return h;
}

inline std::byte expected_byte(std::uint64_t h, std::size_t i, std::uint8_t salt) {
  const std::uint64_t x = (h ^ (i * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
  return static_cast<std::byte>((x >> 29) ^ salt);
}

inline CacheConfig small_config(WritePolicy policy = WritePolicy::kWriteBack) {
  CacheConfig c;
  c.page_size = 4;
  c.gpu_pages = 32;
  c.host_pages = 64;
  c.gpu_snapshot_slots = 4;
  c.host_snapshot_slots = 8;
  c.page_bytes = 48;
  c.snapshot_bytes = 200;
  c.slice_pages = 3;
  c.write_policy = policy;
  return c;
}

struct Harness {
  CacheConfig config;
  HostArenas memory;
  HostTransferEngine engine;
  std::unique_ptr<PrefixCache> cache;
  LockId side_;

  explicit Harness(const CacheConfig& c,
                   HostTransferEngine::Mode mode = HostTransferEngine::Mode::kManual)
      : config(c), memory(c), engine(memory, c.slice_pages, mode) {
    auto r = PrefixCache::create(c, engine);
    if (!r) throw std::runtime_error(r.status().to_string());
    cache = std::move(r).value();
  }

  std::uint32_t ps() const { return config.page_size; }

  /// The lock of a "side request" that holds pages and slots a test allocates to put the
  /// cache under pressure (allocation belongs to a request, rule 9). Admitted on first use
  /// with a one-token prompt, so it matches nothing and pins only the root.
  LockId side_lock() {
    if (!side_.valid()) {
      const Token t[] = {-1};
      auto a = cache->admit(t);
      if (!a) throw std::runtime_error(a.status().to_string());
      side_ = a->lock;
    }
    return side_;
  }

  /// Page i of `tokens` as the model would write it.
  void fill_page(GpuPageId id, std::span<const Token> tokens, std::size_t page) {
    const auto h = prefix_hash(tokens.first((page + 1) * ps()));
    auto bytes = memory.gpu_page(id);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = expected_byte(h, i, 0x11);
  }
  bool page_ok(GpuPageId id, std::span<const Token> tokens, std::size_t page) {
    const auto h = prefix_hash(tokens.first((page + 1) * ps()));
    auto bytes = memory.gpu_page(id);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i] != expected_byte(h, i, 0x11)) return false;
    return true;
  }
  void fill_snapshot(GpuSlotId id, std::span<const Token> prefix) {
    const auto h = prefix_hash(prefix);
    auto bytes = memory.gpu_snapshot(id);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = expected_byte(h, i, 0x77);
  }
  bool snapshot_ok(GpuSlotId id, std::span<const Token> prefix) {
    const auto h = prefix_hash(prefix);
    auto bytes = memory.gpu_snapshot(id);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i] != expected_byte(h, i, 0x77)) return false;
    return true;
  }

  struct Served {
    std::size_t cached = 0;
    bool bytes_ok = true;  ///< every reused page and the snapshot had the expected bytes
    std::string error;     ///< a failed call
  };

  /// Serves one request end to end as a scheduler would: admit (re-admitting after a failed
  /// promotion), check the reused bytes, compute the rest in `chunk_pages` chunks, insert
  /// after each chunk with a snapshot at the boundaries in `snapshot_at` (token counts),
  /// then release. Only whole pages are inserted.
  Served serve(std::span<const Token> prompt, std::span<const std::size_t> snapshot_at,
               std::size_t chunk_pages = 2) {
    Served out;
    Admission a;
    for (int attempt = 0;; ++attempt) {
      auto r = cache->admit(prompt);
      if (!r) return {0, true, r.status().to_string()};
      a = *r;
      auto resumed = cache->wait(a.lock);  // less than the match when part of it failed
      if (resumed) {
        a.cached_tokens = *resumed;
        break;
      }
      (void)cache->release(a.lock);
      if (attempt > 8) return {0, true, "promotion kept failing"};
    }
    out.cached = a.cached_tokens;
    std::vector<GpuPageId> table;
    if (a.cached_tokens > 0) {
      auto pages = cache->path_pages(a.lock);
      if (!pages) return {0, false, pages.status().to_string()};
      table = *pages;
      for (std::size_t i = 0; i < table.size(); ++i) out.bytes_ok &= page_ok(table[i], prompt, i);
      auto slot = cache->path_snapshot(a.lock);
      if (!slot) return {0, false, slot.status().to_string()};
      out.bytes_ok &= snapshot_ok(*slot, prompt.first(a.cached_tokens));
    }
    std::vector<GpuPageId> mine;  // pages this request holds (freed at the end)
    const std::size_t whole = prompt.size() / ps();
    std::size_t done = table.size();
    while (done < whole) {
      const std::size_t n = std::min(chunk_pages, whole - done);
      auto pages = cache->alloc_pages(a.lock, n);
      if (!pages) {
        out.error = pages.status().to_string();
        break;
      }
      for (std::size_t i = 0; i < n; ++i) {
        fill_page((*pages)[i], prompt, done + i);
        table.push_back((*pages)[i]);
        mine.push_back((*pages)[i]);
      }
      done += n;
      const std::size_t boundary = done * ps();
      std::optional<GpuSlotId> snap;
      if (std::find(snapshot_at.begin(), snapshot_at.end(), boundary) != snapshot_at.end()) {
        auto slot = cache->alloc_snapshot_slot(a.lock);
        if (slot) {
          fill_snapshot(*slot, prompt.first(boundary));
          snap = *slot;
        }
      }
      auto ins = cache->insert(a.lock, prompt.first(boundary), table, snap);
      if (!ins) {
        out.error = ins.status().to_string();
        if (snap) (void)cache->free_snapshot_slot(a.lock, *snap);
        break;
      }
      // Pages the tree adopted are no longer ours.
      std::vector<GpuPageId> keep;
      for (GpuPageId p : mine)
        if (std::find(ins->not_taken.begin(), ins->not_taken.end(), p) != ins->not_taken.end())
          keep.push_back(p);
      mine = keep;
      if (snap && !ins->snapshot_taken) (void)cache->free_snapshot_slot(a.lock, *snap);
    }
    (void)cache->free_pages(a.lock, mine);
    (void)cache->release(a.lock);
    return out;
  }

  /// Completes every pending copy (manual mode) and reaps it.
  void settle() {
    for (TicketId id : engine.pending()) engine.complete(id);
    cache->poll();
  }
};

inline std::vector<Token> seq(std::initializer_list<std::pair<Token, std::size_t>> runs) {
  std::vector<Token> out;
  for (auto [start, n] : runs)
    for (std::size_t i = 0; i < n; ++i) out.push_back(start + static_cast<Token>(i));
  return out;
}

}  // namespace radixtier::testing
