// The scheduler-facing interface of a prefix cache.
//
// A scheduler drives every cache through these calls, so one scheduler can run the
// node-residency cache (PrefixCache), the index-based baseline or a GPU-only cache, and an
// A/B comparison is fair. A request's life:
//
//   admit(prompt)           match on all but the last prompt token, lock the usable match,
//                           start promoting what of it is on host -> Admission (also how
//                           deep the prompt follows cached KV: kv_tokens)
//   admit(prompt, options)  the same in options.ns (key namespace), the nodes it uses and
//                           inserts kept at options.priority (request_options.hpp)
//   wait(lock)              wait for the promotion -> the tokens the request resumes from:
//                           Admission::cached_tokens, or less when part of the match failed
//                           to arrive (the cache resumed it at the deepest boundary of its
//                           path still usable); a backend that cannot resume fails with
//                           kTransferFailed: release and admit again
//   poll(lock)              the promotion's state without waiting (kNotFound: unknown lock)
//   path_pages(lock)        GPU pages of the matched prefix (the request's page table head)
//   path_snapshot(lock)     GPU snapshot slot at the match: copy it into the live state
//   alloc_pages(lock, n)    pages for new tokens (may demote or drop LRU victims)
//   alloc_snapshot_slot(lock)  a slot to copy the live state into at a page boundary
//   insert(lock, ...)       hand pages (and a snapshot) to the tree after a chunk; the lock
//                           moves down to the inserted boundary
//   free_pages / free_snapshot_slot(lock, ...)   return what insert did not take
//   release(lock)           the request finished or was aborted; what it still owns is freed
//
// Ownership (rule 9): a page or snapshot slot allocated with a lock belongs to that request
// alone until insert adopts it or the request frees it; insert and free reject an id the
// request does not own, with a message that names the owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "radixtier/cache/request_options.hpp"
#include "radixtier/ids.hpp"
#include "radixtier/status.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier {

struct Admission {
  LockId lock;                    ///< the request's lock; also the ticket of its promotion
  std::size_t cached_tokens = 0;  ///< usable match length (a page multiple, < prompt size)
  std::size_t gpu_tokens = 0;     ///< tokens of the match whose KV was already on GPU
  std::size_t host_tokens = 0;    ///< tokens of the match being promoted from host
  bool snapshot_from_host = false;
  /// wait(lock) before reading the pages: copies are on their way, or one already failed
  /// (wait() then resumes earlier and returns where).
  bool promoting = false;
  /// Deepest page-aligned prefix of the query (the prompt but its last token) whose KV is in
  /// the cache, snapshot or not: where the prompt branches off the cached KV path
  /// (>= cached_tokens). A snapshot policy may keep one near it (SnapshotPolicy `+branch`).
  std::size_t kv_tokens = 0;
};

struct InsertResult {
  std::vector<GpuPageId> not_taken;  ///< the caller's pages the tree did not adopt (still the
                                     ///< caller's: free them when the request stops using them)
  bool snapshot_taken = false;       ///< false: the caller still owns its snapshot slot
};

