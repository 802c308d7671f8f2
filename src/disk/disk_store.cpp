// DiskStore: writes, reads, erase and sync (recovery is in disk_store_recovery.cpp).
#include "radixtier/disk/disk_store.hpp"

#include <xxhash.h>

#include <algorithm>
#include <string>

#include "disk_store_files.hpp"
#include "file.hpp"
#include "journal_format.hpp"

namespace radixtier::disk {

namespace {

/// XXH3-64 of the pieces' concatenation, seeded with the record id (streaming gives the
/// one-shot hash of the same bytes).
template <class Span>
std::uint64_t record_checksum(const std::vector<Span>& pieces, RecordId id) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, id.value());
  for (const auto& p : pieces) XXH3_64bits_update(state, p.data(), p.size());
  const std::uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

/// The per-slot spans of a record of `total` bytes in `bytes` (or the caller's own pieces);
/// empty when their sizes do not fit slots of `pb` bytes.
template <class Span>
std::vector<Span> slot_pieces(Span bytes, const std::vector<Span>& pieces, std::size_t total,
                              std::size_t pb) {
  std::vector<Span> out;
  if (!bytes.empty()) {
    if (bytes.size() != total) return {};
    for (std::size_t at = 0; at < total; at += pb) {
      out.push_back(bytes.subspan(at, std::min(pb, total - at)));
    }
    return out;
  }
  const std::size_t n = (total + pb - 1) / pb;
  if (pieces.size() != n) return {};
  for (std::size_t i = 0; i < n; ++i) {
    if (pieces[i].data() == nullptr || pieces[i].size() != std::min(pb, total - i * pb)) return {};
  }
  return pieces;
}

std::string describe(const RecordInfo& r) {
  return "record " + std::to_string(r.id.value()) + " (" + to_string(r.desc.kind) + ", boundary " +
         std::to_string(r.desc.boundary) + ")";
}

}  // namespace

PendingWrites& PendingWrites::operator=(PendingWrites&& o) noexcept {
  if (this != &o) {
    abandon();
    store_ = std::exchange(o.store_, nullptr);
    ticket_ = std::move(o.ticket_);
    records_ = std::move(o.records_);
  }
  return *this;
}
PendingWrites::~PendingWrites() {
  abandon();
}
void PendingWrites::abandon() {
  if (store_ == nullptr) return;
  ticket_.reset();  // waits: the slots are not reused while bytes are on their way
  store_->abandon_writes(records_);
  store_ = nullptr;
}

PendingReads& PendingReads::operator=(PendingReads&& o) noexcept {
  if (this != &o) {
    abandon();
    store_ = std::exchange(o.store_, nullptr);
    ticket_ = std::move(o.ticket_);
    reads_ = std::move(o.reads_);
  }
  return *this;
}
PendingReads::~PendingReads() {
  abandon();
}
void PendingReads::abandon() {
  if (store_ == nullptr) return;
  ticket_.reset();
  store_->unpin(reads_);
  store_ = nullptr;
}

DiskStore::DiskStore(DiskStoreConfig config, std::unique_ptr<DiskIoEngine> engine)
    : config_(std::move(config)),
      fs_(config_.file_system ? *config_.file_system : posix_file_system()),
      engine_(fs_.observe(std::move(engine))),
      files_(std::make_unique<Files>()) {}

DiskStore::~DiskStore() {
  if (disabled_.empty()) (void)sync();  // best effort: unsynced commits may be lost anyway
}

std::size_t DiskStore::record_bytes(RecordKind kind) const {
  return kind == RecordKind::kKvPage ? config_.fingerprint.page_bytes
                                     : config_.fingerprint.snapshot_bytes;
}

Status DiskStore::check_usable() const {
  if (disabled_.empty()) return Status::ok();
  return {ErrorCode::kFailedPrecondition, "disk store is switched off: " + disabled_};
}

Status DiskStore::disable(std::string why) {
  disabled_ = why;
  return {ErrorCode::kFailedPrecondition, "disk store switched off: " + why};
}

