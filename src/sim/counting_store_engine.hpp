// CountingStoreEngine: the store tier below host for simulation; it moves no bytes.
//
// It keeps each committed record's description (kind, boundary, path hash, tokens: what the
// cache rebuilds its tree from after a restart) and no data, within a budget of slots (a KV
// page record takes one slot, a snapshot record geometry().snapshot_slots()). Every I/O
// completes at submit: ready() is true at once, and finish_*() hands out the results. It
// counts what a real store would move (records, bytes, erases, syncs), so the cost model can
// charge the disk. A simulated restart destroys the cache and keeps this engine: it must
// outlive every cache created on it, as a directory outlives the process.
//
// Record states:   (absent) --submit_writes--> reserved (its slots taken, not listed)
//                  reserved --finish_writes--> committed (listed by records(), readable)
//                  committed --erase--> (absent, slots free)
// A write ticket that is never finished keeps its slots reserved. Bad input (a wrong token
// count, a boundary off the page grid, a wrong piece count, a host page id beyond the pool,
// a host page named twice in a batch, an unknown record or ticket) is refused with a clear
// error and changes nothing. Not thread-safe, as the StoreEngine contract says.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "radixtier/config.hpp"
#include "radixtier/transfer/store_engine.hpp"

namespace radixtier::sim {

struct StoreCounts {
  std::uint64_t write_batches = 0;
  std::uint64_t writes = 0;  ///< records committed
  std::uint64_t bytes_written = 0;
  std::uint64_t read_batches = 0;
  std::uint64_t reads = 0;  ///< records read
  std::uint64_t bytes_read = 0;
  std::uint64_t erases = 0;
  std::uint64_t syncs = 0;
  std::uint64_t rejected = 0;     ///< calls refused for bad input
  std::uint64_t out_of_room = 0;  ///< write batches refused for want of slots
};

class CountingStoreEngine final : public StoreEngine {
 public:
  /// The geometry a cache with `config` accepts, with room for `bytes` of records
  /// (bytes / page_bytes slots).
  static StoreGeometry geometry_for(const CacheConfig& config, std::uint64_t bytes);

  /// kInvalidArgument naming the field when page_tokens, page_bytes, snapshot_bytes,
  /// capacity_slots or host_pages is 0. `host_pages`: the host pool the page ids index
  /// (CacheConfig::host_pool_pages()).
  static Result<std::unique_ptr<CountingStoreEngine>> create(StoreGeometry geometry,
                                                             std::uint64_t host_pages);

  StoreGeometry geometry() const override { return geometry_; }
  std::uint64_t free_slots() const override { return geometry_.capacity_slots - used_slots_; }
  std::vector<StoredRecord> records() const override;
  Result<std::uint64_t> submit_writes(std::vector<StoreWrite> batch) override;
  Result<std::uint64_t> submit_reads(std::vector<StoreRead> batch) override;
  /// True for every ticket submitted and not yet finished (the I/O is done at submit); an
  /// unknown ticket is true as well (nothing of it is pending), its finish reports it.
  bool ready(std::uint64_t ticket) override;
  /// kNotFound for an unknown ticket (or a read ticket).
  Result<std::vector<RecordId>> finish_writes(std::uint64_t ticket) override;
  /// One OK per read; an unknown ticket (or a write ticket): one kNotFound status.
  std::vector<Status> finish_reads(std::uint64_t ticket) override;
  Status erase(RecordId id) override;
  Status sync() override;

  StoreCounts counts() const { return counts_; }
  /// Committed records.
  std::size_t record_count() const { return committed_.size(); }
  /// Write and read tickets not finished yet.
  std::size_t pending_tickets() const { return tickets_.size(); }
  /// Slots taken by committed and reserved records.
  std::uint64_t used_slots() const { return used_slots_; }
  /// "" when the slot count adds up (committed + reserved = used) and every record fits its
  /// geometry; else what does not.
  std::string check_invariants() const;

 private:
  CountingStoreEngine(StoreGeometry geometry, std::uint64_t host_pages)
      : geometry_(geometry), host_pages_(host_pages) {}

  std::uint64_t slots_of(RecordKind kind) const;
  std::uint64_t bytes_of(RecordKind kind) const;
  /// "" or why `pages` cannot be the host pages of a `kind` record (`seen`: pages of the
  /// batch so far, for duplicates).
  std::string check_pages(RecordKind kind, const std::vector<HostPageId>& pages,
                          std::unordered_map<std::uint32_t, std::size_t>& seen,
                          std::size_t item) const;
  std::string check_desc(const RecordDesc& desc, std::size_t item) const;

  struct Ticket {
    bool write = false;
    std::vector<StoredRecord> records;  ///< writes: reserved, ids assigned; reads: what was read
  };

  const StoreGeometry geometry_;
  const std::uint64_t host_pages_;
  std::map<RecordId, RecordDesc> committed_;  ///< id order, as records() lists them
  std::unordered_map<std::uint64_t, Ticket> tickets_;
  std::uint64_t used_slots_ = 0;
  std::uint64_t next_record_ = 0;
  std::uint64_t next_ticket_ = 1;
  StoreCounts counts_;
};

}  // namespace radixtier::sim