struct CacheStats {
  std::uint64_t admissions = 0;
  std::uint64_t requested_tokens = 0;  ///< tokens asked for at admission (prompt minus one)
  std::uint64_t hit_tokens_gpu = 0;    ///< usable-match tokens already on GPU at admission
  std::uint64_t hit_tokens_host = 0;   ///< usable-match tokens promoted from host
  std::uint64_t bytes_d2h = 0;         ///< demotion + write-through bytes, KV and snapshots
  std::uint64_t bytes_d2d = 0;         ///< device copies: live slots <-> GPU snapshot pages
  std::uint64_t bytes_h2d = 0;         ///< promotion bytes, KV and snapshots
  std::uint64_t copies_d2h = 0;        ///< slices submitted device-to-host
  std::uint64_t copies_h2d = 0;        ///< slices submitted host-to-device
  std::uint64_t kv_pages_demoted = 0;
  std::uint64_t kv_pages_promoted = 0;
  std::uint64_t kv_pages_dropped_gpu = 0;   ///< GPU pages freed without a host copy kept
  std::uint64_t kv_pages_dropped_host = 0;  ///< host pages freed
  std::uint64_t snapshots_demoted = 0;
  std::uint64_t snapshots_promoted = 0;
  std::uint64_t snapshots_dropped = 0;  ///< snapshots lost from every tier
  std::uint64_t snapshots_inserted = 0;
  std::uint64_t transfers_failed = 0;
  std::uint64_t host_bytes_peak = 0;  ///< most host bytes in use at once
  /// GPU snapshot slot misses: a snapshot slot asked for and refused (every slot pinned or
  /// held by a request), or a host snapshot not promoted for want of one.
  std::uint64_t snapshot_slot_misses = 0;
  std::uint64_t dead_kv_pages_dropped = 0;  ///< KV pages dropped as dead (no snapshot below)
  /// Resumes from a snapshot at the end of all its path held (a conversation's next turn), and
  /// resumes from a spent one: a snapshot resumed that way before, with one below it now
  /// (node.hpp, "Eviction orders"; PrefixCache only).
  std::uint64_t frontier_resumes = 0;
  std::uint64_t spent_resumes = 0;
  /// Waits on a copy while making GPU room for an allocation (alloc_pages,
  /// alloc_snapshot_slot, and the promotion destinations of an admission): one per transfer
  /// waited for. 0 while every allocation fits in the free room (the watermarks' goal).
  std::uint64_t alloc_copy_waits = 0;
  /// Copies the cache waited for on the calling thread (a transfer engine ticket or a store
  /// read, whatever the reason: wait(), making room, a split, drain()). admit() and insert()
  /// add none unless room must be made by waiting: the promotion, the copy into the live slot
  /// and the materialization of a snapshot are reaped by poll().
  std::uint64_t host_waits = 0;
  std::uint64_t alloc_wait_bytes = 0;   ///< bytes of the transfers those waits waited for
  std::uint64_t alloc_wait_copies = 0;  ///< their slices (what a copy's latency is paid for)
  /// KV nodes and snapshots the watermark step evicted ahead of need (demotions started
  /// without waiting, or drops where host had no room or the data was dead or clean).
  std::uint64_t background_evictions = 0;
  // The store tier below host (PrefixCache with a StoreEngine; transfer/store_engine.hpp).
  std::uint64_t bytes_to_store = 0;    ///< host -> store bytes (records written)
  std::uint64_t bytes_from_store = 0;  ///< store -> host bytes (records read)
  std::uint64_t store_writes = 0;      ///< records written (a KV page or a snapshot each)
  std::uint64_t store_reads = 0;       ///< records read
  std::uint64_t kv_pages_stored = 0;   ///< KV pages given a store copy
  std::uint64_t kv_pages_loaded = 0;   ///< KV pages read back from the store
  std::uint64_t snapshots_stored = 0;
  std::uint64_t snapshots_loaded = 0;
  std::uint64_t kv_pages_dropped_store = 0;  ///< store KV records erased for room or flush
  std::uint64_t store_records_lost = 0;      ///< reads that failed their check (tombstones)
  std::uint64_t store_failures = 0;          ///< writes or reads that failed (I/O, full)
  /// Waits on a store write while making host room on demand (the host watermark's goal: 0).
  std::uint64_t store_copy_waits = 0;
  std::uint64_t store_wait_bytes = 0;
  std::uint64_t restored_kv_pages = 0;   ///< KV pages the tree rebuilt from the store at create()
  std::uint64_t restored_snapshots = 0;  ///< snapshots it rebuilt
  std::uint64_t hit_tokens_store = 0;    ///< usable-match tokens loaded from the store
  /// Admissions whose store match went store -> a few host staging pages -> GPU, a chunk at a
  /// time, for want of host room for all of it (no host copy is kept of what is staged).
  std::uint64_t staged_loads = 0;
  /// Store matches an admission could not load for want of host room: not even a staging
  /// window of one page and the snapshot could be made (every host page held by running
  /// requests, pins or copies); it fell back to a shallower candidate.
  std::uint64_t store_load_misses = 0;

