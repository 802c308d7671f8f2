// DiskStore: open, recovery (journal replay), wipe, compaction, invariants.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>

#include "disk_store_files.hpp"
#include "file.hpp"
#include "journal_format.hpp"
#include "radixtier/disk/disk_store.hpp"

namespace radixtier::disk {

namespace {

std::string path_in(const DiskStoreConfig& c, const char* name) {
  return c.directory + "/" + name;
}

Result<std::vector<std::byte>> read_whole(FileSystem& fs, int fd, const char* what) {
  auto size = file_size(fs, fd, what);
  if (!size) return size.status();
  std::vector<std::byte> bytes(*size);
  auto got = pread_upto(fs, fd, bytes.data(), bytes.size(), 0, what);
  if (!got) return got.status();
  bytes.resize(*got);
  return bytes;
}

std::uint64_t random_store_id() {
  std::random_device rd;
  const std::uint64_t t =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::uint64_t id = (std::uint64_t{rd()} << 32) ^ rd() ^ (t * 0x9e3779b97f4a7c15ULL);
  return id == 0 ? 1 : id;
}

}  // namespace

Result<std::unique_ptr<DiskStore>> DiskStore::open(const DiskStoreConfig& config,
                                                   std::unique_ptr<DiskIoEngine> engine) {
  if (Status s = config.validate(); !s) return s;
  std::string fallback;
  if (engine == nullptr) {
    auto made = make_io_engine(config.io, &fallback);
    if (!made) return made.status();
    engine = std::move(made).value();
  }
  std::unique_ptr<DiskStore> store(new DiskStore(config, std::move(engine)));
  store->recovery_.io_engine = store->engine_->name();
  store->recovery_.io_fallback_reason = fallback;
  if (Status s = store->recover(); !s) {
    store->disabled_ = "open failed";  // the destructor must not sync a half-open store
    return s;
  }
  return store;
}

Status DiskStore::refuse_or_wipe(Status why) {
  if (config_.on_mismatch == OnMismatch::kRefuse) {
    return Status(why.code(), why.message() + " (in " + config_.directory +
                                  "; open with OnMismatch::kWipe to delete it and start afresh)");
  }
  recovery_.wiped = true;
  recovery_.wipe_reason = why.message();
  if (Status s = wipe_files(); !s) return s;
  return create_fresh();
}

Status DiskStore::recover() {
  if (fs_.mkdir(config_.directory.c_str(), 0755) == 0) {
    // The new directory's entry in its parent is durable before anything synced into it is
    // promised: else a power cut can take the whole store although sync() returned OK.
    if (Status s = fsync_dir(fs_, parent_dir(config_.directory)); !s) return s;
  } else if (errno != EEXIST) {
    return io_error(errno, ("mkdir " + config_.directory).c_str());
  }
  auto lock = open_file(fs_, path_in(config_, kLockFile), O_RDWR | O_CREAT);
  if (!lock) return lock.status();
  // A process killed with io_uring requests in flight keeps its files (and this lock) until
  // the kernel tears its ring down, asynchronously, shortly after the process is reaped: a
  // restart right after a kill -9 waits for that, up to two seconds, before it refuses.
  bool locked = false;
  for (int attempt = 0; attempt < 200 && !locked; ++attempt) {
    locked = fs_.flock(lock->get(), LOCK_EX | LOCK_NB) == 0;
    if (!locked && errno != EWOULDBLOCK) break;
    if (!locked) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!locked) {
    return {ErrorCode::kFailedPrecondition,
            "disk store " + config_.directory + " is open in another process or store"};
  }
  files_->lock = std::move(lock).value();
  slot_state_.assign(config_.capacity_slots(), SlotState::kFree);

  const std::string header_path = path_in(config_, kHeaderFile);
  if (!file_exists(fs_, header_path)) {
    // Creation writes the journal and data first and the header last: no header and an
    // empty journal is an interrupted creation; no header beside records is not ours to use.
    const std::string jp = path_in(config_, kJournalFile);
    const std::string dp = path_in(config_, kDataFile);
    bool leftovers = false;
    struct stat st {};
    if (fs_.stat(jp.c_str(), &st) == 0 && st.st_size > 32) leftovers = true;
    if (fs_.stat(dp.c_str(), &st) == 0 && st.st_size > 0) leftovers = true;
    if (!leftovers) return create_fresh();
    return refuse_or_wipe({ErrorCode::kDataLoss, "store header is missing beside its records"});
  }
  auto hfd = open_file(fs_, header_path, O_RDONLY);
  if (!hfd) return hfd.status();
  auto hbytes = read_whole(fs_, hfd->get(), "header");
  if (!hbytes) return hbytes.status();
  auto header = format::decode_header(*hbytes);
  if (!header) return refuse_or_wipe(header.status());
  if (std::string diff = config_.fingerprint.difference(header->fingerprint); !diff.empty()) {
    return refuse_or_wipe({ErrorCode::kFailedPrecondition, "model fingerprint mismatch: " + diff});
  }
  store_id_ = header->store_id;
  return replay_journal();
}

Status DiskStore::wipe_files() {
  for (const char* name : {kHeaderFile, kJournalFile, kDataFile}) {
    if (Status s = remove_file(fs_, path_in(config_, name)); !s) return s;
    if (Status s = remove_file(fs_, path_in(config_, name) + ".tmp"); !s) return s;
  }
  return fsync_dir(fs_, config_.directory);
}

Status DiskStore::create_fresh() {
  recovery_.created = true;
  store_id_ = random_store_id();
  auto journal = open_file(fs_, path_in(config_, kJournalFile), O_RDWR | O_CREAT | O_TRUNC);
  if (!journal) return journal.status();
  const std::vector<std::byte> prologue = format::encode_journal_prologue(store_id_, 0);
  if (Status s = pwrite_all(fs_, journal->get(), prologue.data(), prologue.size(), 0, "journal");
      !s) {
    return s;
  }
  if (Status s = fdatasync_fd(fs_, journal->get(), "journal"); !s) return s;
  auto data = open_file(fs_, path_in(config_, kDataFile), O_RDWR | O_CREAT | O_TRUNC);
  if (!data) return data.status();
  if (Status s = fsync_dir(fs_, config_.directory); !s) return s;
  const std::vector<std::byte> header = format::encode_header({store_id_, config_.fingerprint});
  if (Status s = write_file_atomic(fs_, config_.directory, kHeaderFile, header); !s) return s;
  files_->journal = std::move(journal).value();
  files_->data = std::move(data).value();
  journal_end_ = prologue.size();
  journal_entries_ = 0;
  next_seq_ = 1;
  next_id_ = 0;
  free_.clear();
  for (std::uint64_t s = slot_state_.size(); s > 0; --s) {
    free_.push_back(DiskSlotId(static_cast<std::uint32_t>(s - 1)));
  }
  return Status::ok();
}

Status DiskStore::replay_journal() {
  auto journal = open_file(fs_, path_in(config_, kJournalFile), O_RDWR);
  if (!journal) return refuse_or_wipe({ErrorCode::kDataLoss, journal.status().message()});
  auto bytes = read_whole(fs_, journal->get(), "journal");
  if (!bytes) return bytes.status();
  auto first_id = format::check_journal_prologue(*bytes, store_id_);
  if (!first_id) {
    journal->reset();
    return refuse_or_wipe(first_id.status());
  }
  const std::uint32_t snap_slots = config_.snapshot_slots();
  const std::uint32_t page_tokens = config_.fingerprint.page_tokens;
  std::unordered_set<std::uint32_t> used;  // slots of live records, any slot number
  // Every id a commit named: ids are handed out at submit and committed at completion, in
  // any order (batches complete out of order), but never twice.
  std::unordered_set<std::uint64_t> committed;
  std::size_t pos = format::kJournalPrologueBytes;
  std::uint64_t seq = 1;
  std::uint64_t max_id = 0;
  bool any_id = false;
  while (auto e = format::decode_entry(*bytes, pos, seq)) {
    RecordInfo& rec = e->entry.record;
    if (e->entry.type == format::EntryType::kFree) {
      auto it = live_.find(rec.id);
      if (it == live_.end()) break;  // names no live record: not a journal this code wrote
      for (DiskSlotId s : it->second.slots) used.erase(s.value());
      live_.erase(it);
    } else {
      const bool kv = rec.desc.kind == RecordKind::kKvPage;
      bool ok = rec.id.valid() && committed.count(rec.id.value()) == 0 &&
                rec.slots.size() == (kv ? 1u : snap_slots) &&
                rec.desc.tokens.size() == (kv ? page_tokens : 0u) &&
                (!kv || rec.desc.path == extend_path(rec.desc.parent, rec.desc.tokens));
      for (DiskSlotId s : rec.slots) ok = ok && used.count(s.value()) == 0;
      if (!ok) break;
      for (DiskSlotId s : rec.slots) used.insert(s.value());
      committed.insert(rec.id.value());
      max_id = std::max(max_id, rec.id.value());
      any_id = true;
      live_.emplace(rec.id, rec);
    }
    pos += e->bytes;
    ++seq;
    ++recovery_.journal_entries;
  }
  // The valid prefix ends here: cut the torn or uncommitted tail so appends follow it.
  recovery_.torn_tail_bytes = bytes->size() - pos;
  if (recovery_.torn_tail_bytes > 0) {
    if (Status s = truncate_fd(fs_, journal->get(), pos, "truncating the journal's torn tail");
        !s) {
      return s;
    }
    if (Status s = fdatasync_fd(fs_, journal->get(), "journal"); !s) return s;
  }
  files_->journal = std::move(journal).value();
  journal_end_ = pos;
  journal_entries_ = recovery_.journal_entries;
  next_seq_ = seq;
  next_id_ = std::max(*first_id, any_id ? max_id + 1 : 0);

  const bool data_missing = !file_exists(fs_, path_in(config_, kDataFile));
  auto data = open_file(fs_, path_in(config_, kDataFile), O_RDWR | O_CREAT);
  if (!data) return data.status();
  // Recreated (its records are dropped below as cut): records synced into it later are
  // durable only once its directory entry is.
  if (data_missing) {
    if (Status s = fsync_dir(fs_, config_.directory); !s) return s;
  }
  files_->data = std::move(data).value();
  auto data_size = file_size(fs_, files_->data.get(), "data");
  if (!data_size) return data_size.status();
  const std::uint64_t pb = config_.fingerprint.page_bytes;
  std::vector<RecordId> drop;
  for (auto& [id, rec] : live_) {
    bool over = false, cut = false;
    for (std::size_t i = 0; i < rec.slots.size(); ++i) {
      const std::uint64_t slot = rec.slots[i].value();
      const std::uint64_t len = std::min<std::uint64_t>(pb, record_bytes(rec.desc.kind) - i * pb);
      over = over || slot >= slot_state_.size();
      cut = cut || slot * pb + len > *data_size;
    }
    if (over || cut) {
      drop.push_back(id);
      ++(over ? recovery_.dropped_over_budget : recovery_.dropped_truncated);
      continue;
    }
    for (DiskSlotId s : rec.slots) slot_state_[s.value()] = SlotState::kLive;
  }
  for (RecordId id : drop) {
    live_.erase(id);
    queue_free(id);  // their slots are outside the budget or past the end: not tracked
  }
  for (std::uint64_t s = slot_state_.size(); s > 0; --s) {
    if (slot_state_[s - 1] == SlotState::kFree) {
      free_.push_back(DiskSlotId(static_cast<std::uint32_t>(s - 1)));
    }
  }
  recovery_.records = live_.size();
  if (Status s = sync(); !s) return s;
  // A smaller budget: once the drops are durable, the file shrinks to it.
  const std::uint64_t budget_end = slot_state_.size() * pb;
  if (*data_size > budget_end) {
    if (Status s = truncate_fd(fs_, files_->data.get(), budget_end,
                               "shrinking the data file to the budget");
        !s) {
      return s;
    }
  }
  if (journal_entries_ > 2 * live_.size() + config_.compact_slack) return compact();
  return Status::ok();
}

Status DiskStore::compact() {
  // The new journal holds one commit per live record; it replaces the old one by rename,
  // so a crash leaves one or the other, and both describe the same records.
  std::vector<std::byte> bytes = format::encode_journal_prologue(store_id_, next_id_);
  std::uint64_t seq = 1;
  for (const RecordInfo& r : records()) format::append_commit(bytes, seq++, r);
  if (Status s = write_file_atomic(fs_, config_.directory, kJournalFile, bytes); !s) {
    return disable("journal compaction: " + s.message());
  }
  auto journal = open_file(fs_, path_in(config_, kJournalFile), O_RDWR);
  if (!journal) return disable("journal compaction: " + journal.status().message());
  files_->journal = std::move(journal).value();
  journal_end_ = bytes.size();
  journal_entries_ = seq - 1;
  next_seq_ = seq;
  ++stats_.compactions;
  return Status::ok();
}

std::string DiskStore::check_invariants() const {
  const std::uint64_t cap = config_.capacity_slots();
  if (slot_state_.size() != cap) return "slot table size differs from capacity";
  std::vector<std::uint8_t> seen(cap, 0);
  auto mark = [&](DiskSlotId s, SlotState want, const char* where) -> std::string {
    if (!s.valid() || s.value() >= cap) return std::string("slot out of range in ") + where;
    if (seen[s.value()]++ != 0) return "slot " + std::to_string(s.value()) + " in two places";
    if (slot_state_[s.value()] != want) {
      return "slot " + std::to_string(s.value()) + " in " + where + " has another state";
    }
    return "";
  };
  for (DiskSlotId s : free_) {
    if (std::string e = mark(s, SlotState::kFree, "the free list"); !e.empty()) return e;
  }
  for (DiskSlotId s : freeing_) {
    if (std::string e = mark(s, SlotState::kFreeing, "the freeing list"); !e.empty()) return e;
  }
  const std::uint32_t snap_slots = config_.snapshot_slots();
  for (const auto& [id, r] : live_) {
    if (id != r.id) return "live record keyed by another id";
    if (id.value() >= next_id_) return "live record id at or above next_id";
    const bool kv = r.desc.kind == RecordKind::kKvPage;
    if (r.slots.size() != (kv ? 1u : snap_slots)) return "record with a wrong slot count";
    if (kv && r.desc.path != extend_path(r.desc.parent, r.desc.tokens)) {
      return "kv record whose path hash does not match its tokens";
    }
    for (DiskSlotId s : r.slots) {
      if (std::string e = mark(s, SlotState::kLive, "a live record"); !e.empty()) return e;
    }
  }
  for (std::uint64_t s = 0; s < cap; ++s) {
    if (seen[s] == 0 && slot_state_[s] != SlotState::kWriting) {
      return "slot " + std::to_string(s) + " is in no place";
    }
    if (seen[s] != 0 && slot_state_[s] == SlotState::kWriting) {
      return "slot " + std::to_string(s) + " is being written and listed elsewhere";
    }
  }
  for (const auto& [id, n] : read_pins_) {
    if (live_.count(id) == 0 || n == 0) return "read pin on a record that is not live";
  }
  if (journal_end_ < format::kJournalPrologueBytes) return "journal end before its prologue";
  return "";
}

}  // namespace radixtier::disk
