// The host <-> disk mover: demotes host pages (a KV page, or a snapshot's pieces) into disk
// records and promotes records back into host pages, with no staging copy (a disk slot is a
// host page's size). DiskStoreEngine (disk_store_engine.hpp) drives it as the cache's store
// tier (docs/architecture.md, "The disk as the cache's store tier").
//
// Transfer states:  Pending --finish_*--> each item: OK (record id / bytes landed) or a Status
//                   (demotion: the host copy stays the only copy; promotion: kDataLoss means
//                   the record is lost and the node's resource becomes a tombstone, rule 7)
//
// Contract (as for TransferEngine): while a transfer is pending its host pages are neither
// freed nor reused; the caller holds them (the cache's IdPool "transfer" holder).
#pragma once

#include <cstddef>
#include <vector>

#include "radixtier/disk/disk_store.hpp"
#include "radixtier/ids.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"

namespace radixtier::disk {

/// A record to write from host pages: a KV page from one page, a snapshot from its
/// ceil(snapshot_bytes / page_bytes) pieces in offset order.
struct HostToDisk {
  RecordDesc desc;
  std::vector<HostPageId> pages;
};

/// A record to read into host pages (the same shapes).
struct DiskToHost {
  RecordId record;
  std::vector<HostPageId> pages;
};

/// A demotion or promotion in flight; move-only; pass it back to its finish_ call.
class DiskTransfer {
 public:
  bool valid() const { return writes_.valid() || reads_.valid(); }
  IoState poll() const { return writes_.valid() ? writes_.poll() : reads_.poll(); }

 private:
  friend class DiskTransferEngine;
  PendingWrites writes_;
  PendingReads reads_;
};

class DiskTransferEngine {
 public:
  /// The store's page_bytes must equal the host pages' (else every call is refused).
  DiskTransferEngine(HostPages& host, DiskStore& store) : host_(host), store_(store) {}

  /// Validates every host page id and piece count (bad input: kInvalidArgument, nothing
  /// submitted; a full budget: kOutOfMemory, nothing submitted) and submits the writes.
  Result<DiskTransfer> demote(const std::vector<HostToDisk>& batch);
  /// Per item in order, the new record's id; all fail together on an I/O error.
  Result<std::vector<RecordId>> finish_demotion(DiskTransfer&& transfer);

  Result<DiskTransfer> promote(const std::vector<DiskToHost>& batch);
  /// Per item in order: OK (the host pages hold the record's bytes), kDataLoss (lost: the
  /// store erased it) or kTransferFailed (an I/O error: the record is kept).
  std::vector<Status> finish_promotion(DiskTransfer&& transfer);

 private:
  Status check_geometry() const;
  Status check_pages(const std::vector<HostPageId>& pages, std::size_t want,
                     std::size_t item) const;
  std::size_t pieces_of(RecordKind kind) const;

  HostPages& host_;
  DiskStore& store_;
};

}  // namespace radixtier::disk