Status DiskStore::validate_request(const WriteRequest& r) const {
  const RecordDesc& d = r.desc;
  const ModelFingerprint& f = config_.fingerprint;
  if (d.boundary == 0 || d.boundary % f.page_tokens != 0) {
    return invalid_argument("boundary " + std::to_string(d.boundary) +
                            " is not a positive multiple of page_tokens " +
                            std::to_string(f.page_tokens));
  }
  if (!r.bytes.empty() && !r.pieces.empty()) {
    return invalid_argument("a record's bytes are contiguous or in pieces, not both");
  }
  if (r.bytes.empty() && r.pieces.empty()) return invalid_argument("record bytes are empty");
  if (!r.bytes.empty() && r.bytes.data() == nullptr) {
    return invalid_argument("record bytes are null");
  }
  if (slot_pieces(r.bytes, r.pieces, record_bytes(d.kind), f.page_bytes).empty()) {
    std::size_t got = r.bytes.size();
    for (const auto& p : r.pieces) got += p.size();
    return invalid_argument(std::string(to_string(d.kind)) + " of " + std::to_string(got) +
                            " bytes in " + std::to_string(r.bytes.empty() ? r.pieces.size() : 1) +
                            " piece(s), the store's is " + std::to_string(record_bytes(d.kind)) +
                            " bytes in slots of " + std::to_string(f.page_bytes));
  }
  if (d.kind == RecordKind::kKvPage) {
    if (d.tokens.size() != f.page_tokens) {
      return invalid_argument("kv_page has " + std::to_string(d.tokens.size()) +
                              " tokens, page_tokens is " + std::to_string(f.page_tokens));
    }
    if (d.parent.is_root() != (d.boundary == f.page_tokens)) {
      return invalid_argument("the root is the parent of the first page (boundary " +
                              std::to_string(f.page_tokens) + ") and of no other");
    }
    return Status::ok();
  }
  if (d.kind != RecordKind::kSnapshot) return invalid_argument("unknown record kind");
  if (f.snapshot_bytes == 0) return invalid_argument("this store holds no snapshots");
  if (!d.tokens.empty() || !d.parent.is_root()) {
    return invalid_argument("a snapshot record names its path hash, not tokens or a parent");
  }
  if (d.path.is_root()) return invalid_argument("a snapshot's path hash is not the root's");
  return Status::ok();
}

Result<PendingWrites> DiskStore::submit_writes(std::vector<WriteRequest> requests) {
  if (Status s = check_usable(); !s) return s;
  if (requests.empty()) return invalid_argument("no records to write");
  std::size_t need = 0;
  for (const WriteRequest& r : requests) {
    if (Status s = validate_request(r); !s) return s;
    need += r.desc.kind == RecordKind::kKvPage ? 1 : config_.snapshot_slots();
  }
  if (need > free_.size()) {
    return out_of_memory("disk budget full: " + std::to_string(need) + " slots needed, " +
                         std::to_string(free_.size()) + " free, " +
                         std::to_string(freeing_.size()) + " freed until the next sync");
  }
  const std::uint64_t pb = config_.fingerprint.page_bytes;
  PendingWrites pending;
  std::vector<IoOp> ops;
  for (WriteRequest& r : requests) {
    RecordInfo info;
    info.id = RecordId(next_id_++);
    info.desc = std::move(r.desc);
    if (info.desc.kind == RecordKind::kKvPage) info.desc.path = info.desc.node_path();
    const auto pieces = slot_pieces(r.bytes, r.pieces, record_bytes(info.desc.kind), pb);
    info.checksum = record_checksum(pieces, info.id);
    for (const auto& piece : pieces) {
      const DiskSlotId slot = free_.back();
      free_.pop_back();
      slot_state_[slot.value()] = SlotState::kWriting;
      info.slots.push_back(slot);
      ops.push_back(IoOp::write(files_->data.get(), slot.value() * pb, piece.data(), piece.size()));
    }
    pending.records_.push_back(std::move(info));
  }
  auto ticket = engine_->submit(std::move(ops));
  if (!ticket) {
    abandon_writes(pending.records_);
    return ticket.status();
  }
  pending.ticket_ = std::move(ticket).value();
  pending.store_ = this;
  return pending;
}

void DiskStore::abandon_writes(std::vector<RecordInfo>& records) {
  // Never committed: the slots are free at once (no journal entry names them).
  for (RecordInfo& r : records) {
    for (DiskSlotId s : r.slots) {
      slot_state_[s.value()] = SlotState::kFree;
      free_.push_back(s);
    }
  }
  records.clear();
}

Result<std::vector<RecordId>> DiskStore::complete_writes(PendingWrites&& pending) {
  if (pending.store_ != this) return invalid_argument("these writes are not this store's");
  Status io = pending.ticket_.wait();
  pending.ticket_.reset();
  pending.store_ = nullptr;
  std::vector<RecordInfo> records = std::move(pending.records_);
  if (Status s = check_usable(); !s && io) io = s;
  if (!io) {
    ++stats_.write_failures;
    abandon_writes(records);
    return io;
  }
  std::vector<RecordId> ids;
  for (RecordInfo& r : records) {
    for (DiskSlotId s : r.slots) slot_state_[s.value()] = SlotState::kLive;
    ids.push_back(r.id);
    queue_commit(r);
    live_.emplace(r.id, std::move(r));
  }
  stats_.records_written += ids.size();
  if (batch_entries_ >= config_.journal_batch) {
    if (Status s = sync(); !s) return s;
  }
  return ids;
}

