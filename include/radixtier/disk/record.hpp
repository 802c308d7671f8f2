// Disk records: the store's view of a record (its slots and checksum) on top of the records
// every tier below host shares (radixtier/transfer/store_record.hpp: ids, path hashes,
// descriptions).
#pragma once

#include <cstdint>
#include <vector>

#include "radixtier/ids.hpp"
#include "radixtier/transfer/store_record.hpp"

namespace radixtier::disk {

using radixtier::extend_path;
using radixtier::PathHash;
using radixtier::RecordDesc;
using radixtier::RecordId;
using radixtier::RecordKind;

/// A slot of the store's data file: `page_bytes` bytes at offset slot * page_bytes. A KV page
/// record takes one slot; a snapshot takes ceil(snapshot_bytes / page_bytes) slots, in any
/// order (as the host tier keeps snapshots in host pages).
struct DiskSlotTag {
  static constexpr const char* kName = "disk_slot";
};
using DiskSlotId = StrongId<DiskSlotTag>;

/// A committed record as the store knows it (after a restart: as its journal said).
struct RecordInfo {
  RecordId id;
  RecordDesc desc;
  std::uint64_t checksum = 0;     ///< XXH3-64 of the bytes, seeded with the record id
  std::vector<DiskSlotId> slots;  ///< where the bytes are, in order
};

}  // namespace radixtier::disk
