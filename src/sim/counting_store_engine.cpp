#include "sim/counting_store_engine.hpp"

#include <sstream>
#include <utility>

namespace radixtier::sim {

namespace {

std::string str(RecordId id) {
  std::ostringstream os;
  os << id;
  return os.str();
}

}  // namespace

StoreGeometry CountingStoreEngine::geometry_for(const CacheConfig& c, std::uint64_t bytes) {
  StoreGeometry g;
  g.page_tokens = c.page_size;
  g.page_bytes = c.page_bytes;
  g.snapshot_bytes = c.snapshot_bytes;
  g.capacity_slots = c.page_bytes == 0 ? 0 : bytes / c.page_bytes;
  return g;
}

Result<std::unique_ptr<CountingStoreEngine>> CountingStoreEngine::create(StoreGeometry g,
                                                                         std::uint64_t host_pages) {
  const char* zero = g.page_tokens == 0      ? "page_tokens"
                     : g.page_bytes == 0     ? "page_bytes"
                     : g.snapshot_bytes == 0 ? "snapshot_bytes"
                     : g.capacity_slots == 0 ? "capacity_slots"
                     : host_pages == 0       ? "host_pages"
                                             : nullptr;
  if (zero != nullptr) {
    return invalid_argument(std::string("counting store: ") + zero + " must be positive");
  }
  return std::unique_ptr<CountingStoreEngine>(new CountingStoreEngine(g, host_pages));
}

std::uint64_t CountingStoreEngine::slots_of(RecordKind kind) const {
  return kind == RecordKind::kSnapshot ? geometry_.snapshot_slots() : 1;
}

std::uint64_t CountingStoreEngine::bytes_of(RecordKind kind) const {
  return kind == RecordKind::kSnapshot ? geometry_.snapshot_bytes : geometry_.page_bytes;
}

std::vector<StoredRecord> CountingStoreEngine::records() const {
  std::vector<StoredRecord> out;
  out.reserve(committed_.size());
  for (const auto& [id, desc] : committed_) out.push_back(StoredRecord{id, desc});
  return out;
}

std::string CountingStoreEngine::check_pages(RecordKind kind, const std::vector<HostPageId>& pages,
                                             std::unordered_map<std::uint32_t, std::size_t>& seen,
                                             std::size_t item) const {
  std::ostringstream err;
  if (pages.size() != slots_of(kind)) {
    err << "item " << item << ": a " << to_string(kind) << " record takes " << slots_of(kind)
        << " host pages, got " << pages.size() << "; ";
  }
  for (HostPageId p : pages) {
    if (p.value() >= host_pages_) {
      err << "item " << item << ": " << p << " out of range (host pool " << host_pages_
          << " pages); ";
    } else if (auto [it, fresh] = seen.emplace(p.value(), item); !fresh) {
      err << "item " << item << ": " << p << " already named by item " << it->second << "; ";
    }
  }
  return err.str();
}

std::string CountingStoreEngine::check_desc(const RecordDesc& d, std::size_t item) const {
  std::ostringstream err;
  const std::uint64_t grid = geometry_.page_tokens;
  if (d.kind != RecordKind::kKvPage && d.kind != RecordKind::kSnapshot) {
    err << "item " << item << ": unknown record kind " << static_cast<int>(d.kind) << "; ";
    return err.str();
  }
  if (d.boundary == 0 || d.boundary % grid != 0) {
    err << "item " << item << ": boundary " << d.boundary << " is not a positive multiple of "
        << grid << " tokens; ";
  }
  if (d.kind == RecordKind::kKvPage) {
    if (d.tokens.size() != grid) {
      err << "item " << item << ": a KV page record carries " << grid << " tokens, got "
          << d.tokens.size() << "; ";
    }
    if (d.boundary == grid && !d.parent.is_root()) {
      err << "item " << item << ": the first page's parent must be the root; ";
    }
  } else if (!d.tokens.empty() || !d.parent.is_root()) {
    err << "item " << item << ": a snapshot record carries no tokens and no parent; ";
  }
  return err.str();
}

Result<std::uint64_t> CountingStoreEngine::submit_writes(std::vector<StoreWrite> batch) {
  std::string err;
  std::unordered_map<std::uint32_t, std::size_t> seen;
  std::uint64_t slots = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    err += check_desc(batch[i].desc, i);
    if (err.empty()) err += check_pages(batch[i].desc.kind, batch[i].pages, seen, i);
    slots += slots_of(batch[i].desc.kind);
  }
  if (!err.empty()) {
    ++counts_.rejected;
    return invalid_argument("store writes rejected: " + err);
  }
  if (slots > free_slots()) {
    ++counts_.out_of_room;
    return out_of_memory("store full: the batch needs " + std::to_string(slots) + " slots, " +
                         std::to_string(free_slots()) + " of " +
                         std::to_string(geometry_.capacity_slots) + " free");
  }
  Ticket t;
  t.write = true;
  t.records.reserve(batch.size());
  for (StoreWrite& w : batch) {
    t.records.push_back(StoredRecord{RecordId(next_record_++), std::move(w.desc)});
  }
  used_slots_ += slots;
  ++counts_.write_batches;
  const std::uint64_t id = next_ticket_++;
  tickets_.emplace(id, std::move(t));
  return id;
}