Result<RecordId> DiskStore::put(const RecordDesc& desc, std::span<const std::byte> bytes) {
  std::vector<WriteRequest> one;
  one.push_back({desc, bytes, {}});
  auto pending = submit_writes(std::move(one));
  if (!pending) return pending.status();
  auto ids = complete_writes(std::move(pending).value());
  if (!ids) return ids.status();
  return ids->front();
}

Result<PendingReads> DiskStore::submit_reads(std::vector<ReadRequest> requests) {
  if (Status s = check_usable(); !s) return s;
  if (requests.empty()) return invalid_argument("no records to read");
  const std::uint64_t pb = config_.fingerprint.page_bytes;
  std::vector<IoOp> ops;
  for (const ReadRequest& r : requests) {
    auto it = live_.find(r.id);
    if (it == live_.end()) {
      return not_found("no live record " + std::to_string(r.id.value()) + " in the store");
    }
    const RecordInfo& info = it->second;
    const auto pieces = slot_pieces(r.out, r.out_pieces, record_bytes(info.desc.kind), pb);
    if (pieces.empty() || (!r.out.empty() && !r.out_pieces.empty())) {
      std::size_t got = r.out.size();
      for (const auto& p : r.out_pieces) got += p.size();
      return invalid_argument(
          describe(info) + " has " + std::to_string(record_bytes(info.desc.kind)) + " bytes, got " +
          std::to_string(got) + " bytes of buffer in " +
          std::to_string(r.out.empty() ? r.out_pieces.size() : 1) + " piece(s)");
    }
    for (std::size_t i = 0; i < info.slots.size(); ++i) {
      ops.push_back(IoOp::read(files_->data.get(), info.slots[i].value() * pb, pieces[i].data(),
                               pieces[i].size()));
    }
  }
  auto ticket = engine_->submit(std::move(ops));
  if (!ticket) return ticket.status();
  for (const ReadRequest& r : requests) ++read_pins_[r.id];
  PendingReads pending;
  pending.store_ = this;
  pending.ticket_ = std::move(ticket).value();
  pending.reads_ = std::move(requests);
  return pending;
}

void DiskStore::unpin(const std::vector<ReadRequest>& reads) {
  for (const ReadRequest& r : reads) {
    auto it = read_pins_.find(r.id);
    if (it != read_pins_.end() && --it->second == 0) read_pins_.erase(it);
  }
}

std::vector<Status> DiskStore::complete_reads(PendingReads&& pending) {
  std::vector<Status> out;
  if (pending.store_ != this) {
    out.assign(pending.reads_.size(), invalid_argument("these reads are not this store's"));
    return out;
  }
  const Status io = pending.ticket_.wait();
  pending.ticket_.reset();
  pending.store_ = nullptr;
  std::vector<ReadRequest> reads = std::move(pending.reads_);
  unpin(reads);
  for (const ReadRequest& r : reads) {
    auto it = live_.find(r.id);
    if (it == live_.end()) {  // the same record twice in one batch, lost at the first
      out.push_back(not_found("record " + std::to_string(r.id.value()) + " was lost"));
      continue;
    }
    const auto pieces = slot_pieces(r.out, r.out_pieces, record_bytes(it->second.desc.kind),
                                    config_.fingerprint.page_bytes);
    if (record_checksum(pieces, r.id) == it->second.checksum) {
      ++stats_.records_read;
      out.push_back(Status::ok());
      continue;
    }
    if (!io && io.code() != ErrorCode::kDataLoss) {
      ++stats_.read_failures;  // transient for all we know: keep the record
      out.push_back({ErrorCode::kTransferFailed, describe(it->second) + ": " + io.message()});
      continue;
    }
    ++stats_.records_lost;
    out.push_back({ErrorCode::kDataLoss,
                   describe(it->second) + " is lost: " +
                       (io ? std::string("its bytes fail their checksum") : io.message())});
    forget_record(r.id);
  }
  if (batch_entries_ >= config_.journal_batch) (void)sync();
  return out;
}

Status DiskStore::get(RecordId id, std::span<std::byte> out) {
  std::vector<ReadRequest> one{{id, out, {}}};
  auto pending = submit_reads(std::move(one));
  if (!pending) return pending.status();
  return complete_reads(std::move(pending).value()).front();
}

