// The store engine: moves host pages into records of the tier below host (the disk; later a
// store shared across machines) and back, and lists what that tier holds, so the cache can
// rebuild its tree from it after a restart. The cache (PrefixCache) drives it exactly as it
// drives the TransferEngine one tier up: host -> store is a demotion, store -> host a
// promotion; the store never sees GPU memory.
//
// Ticket states:   Pending --(every I/O done)--> Ready; finish_*() then reports per item:
//   writes: all items committed (their record ids) or none (an I/O error, disk full)
//   reads:  per item OK (the host pages hold the record's bytes, checksum verified),
//           kDataLoss (the record failed its check or was cut: the store erased it) or
//           kTransferFailed (an I/O error: the record is kept)
//
// Contract with the caller (the cache keeps it, rule 5): while a ticket is pending, the host
// pages it names are neither freed nor reused; a read's pages hold garbage until its finish
// says OK. A record is one KV page (one host page) or one snapshot (snapshot_pieces() host
// pages, bytes [i * page_bytes, ...) of the snapshot in the i-th, as the cache keeps host
// snapshots). Not thread-safe: the cache's thread calls it; the I/O runs on the engine's own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "radixtier/ids.hpp"
#include "radixtier/status.hpp"
#include "radixtier/transfer/store_record.hpp"

namespace radixtier {

/// A record to write from host pages: a KV page from one page, a snapshot from its pieces in
/// offset order.
struct StoreWrite {
  RecordDesc desc;
  std::vector<HostPageId> pages;
};

/// A record to read into host pages (the same shapes).
struct StoreRead {
  RecordId record;
  std::vector<HostPageId> pages;
};

/// What a store holds and what it was made for; PrefixCache::create() refuses a store whose
/// geometry differs from its config.
struct StoreGeometry {
  std::uint32_t page_tokens = 0;
  std::size_t page_bytes = 0;      ///< bytes of one KV page record (one store slot)
  std::size_t snapshot_bytes = 0;  ///< bytes of one snapshot record
  std::uint64_t capacity_slots = 0;
  /// Slots one snapshot record takes: ceil(snapshot_bytes / page_bytes).
  std::uint64_t snapshot_slots() const {
    return page_bytes == 0 ? 0 : (snapshot_bytes + page_bytes - 1) / page_bytes;
  }
};

class StoreEngine {
 public:
  virtual ~StoreEngine() = default;
  virtual StoreGeometry geometry() const = 0;
  /// Slots free for new records now (a record being erased may come back later).
  virtual std::uint64_t free_slots() const = 0;
  /// Every committed record, in id order.
  virtual std::vector<StoredRecord> records() const = 0;
  /// Submits the writes; all or nothing: bad input (kInvalidArgument) or not enough room
  /// (kOutOfMemory) submits nothing. Returns the ticket.
  virtual Result<std::uint64_t> submit_writes(std::vector<StoreWrite> batch) = 0;
  /// Submits the reads (an unknown record or a wrong piece count: nothing submitted).
  virtual Result<std::uint64_t> submit_reads(std::vector<StoreRead> batch) = 0;
  /// True when every I/O of the ticket is done (never blocks).
  virtual bool ready(std::uint64_t ticket) = 0;
  /// Waits; per write in order the new record's id, or the error (nothing committed).
  virtual Result<std::vector<RecordId>> finish_writes(std::uint64_t ticket) = 0;
  /// Waits; per read in order its Status (see the ticket states above).
  virtual std::vector<Status> finish_reads(std::uint64_t ticket) = 0;
  /// Drops a committed record (kNotFound: unknown).
  virtual Status erase(RecordId id) = 0;
  /// Makes every committed record and erase durable (the crash guarantee's boundary).
  virtual Status sync() = 0;
};

}  // namespace radixtier
