#include "radixtier/disk/disk_store_engine.hpp"

#include <string>
#include <utility>

namespace radixtier::disk {

DiskStoreEngine::DiskStoreEngine(DiskStore& store, HostPages& host)
    : store_(store), mover_(host, store) {}

Status DiskStoreEngine::check_usable() const {
  const std::string& why = store_.disabled_reason();
  if (why.empty()) return Status::ok();
  return {ErrorCode::kFailedPrecondition, "disk store is switched off: " + why};
}

StoreGeometry DiskStoreEngine::geometry() const {
  const ModelFingerprint& f = store_.config().fingerprint;
  StoreGeometry g;
  g.page_tokens = f.page_tokens;
  g.page_bytes = f.page_bytes;
  g.snapshot_bytes = f.snapshot_bytes;
  g.capacity_slots = check_usable() ? store_.config().capacity_slots() : 0;
  return g;
}

std::uint64_t DiskStoreEngine::free_slots() const {
  return check_usable() ? store_.free_slot_count() : 0;
}

std::vector<StoredRecord> DiskStoreEngine::records() const {
  std::vector<StoredRecord> out;
  if (!check_usable()) return out;
  std::vector<RecordInfo> infos = store_.records();
  out.reserve(infos.size());
  for (RecordInfo& r : infos) out.push_back({r.id, std::move(r.desc)});
  return out;
}

std::uint64_t DiskStoreEngine::slots_needed(const std::vector<HostToDisk>& batch) const {
  std::uint64_t need = 0;
  for (const HostToDisk& w : batch) {
    need += w.desc.kind == RecordKind::kKvPage ? 1 : store_.config().snapshot_slots();
  }
  return need;
}

std::uint64_t DiskStoreEngine::add_ticket(DiskTransfer transfer, bool writes, std::size_t items) {
  const std::uint64_t id = next_ticket_++;
  tickets_.emplace(id, Ticket{std::move(transfer), writes, items});
  return id;
}

Result<std::uint64_t> DiskStoreEngine::submit_writes(std::vector<StoreWrite> batch) {
  if (Status s = check_usable(); !s) return s;
  std::vector<HostToDisk> items;
  items.reserve(batch.size());
  for (StoreWrite& w : batch) items.push_back({std::move(w.desc), std::move(w.pages)});
  auto t = mover_.demote(items);
  // Bad input is refused before room is counted, so kOutOfMemory means a valid batch that
  // does not fit the free slots. The slots of erased records come back at the next sync: pay
  // for it only when it is enough.
  if (!t && t.status().code() == ErrorCode::kOutOfMemory) {
    const std::uint64_t need = slots_needed(items);
    if (need <= store_.free_slot_count() + store_.freeing_slot_count() &&
        store_.freeing_slot_count() > 0) {
      if (Status s = store_.sync(); !s) return s;
      ++syncs_for_room_;
      t = mover_.demote(items);
    }
  }
  if (!t) return t.status();
  return add_ticket(std::move(t).value(), true, items.size());
}

Result<std::uint64_t> DiskStoreEngine::submit_reads(std::vector<StoreRead> batch) {
  if (Status s = check_usable(); !s) return s;
  std::vector<DiskToHost> items;
  items.reserve(batch.size());
  for (StoreRead& r : batch) items.push_back({r.record, std::move(r.pages)});
  auto t = mover_.promote(items);
  if (!t) return t.status();
  return add_ticket(std::move(t).value(), false, items.size());
}

bool DiskStoreEngine::ready(std::uint64_t ticket) {
  auto it = tickets_.find(ticket);
  // An unknown ticket is "done": its finish_ call reports the error instead of a caller
  // polling forever.
  if (it == tickets_.end()) return true;
  return it->second.transfer.poll() != IoState::kPending;
}

Result<std::vector<RecordId>> DiskStoreEngine::finish_writes(std::uint64_t ticket) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) {
    return invalid_argument("no pending store ticket " + std::to_string(ticket));
  }
  if (!it->second.writes) {
    return invalid_argument("store ticket " + std::to_string(ticket) +
                            " is a read: finish it with finish_reads");
  }
  DiskTransfer transfer = std::move(it->second.transfer);
  tickets_.erase(it);
  // complete_writes refuses to commit on a switched-off store (and gives the slots back).
  return mover_.finish_demotion(std::move(transfer));
}

std::vector<Status> DiskStoreEngine::finish_reads(std::uint64_t ticket) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) {
    return {invalid_argument("no pending store ticket " + std::to_string(ticket))};
  }
  if (it->second.writes) {
    return {invalid_argument("store ticket " + std::to_string(ticket) +
                             " is a write: finish it with finish_writes")};
  }
  DiskTransfer transfer = std::move(it->second.transfer);
  tickets_.erase(it);
  std::vector<Status> out = mover_.finish_promotion(std::move(transfer));
  if (Status s = check_usable(); !s) {
    // The reads are done (their pages are the caller's again) but nothing is handed out.
    for (Status& r : out) r = s;
  }
  return out;
}

Status DiskStoreEngine::erase(RecordId id) {
  if (Status s = check_usable(); !s) return s;
  return store_.erase(id);
}

Status DiskStoreEngine::sync() {
  if (Status s = check_usable(); !s) return s;
  return store_.sync();
}

}  // namespace radixtier::disk
