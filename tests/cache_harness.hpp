// Test harness shared by the unit and property tests: a PrefixCache over real byte arenas,
// with a deterministic "model" that writes into each page the bytes a real model would make
// of that prefix (a function of every token up to the page's end), so that any mix-up of
// pages, slots or positions shows as a byte mismatch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
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
  // The unit tests pin exact victims of eviction on demand in a 32-page, 4-slot pool, where
  // the default watermarks (rounded up) would keep a page and a slot free ahead of need.
  // watermark_test.cpp sets its own; the property tests and the fuzz corpus keep the default.
  c.gpu_free_low_watermark = 0;
  c.gpu_free_high_watermark = 0;
  return c;
}

/// What a rejected call must leave unchanged (rule 8): occupancy, stats, the match of every
/// known prompt, the copies in flight and check_invariants(). Take it after cache->poll(), so
/// that a finished copy the call would reap anyway is not counted as a change.
struct Fingerprint {
  Occupancy occupancy{};
  CacheStats stats{};
  std::vector<MatchResult> matches;
  std::size_t in_flight = 0;
  std::vector<TicketId> pending;
  std::string invariants;

  static Fingerprint of(const PrefixCache& cache, const HostTransferEngine& engine,
                        std::span<const std::vector<Token>> prompts) {
    Fingerprint f;
    f.occupancy = cache.occupancy();
    f.stats = cache.stats();
    // A refused snapshot slot is counted (CacheStats::snapshot_slot_misses): an observation of
    // the refusal, not a change of the cache's state.
    f.stats.snapshot_slot_misses = 0;
    for (const auto& p : prompts) f.matches.push_back(cache.match(p));
    f.in_flight = cache.in_flight();
    f.pending = engine.pending();
    f.invariants = cache.check_invariants();
    return f;
  }

  /// Empty when equal, else the first part that differs.
  std::string difference(const Fingerprint& o) const {
    // Every field of both structs compares bytewise (no padding, checked here).
    static_assert(std::has_unique_object_representations_v<Occupancy>);
    static_assert(std::has_unique_object_representations_v<CacheStats>);
    if (std::memcmp(&occupancy, &o.occupancy, sizeof occupancy) != 0) return "occupancy changed";
    if (std::memcmp(&stats, &o.stats, sizeof stats) != 0) return "stats changed";
    if (matches.size() != o.matches.size()) return "prompt count changed";
    for (std::size_t i = 0; i < matches.size(); ++i) {
      const MatchResult &a = matches[i], &b = o.matches[i];
      if (a.usable_tokens != b.usable_tokens || a.kv_tokens != b.kv_tokens ||
          a.host_tokens != b.host_tokens || a.snapshot_on_gpu != b.snapshot_on_gpu)
        return "match of known prompt " + std::to_string(i) + " changed";
    }
    if (in_flight != o.in_flight || pending != o.pending) return "copies in flight changed";
    if (invariants != o.invariants) return "check_invariants() changed: " + o.invariants;
    return {};
  }
};

struct Harness {
  CacheConfig config;
  HostArenas memory;
  HostTransferEngine engine;
  std::unique_ptr<PrefixCache> cache;
  LockId side_;
  bool manual_;
  /// The namespace and priority serve() admits with. The bytes the "model" writes depend on
  /// the namespace too (as an adapter's KV differs from the base model's), so a page or a
  /// snapshot shared across namespaces shows as a byte mismatch.
  RequestOptions request_options;

  /// The store tier below host (nullptr: none); not owned, it outlives restart().
  StoreEngine* store = nullptr;

  explicit Harness(const CacheConfig& c,
                   HostTransferEngine::Mode mode = HostTransferEngine::Mode::kManual,
                   StoreEngine* store_tier = nullptr)
      : config(c),
        memory(c),
        engine(memory, c.slice_pages, mode),
        manual_(mode == HostTransferEngine::Mode::kManual),
        store(store_tier) {
    // The unit tests step the GPU-host copies by hand; the device copies (the fill of a live
    // slot, a snapshot's materialization) land as soon as what they run after has, as on a
    // GPU (the engine's default; the property tests complete them in any order instead).
    auto r = PrefixCache::create(c, engine, store);
    if (!r) throw std::runtime_error(r.status().to_string());
    cache = std::move(r).value();
  }