Result<std::uint64_t> CountingStoreEngine::submit_reads(std::vector<StoreRead> batch) {
  std::string err;
  std::unordered_map<std::uint32_t, std::size_t> seen;
  Ticket t;
  t.records.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto it = committed_.find(batch[i].record);
    if (it == committed_.end()) {
      err += "item " + std::to_string(i) + ": " + str(batch[i].record) +
             " is not a committed record; ";
      continue;
    }
    err += check_pages(it->second.kind, batch[i].pages, seen, i);
    t.records.push_back(StoredRecord{it->first, it->second});
  }
  if (!err.empty()) {
    ++counts_.rejected;
    return invalid_argument("store reads rejected: " + err);
  }
  ++counts_.read_batches;
  const std::uint64_t id = next_ticket_++;
  tickets_.emplace(id, std::move(t));
  return id;
}

bool CountingStoreEngine::ready(std::uint64_t) {
  return true;
}

Result<std::vector<RecordId>> CountingStoreEngine::finish_writes(std::uint64_t ticket) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || !it->second.write) {
    ++counts_.rejected;
    return not_found("finish_writes: no write ticket " + std::to_string(ticket));
  }
  std::vector<RecordId> ids;
  ids.reserve(it->second.records.size());
  for (StoredRecord& r : it->second.records) {
    ++counts_.writes;
    counts_.bytes_written += bytes_of(r.desc.kind);
    ids.push_back(r.id);
    committed_.emplace(r.id, std::move(r.desc));
  }
  tickets_.erase(it);
  return ids;
}

std::vector<Status> CountingStoreEngine::finish_reads(std::uint64_t ticket) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.write) {
    ++counts_.rejected;
    return {not_found("finish_reads: no read ticket " + std::to_string(ticket))};
  }
  for (const StoredRecord& r : it->second.records) {
    ++counts_.reads;
    counts_.bytes_read += bytes_of(r.desc.kind);
  }
  std::vector<Status> out(it->second.records.size(), Status::ok());
  tickets_.erase(it);
  return out;
}

Status CountingStoreEngine::erase(RecordId id) {
  auto it = committed_.find(id);
  if (it == committed_.end()) {
    ++counts_.rejected;
    return not_found("erase: " + str(id) + " is not a committed record");
  }
  used_slots_ -= slots_of(it->second.kind);
  committed_.erase(it);
  ++counts_.erases;
  return Status::ok();
}

Status CountingStoreEngine::sync() {
  ++counts_.syncs;
  return Status::ok();
}

std::string CountingStoreEngine::check_invariants() const {
  std::uint64_t slots = 0;
  std::ostringstream err;
  for (const auto& [id, desc] : committed_) {
    slots += slots_of(desc.kind);
    if (std::string e = check_desc(desc, id.value()); !e.empty()) err << "committed " << e;
    if (id.value() >= next_record_) err << id << " beyond the next id; ";
  }
  for (const auto& [ticket, t] : tickets_) {
    if (!t.write) continue;
    for (const StoredRecord& r : t.records) slots += slots_of(r.desc.kind);
  }
  if (slots != used_slots_) {
    err << "slots: committed + reserved = " << slots << ", used_slots = " << used_slots_ << "; ";
  }
  if (used_slots_ > geometry_.capacity_slots) {
    err << "used " << used_slots_ << " slots of " << geometry_.capacity_slots << "; ";
  }
  return err.str();
}

}  // namespace radixtier::sim
