// The disk as the cache's store tier: a StoreEngine (radixtier/transfer/store_engine.hpp) over
// a DiskStore and the host pages of the cache's transfer engine (HostPages: a
// HostTransferEngine's arenas, or the CUDA engine's pinned pool; engine.host_memory()).
// PrefixCache::create(config, engine, &disk_store_engine) demotes host victims into disk
// records through it, loads them back at admission, and rebuilds its tree from records()
// after a restart.
//
// Ticket states and the functions that move a ticket between them:
//
//   (none) --submit_writes / submit_reads--> Pending   the I/O runs on the store's engine; the
//                                                      host pages it names are the caller's
//                                                      to keep untouched (store_engine.hpp)
//   Pending --ready() true--> Done                     every I/O finished (ok or not)
//   Pending or Done --finish_writes / finish_reads--> (none)   waits if needed, reports per item
//   finish_* of an unknown ticket, or of a ticket of the other kind: kInvalidArgument, and the
//   ticket (if any) stays as it was.
//
// Room: free_slots() are the slots a write can take now. Slots of erased records come back
// only after the sync that makes the erase durable (disk_store.hpp); when a batch does not fit
// the free slots but fits free + those, submit_writes syncs first and retries, otherwise it
// refuses with kOutOfMemory and submits nothing.
//
// Switched off: once a failed fsync has disabled the store (DiskStore::disabled_reason()), every
// call is an error (kFailedPrecondition), free_slots() and geometry().capacity_slots are 0 and
// records() is empty; a read in flight when it happened still completes its I/O (its host pages
// are released to the caller) but reports kFailedPrecondition: no byte is handed out.
//
// Not thread-safe: the cache's thread calls it. The store and the host pages must outlive it;
// destroying it with tickets pending waits for their I/O and commits none of their writes.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "radixtier/disk/disk_store.hpp"
#include "radixtier/disk/disk_transfer_engine.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"
#include "radixtier/transfer/store_engine.hpp"

namespace radixtier::disk {

class DiskStoreEngine final : public radixtier::StoreEngine {
 public:
  /// The store's page_bytes must equal the host pages' (else every submit is refused with
  /// kInvalidArgument naming both; PrefixCache::create() refuses a geometry that differs from
  /// its config before that).
  DiskStoreEngine(DiskStore& store, HostPages& host);
  ~DiskStoreEngine() override = default;
  DiskStoreEngine(const DiskStoreEngine&) = delete;
  DiskStoreEngine& operator=(const DiskStoreEngine&) = delete;

  StoreGeometry geometry() const override;
  std::uint64_t free_slots() const override;
  std::vector<StoredRecord> records() const override;
  Result<std::uint64_t> submit_writes(std::vector<StoreWrite> batch) override;
  Result<std::uint64_t> submit_reads(std::vector<StoreRead> batch) override;
  bool ready(std::uint64_t ticket) override;
  Result<std::vector<RecordId>> finish_writes(std::uint64_t ticket) override;
  std::vector<Status> finish_reads(std::uint64_t ticket) override;
  Status erase(RecordId id) override;
  Status sync() override;

  /// Tickets submitted and not finished yet.
  std::size_t pending_tickets() const { return tickets_.size(); }
  /// How many write batches needed a sync to free the slots of erased records first.
  std::uint64_t syncs_for_room() const { return syncs_for_room_; }
  DiskStore& store() { return store_; }

 private:
  struct Ticket {
    DiskTransfer transfer;
    bool writes = false;
    std::size_t items = 0;
  };

  Status check_usable() const;
  std::uint64_t slots_needed(const std::vector<HostToDisk>& batch) const;
  std::uint64_t add_ticket(DiskTransfer transfer, bool writes, std::size_t items);

  DiskStore& store_;
  DiskTransferEngine mover_;
  std::unordered_map<std::uint64_t, Ticket> tickets_;
  std::uint64_t next_ticket_ = 1;
  std::uint64_t syncs_for_room_ = 0;
};

}  // namespace radixtier::disk