  bool operator==(const CacheStats&) const = default;
};

class CacheBackend {
 public:
  virtual ~CacheBackend() = default;

  virtual std::uint32_t page_size() const = 0;
  /// Host bytes free now (pages of the host tier on no node, request or transfer); 0 where the
  /// backend does not say. Adaptive placement spends what stays free on snapshots.
  virtual std::uint64_t host_bytes_free() const { return 0; }
  virtual Result<Admission> admit(std::span<const Token> prompt) = 0;
  /// admit() in a key namespace at a retention priority. This default serves backends
  /// without namespaces or priorities: it ignores the priority (a retention hint) and
  /// refuses any namespace but the default one (sharing across namespaces would hand one
  /// tenant's or adapter's KV to another), with kInvalidArgument.
  virtual Result<Admission> admit(std::span<const Token> prompt, const RequestOptions& options) {
    if (Status s = options.validate(); !s) return s;
    if (options.ns != kDefaultNamespace) {
      return invalid_argument(std::string("admit: this cache has no key namespaces (asked for ") +
                              "namespace#" + std::to_string(options.ns.value()) + ")");
    }
    return admit(prompt);
  }
  /// kPending while the admission's copies run, kDone when its match is usable as admitted,
  /// kFailed when part of it failed to arrive (wait() then resumes earlier); an unknown lock is
  /// an error (kNotFound), never a state.
  virtual Result<TransferState> poll(LockId lock) = 0;
  /// Waits for the admission's copies; returns the tokens the request resumes from (a page
  /// multiple, <= Admission::cached_tokens). Read path_pages()/path_snapshot() after it.
  virtual Result<std::size_t> wait(LockId lock) = 0;
  /// True when stream_wait() orders a caller's stream after the lock's copies (PrefixCache).
  virtual bool supports_stream_wait() const { return false; }
  /// Makes `stream` wait for the copies of the lock's resumed prefix (the KV of the layers up
  /// to `layer`, the snapshot whole): PrefixCache::stream_wait. The caller then checks
  /// poll(lock) == kDone before committing what it computed from the prefix. A backend without
  /// it: kFailedPrecondition (call wait()).
  virtual Status stream_wait(LockId lock, StreamHandle stream, std::optional<std::uint32_t> layer) {
    (void)lock;
    (void)stream;
    (void)layer;
    return Status(ErrorCode::kFailedPrecondition,
                  "stream_wait: this cache backend has no device ordering; call wait()");
  }
  virtual Result<std::vector<GpuPageId>> path_pages(LockId lock) const = 0;
  virtual Result<GpuSlotId> path_snapshot(LockId lock) const = 0;
  virtual Result<std::vector<GpuPageId>> alloc_pages(LockId lock, std::size_t n) = 0;
  virtual Result<GpuSlotId> alloc_snapshot_slot(LockId lock) = 0;
  virtual Status free_pages(LockId lock, std::span<const GpuPageId> pages) = 0;
  virtual Status free_snapshot_slot(LockId lock, GpuSlotId slot) = 0;
  virtual Result<InsertResult> insert(LockId lock, std::span<const Token> tokens,
                                      std::span<const GpuPageId> pages,
                                      std::optional<GpuSlotId> snapshot) = 0;
  virtual Status release(LockId lock) = 0;
  virtual CacheStats stats() const = 0;
  /// Empty when every rule of the brief holds, else a description of the first violation.
  virtual std::string check_invariants() const = 0;
};

}  // namespace radixtier