Status DiskStore::erase(RecordId id) {
  if (Status s = check_usable(); !s) return s;
  if (live_.find(id) == live_.end()) {
    return not_found("no live record " + std::to_string(id.value()) + " to erase");
  }
  if (read_pins_.count(id) != 0) {
    return {ErrorCode::kFailedPrecondition,
            "record " + std::to_string(id.value()) + " is being read: complete the read first"};
  }
  forget_record(id);
  if (batch_entries_ >= config_.journal_batch) return sync();
  return Status::ok();
}

void DiskStore::forget_record(RecordId id) {
  auto it = live_.find(id);
  for (DiskSlotId s : it->second.slots) {
    // Reused only once the free entry is durable: until then a crash brings the record back,
    // and its bytes must still be there.
    slot_state_[s.value()] = SlotState::kFreeing;
    freeing_.push_back(s);
  }
  live_.erase(it);
  read_pins_.erase(id);  // another batch reading it finds it gone (kNotFound), never reused bytes
  queue_free(id);
}

void DiskStore::queue_commit(const RecordInfo& info) {
  format::append_commit(batch_, next_seq_++, info);
  ++batch_entries_;
}

void DiskStore::queue_free(RecordId id) {
  format::append_free(batch_, next_seq_++, id);
  ++batch_entries_;
}

Status DiskStore::sync() {
  if (Status s = check_usable(); !s) return s;
  if (batch_entries_ == 0) return Status::ok();
  // 1. The data of every record the batch commits is durable before any commit entry is.
  if (Status s = fdatasync_fd(fs_, files_->data.get(), "fdatasync of data"); !s) {
    return disable(s.message());
  }
  // 2. The entries, then 3. their durability. A crash between leaves a torn tail, ignored.
  if (Status s = write_journal_entries(batch_); !s) return s;
  if (Status s = fdatasync_fd(fs_, files_->journal.get(), "fdatasync of journal"); !s) {
    return disable(s.message());
  }
  journal_end_ += batch_.size();
  journal_entries_ += batch_entries_;
  batch_.clear();
  batch_entries_ = 0;
  for (DiskSlotId s : freeing_) {
    slot_state_[s.value()] = SlotState::kFree;
    free_.push_back(s);
  }
  freeing_.clear();
  ++stats_.syncs;
  if (journal_entries_ > 2 * live_.size() + config_.compact_slack) return compact();
  return Status::ok();
}

Status DiskStore::write_journal_entries(std::span<const std::byte> bytes) {
  // At journal_end_: a failed or partial write leaves a torn tail the next write overwrites.
  return pwrite_all(fs_, files_->journal.get(), bytes.data(), bytes.size(), journal_end_,
                    "journal append");
}

Result<std::uint64_t> DiskStore::scrub() {
  if (Status s = check_usable(); !s) return s;
  std::vector<RecordId> ids;
  for (const auto& [id, info] : live_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  const std::uint64_t lost_before = stats_.records_lost;
  constexpr std::size_t kBatch = 32;
  for (std::size_t at = 0; at < ids.size(); at += kBatch) {
    std::vector<std::vector<std::byte>> bufs;
    std::vector<ReadRequest> reads;
    for (std::size_t i = at; i < std::min(ids.size(), at + kBatch); ++i) {
      bufs.emplace_back(record_bytes(live_.at(ids[i]).desc.kind));
    }
    for (std::size_t i = at; i < std::min(ids.size(), at + kBatch); ++i) {
      reads.push_back({ids[i], bufs[i - at], {}});
    }
    auto pending = submit_reads(std::move(reads));
    if (!pending) return pending.status();
    (void)complete_reads(std::move(pending).value());
  }
  if (Status s = sync(); !s) return s;
  return stats_.records_lost - lost_before;
}

const RecordInfo* DiskStore::find(RecordId id) const {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : &it->second;
}

std::vector<RecordInfo> DiskStore::records() const {
  std::vector<RecordInfo> out;
  out.reserve(live_.size());
  for (const auto& [id, info] : live_) out.push_back(info);
  std::sort(out.begin(), out.end(),
            [](const RecordInfo& a, const RecordInfo& b) { return a.id < b.id; });
  return out;
}

DiskStoreStats DiskStore::stats() const {
  DiskStoreStats s = stats_;
  s.capacity_slots = slot_state_.size();
  s.free_slots = free_.size();
  s.freeing_slots = freeing_.size();
  s.writing_slots = static_cast<std::uint64_t>(
      std::count(slot_state_.begin(), slot_state_.end(), SlotState::kWriting));
  s.records = live_.size();
  s.unsynced_entries = batch_entries_;
  return s;
}

}  // namespace radixtier::disk