  /// A process restart: the cache goes (after persist() when `graceful`), every byte of GPU
  /// and host memory is poisoned (a new process has none of it), `exited` runs (the moment
  /// between the two processes: a crashed store reopens there) and a new cache is made on
  /// the same store. Returns create()'s status.
  Status restart(bool graceful, const std::function<void()>& exited = {}) {
    Status s = graceful ? cache->persist() : Status::ok();
    side_ = LockId();
    cache.reset();
    for (std::uint32_t i = 0; i < memory.gpu_pages(); ++i)
      std::memset(memory.gpu_page(GpuPageId(i)).data(), 0xDB, memory.page_bytes());
    for (std::uint32_t i = 0; i < memory.host_pages(); ++i)
      std::memset(memory.host_page(HostPageId(i)).data(), 0xDB, memory.page_bytes());
    for (std::uint32_t i = 0; i < memory.gpu_slots(); ++i)
      std::memset(memory.gpu_snapshot(GpuSlotId(i)).data(), 0xDB, memory.snapshot_bytes());
    if (exited) exited();
    auto r = PrefixCache::create(config, engine, store);
    if (!r) return r.status();
    cache = std::move(r).value();
    return s;
  }

  std::uint32_t ps() const { return config.page_size; }
  /// 0 in the default namespace: its bytes are those of a cache without namespaces.
  std::uint64_t salt() const { return request_options.ns.value() * 0xD6E8FEB86659FD93ull; }

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
    const auto h = prefix_hash(tokens.first((page + 1) * ps())) ^ salt();
    auto bytes = memory.gpu_page(id);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = expected_byte(h, i, 0x11);
  }
  bool page_ok(GpuPageId id, std::span<const Token> tokens, std::size_t page) {
    const auto h = prefix_hash(tokens.first((page + 1) * ps())) ^ salt();
    auto bytes = memory.gpu_page(id);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i] != expected_byte(h, i, 0x11)) return false;
    return true;
  }
  void fill_snapshot(GpuSlotId id, std::span<const Token> prefix) {
    const auto h = prefix_hash(prefix) ^ salt();
    auto bytes = memory.gpu_snapshot(id);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = expected_byte(h, i, 0x77);
  }
  bool snapshot_ok(GpuSlotId id, std::span<const Token> prefix) {
    const auto h = prefix_hash(prefix) ^ salt();
    auto bytes = memory.gpu_snapshot(id);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i] != expected_byte(h, i, 0x77)) return false;
    return true;
  }

  struct Served {
    std::size_t cached = 0;
    bool bytes_ok = true;  ///< every reused page and the snapshot had the expected bytes
    std::string error;     ///< a failed call
    /// alloc_pages refused with kOutOfMemory (then `error` holds its message): the request
    /// stopped there, as a scheduler would abort or preempt it.
    bool refused = false;
    /// Manual engine only: what the refused call changed (empty: nothing, as rule 8 and "a
    /// hopeless allocation fails before evicting anything" require).
    std::string refusal_changed;
  };

  static Served failed(bool bytes_ok, std::string error) {
    Served s;
    s.bytes_ok = bytes_ok;
    s.error = std::move(error);
    return s;
  }

  /// poll() until a poll changes nothing more. With a store whose copies finish at once, one
  /// poll() may submit writes ahead of need (the host watermark) that only the next one
  /// reaps; what a rejected call must leave unchanged is measured from here.
  void quiesce() {
    for (int round = 0; round < 64; ++round) {
      const Occupancy occupancy = cache->occupancy();
      const CacheStats stats = cache->stats();
      const std::size_t in_flight = cache->in_flight();
      cache->poll();
      const CacheStats now = cache->stats();
      if (cache->occupancy() == occupancy && cache->in_flight() == in_flight &&
          std::memcmp(&now, &stats, sizeof stats) == 0)
        return;
    }
  }

  Fingerprint fingerprint(std::span<const std::vector<Token>> prompts) const {
    return Fingerprint::of(*cache, engine, prompts);
  }

  /// Serves one request end to end as a scheduler would: admit (re-admitting after a failed
  /// promotion), check the reused bytes, compute the rest in `chunk_pages` chunks, insert
  /// after each chunk with a snapshot at the boundaries in `snapshot_at` (token counts),
  /// then release. Only whole pages are inserted. Pages insert hands back (the tree already
  /// had that KV) are freed at once and the tree's pages take their place in the table, so a
  /// request holds only what it computed that the tree did not have.
  Served serve(std::span<const Token> prompt, std::span<const std::size_t> snapshot_at,
               std::size_t chunk_pages = 2) {
    Served out;
    Admission a;
    for (int attempt = 0;; ++attempt) {
      auto r = cache->admit(prompt, request_options);
      if (!r) return failed(true, r.status().to_string());
      a = *r;
      auto resumed = cache->wait(a.lock);  // less than the match when part of it failed
      if (resumed) {
        a.cached_tokens = *resumed;
        break;
      }
      (void)cache->release(a.lock);
      if (attempt > 8) return failed(true, "promotion kept failing");
    }
    out.cached = a.cached_tokens;
    std::vector<GpuPageId> table;
    if (a.cached_tokens > 0) {
      auto pages = cache->path_pages(a.lock);
      if (!pages) return failed(false, pages.status().to_string());
      table = *pages;
      for (std::size_t i = 0; i < table.size(); ++i) out.bytes_ok &= page_ok(table[i], prompt, i);
      auto slot = cache->path_snapshot(a.lock);
      if (!slot) return failed(false, slot.status().to_string());
      out.bytes_ok &= snapshot_ok(*slot, prompt.first(a.cached_tokens));
    }
    std::vector<GpuPageId> mine;  // pages this request holds (freed at the end)
    const std::size_t whole = prompt.size() / ps();
    std::size_t done = table.size();
    while (done < whole) {
      const std::size_t n = std::min(chunk_pages, whole - done);
      std::optional<Fingerprint> before;
      const std::vector<Token> known[] = {std::vector<Token>(prompt.begin(), prompt.end())};
      if (manual_) {
        quiesce();
        before = fingerprint(known);
      }
      auto pages = cache->alloc_pages(a.lock, n);
      if (!pages) {
        out.error = pages.status().to_string();
        out.refused = pages.status().code() == ErrorCode::kOutOfMemory;
        if (before) out.refusal_changed = before->difference(fingerprint(known));
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
      // Pages the tree adopted are no longer ours; the ones it handed back are duplicates.
      std::vector<GpuPageId> keep;
      for (GpuPageId p : mine)
        if (std::find(ins->not_taken.begin(), ins->not_taken.end(), p) != ins->not_taken.end())
          keep.push_back(p);
      mine = keep;
      if (snap && !ins->snapshot_taken) (void)cache->free_snapshot_slot(a.lock, *snap);
      if (!mine.empty()) out.bytes_ok &= free_duplicates(a.lock, prompt, table, mine);
    }
    (void)cache->free_pages(a.lock, mine);
    (void)cache->release(a.lock);
    return out;
  }

  /// After an insert up to the lock's boundary: frees the request's pages in `mine` that
  /// duplicate the tree's and points `table` at the tree's pages instead (whose bytes it
  /// checks: false on a mismatch). The tree's pages may still be arriving (another request's
  /// promotion): wait for them; if that copy failed, those nodes are tombstones that the next
  /// insert revives with the request's own pages, so they stay.
  bool free_duplicates(LockId lock, std::span<const Token> prompt, std::vector<GpuPageId>& table,
                       std::vector<GpuPageId>& mine) {
    auto tree = cache->path_pages(lock);
    if (!tree && tree.status().code() == ErrorCode::kFailedPrecondition) {
      (void)cache->wait(lock);
      tree = cache->path_pages(lock);
    }
    if (!tree) return true;
    bool ok = true;
    std::vector<GpuPageId> dup;
    for (std::size_t i = 0; i < tree->size(); ++i) {
      ok &= page_ok((*tree)[i], prompt, i);
      if (table[i] == (*tree)[i]) continue;
      dup.push_back(table[i]);
      table[i] = (*tree)[i];
    }
    std::erase_if(mine,
                  [&](GpuPageId p) { return std::find(dup.begin(), dup.end(), p) != dup.end(); });
    if (Status s = cache->free_pages(lock, dup); !s) throw std::runtime_error(s.to_string());
    return ok;
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
