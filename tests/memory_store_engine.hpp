// A StoreEngine for tests: records with real bytes in process memory, copied from and to the
// host arenas of a HostTransferEngine, with a checksum per record and fault injection. A
// write copies its host pages when it finishes (as a real engine reads them while the write
// runs), so a cache that reused a write's source pages early shows as a byte mismatch; a read
// fills its host pages only when it finishes.
//
// Ticket states: Pending (held: hold(true)) --release()--> Ready --finish_*--> gone.
// Faults: fail_next_writes(n) (the next n write batches fail: nothing committed),
// corrupt(id) (a flipped byte: the read reports kDataLoss and the record is erased),
// io_error_next_reads(n) (kTransferFailed, the record kept), refuse_next(n) (submit refused);
// each after `skip` reads / submits that go through, to fail in the middle of a stream.
// The records outlive a cache: a test "restarts" by making a new cache on the same store.
// crash(seed) is a kill -9 at that instant (what a real store promises, docs/architecture.md
// "What a caller can rely on"): writes in flight commit nothing, each record committed since
// the last sync() survives or not (whole or absent; the seed picks), and nothing the dying
// process does afterwards (its destructor) reaches the store until reopen(). Not modelled: an
// erase since the last sync coming back (the memory store reuses an erased record's slots at
// once, so there is nothing to bring back).
#pragma once

#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "radixtier/transfer/host_transfer_engine.hpp"
#include "radixtier/transfer/store_engine.hpp"

namespace radixtier::testing {

class MemoryStoreEngine final : public StoreEngine {
 public:
  /// A store for caches of `config`'s geometry, `capacity_slots` pages large. attach() the
  /// host arenas before the first write or read.
  MemoryStoreEngine(const CacheConfig& config, std::uint64_t capacity_slots) {
    geometry_.page_tokens = config.page_size;
    geometry_.page_bytes = config.page_bytes;
    geometry_.snapshot_bytes = config.snapshot_bytes;
    geometry_.capacity_slots = capacity_slots;
  }
  void attach(HostArenas& host) { host_ = &host; }

  StoreGeometry geometry() const override { return geometry_; }
  std::uint64_t free_slots() const override {
    return geometry_.capacity_slots - used_slots_ - reserved_slots_;
  }
  std::vector<StoredRecord> records() const override {
    std::vector<StoredRecord> out;
    for (const auto& [id, r] : records_) out.push_back({RecordId(id), r.desc});
    return out;
  }

  Result<std::uint64_t> submit_writes(std::vector<StoreWrite> batch) override {
    if (crashed_) return Status(ErrorCode::kTransferFailed, "memory store: the process crashed");
    if (refused()) return Status(ErrorCode::kTransferFailed, "memory store: refused (injected)");
    std::uint64_t slots = 0;
    for (const StoreWrite& w : batch) {
      if (w.pages.size() != pieces(w.desc.kind)) return invalid_argument("wrong piece count");
      for (HostPageId p : w.pages) {
        if (!p.valid() || p.value() >= host_->host_pages()) return invalid_argument("bad page");
      }
      slots += w.pages.size();
    }
    if (slots > free_slots()) return out_of_memory("memory store: full");
    reserved_slots_ += slots;
    Pending t;
    t.writes = std::move(batch);
    t.slots = slots;
    return add(std::move(t));
  }

  Result<std::uint64_t> submit_reads(std::vector<StoreRead> batch) override {
    if (crashed_) return Status(ErrorCode::kTransferFailed, "memory store: the process crashed");
    if (refused()) return Status(ErrorCode::kTransferFailed, "memory store: refused (injected)");
    for (const StoreRead& r : batch) {
      auto it = records_.find(r.record.value());
      if (it == records_.end()) return not_found("memory store: no such record");
      if (r.pages.size() != pieces(it->second.desc.kind))
        return invalid_argument("wrong piece count");
    }
    Pending t;
    t.reads = std::move(batch);
    return add(std::move(t));
  }

  bool ready(std::uint64_t ticket) override {
    auto it = pending_.find(ticket);
    return it != pending_.end() && !it->second.held;
  }

  Result<std::vector<RecordId>> finish_writes(std::uint64_t ticket) override {
    Pending t = take(ticket);
    reserved_slots_ -= t.slots;
    if (crashed_) return Status(ErrorCode::kTransferFailed, "memory store: the process crashed");
    if (fail_writes_ > 0) {
      --fail_writes_;
      ++failed_writes;
      return Status(ErrorCode::kTransferFailed, "memory store: write failed (injected)");
    }
    std::vector<RecordId> ids;
    for (const StoreWrite& w : t.writes) {
      Record r;
      r.desc = w.desc;
      if (r.desc.kind == RecordKind::kKvPage)
        r.desc.path = extend_path(w.desc.parent, w.desc.tokens);
      const std::size_t total = bytes_of(w.desc.kind);
      r.bytes.resize(total);
      for (std::size_t k = 0; k < w.pages.size(); ++k) {
        const std::size_t off = k * geometry_.page_bytes;
        const std::size_t n = std::min(geometry_.page_bytes, total - off);
        std::memcpy(r.bytes.data() + off, host_->host_page(w.pages[k]).data(), n);
      }
      r.checksum = sum(r.bytes);
      r.slots = w.pages.size();
      used_slots_ += r.slots;
      ids.push_back(RecordId(next_id_));
      unsynced_.insert(next_id_);
      records_.emplace(next_id_++, std::move(r));
    }
    ++written_batches;
    return ids;
  }

  std::vector<Status> finish_reads(std::uint64_t ticket) override {
    Pending t = take(ticket);
    std::vector<Status> out;
    for (const StoreRead& rd : t.reads) {
      if (crashed_) {
        out.push_back(Status(ErrorCode::kTransferFailed, "memory store: the process crashed"));
        continue;
      }
      auto it = records_.find(rd.record.value());
      if (it == records_.end()) {
        out.push_back(Status(ErrorCode::kDataLoss, "memory store: the record is gone"));
        continue;
      }
      if (io_errors_ > 0 && io_skip_ > 0) {
        --io_skip_;
      } else if (io_errors_ > 0) {
        --io_errors_;
        out.push_back(Status(ErrorCode::kTransferFailed, "memory store: I/O error (injected)"));
        continue;
      }
      Record& r = it->second;
      if (sum(r.bytes) != r.checksum) {
        used_slots_ -= r.slots;
        records_.erase(it);
        ++lost;
        out.push_back(Status(ErrorCode::kDataLoss, "memory store: checksum mismatch"));
        continue;
      }
      for (std::size_t k = 0; k < rd.pages.size(); ++k) {
        const std::size_t off = k * geometry_.page_bytes;
        const std::size_t n = std::min(geometry_.page_bytes, r.bytes.size() - off);
        std::memcpy(host_->host_page(rd.pages[k]).data(), r.bytes.data() + off, n);
      }
      ++reads_ok;
      out.push_back(Status::ok());
    }
    return out;
  }

  Status erase(RecordId id) override {
    if (crashed_) return Status::ok();  // the process is gone: nothing reaches the store
    auto it = records_.find(id.value());
    if (it == records_.end()) return not_found("memory store: no such record");
    used_slots_ -= it->second.slots;
    records_.erase(it);
    unsynced_.erase(id.value());
    ++erased;
    return Status::ok();
  }
  Status sync() override {
    if (crashed_) return Status::ok();
    ++syncs;
    unsynced_.clear();
    return Status::ok();
  }

  // --- faults and control -----------------------------------------------------------------
  void fail_next_writes(int n) { fail_writes_ = n; }
  void io_error_next_reads(int n, int skip = 0) {
    io_errors_ = n;
    io_skip_ = skip;
  }
  void refuse_next(int n, int skip = 0) {
    refuse_ = n;
    refuse_skip_ = skip;
  }
  /// Flips a byte of a record: its next read fails its checksum.
  void corrupt(RecordId id) { records_.at(id.value()).bytes[0] ^= std::byte{0x5A}; }
  /// While held, new tickets stay pending (ready() false) until release().
  void hold(bool on) { hold_ = on; }
  void release() {
    for (auto& [id, t] : pending_) t.held = false;
  }
  std::size_t pending_count() const { return pending_.size(); }

  /// A kill -9 now (see the top): drops each record committed since the last sync() with
  /// probability 1/2 (by `seed`), and ignores every call until reopen().
  void crash(std::uint64_t seed) {
    for (std::uint64_t id : unsynced_) {
      std::uint64_t x = (id + 1) * 0x9E3779B97F4A7C15ull ^ seed;
      x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
      if ((x >> 33) & 1) continue;
      auto it = records_.find(id);
      if (it == records_.end()) continue;  // erased after its check failed
      used_slots_ -= it->second.slots;
      records_.erase(it);
      ++crash_lost;
    }
    unsynced_.clear();
    crashed_ = true;
  }
  /// The next process opens the store: the dead one's tickets are gone.
  void reopen() {
    crashed_ = false;
    pending_.clear();
    reserved_slots_ = 0;
  }
  std::size_t record_count() const { return records_.size(); }

  std::uint64_t written_batches = 0, failed_writes = 0, reads_ok = 0, lost = 0, erased = 0,
                syncs = 0, crash_lost = 0;

 private:
  struct Record {
    RecordDesc desc;
    std::vector<std::byte> bytes;
    std::uint64_t checksum = 0;
    std::size_t slots = 0;
  };
  struct Pending {
    std::vector<StoreWrite> writes;
    std::vector<StoreRead> reads;
    std::uint64_t slots = 0;
    bool held = false;
  };
  std::size_t pieces(RecordKind kind) const {
    return kind == RecordKind::kKvPage ? 1 : geometry_.snapshot_slots();
  }
  std::size_t bytes_of(RecordKind kind) const {
    return kind == RecordKind::kKvPage ? geometry_.page_bytes : geometry_.snapshot_bytes;
  }
  static std::uint64_t sum(const std::vector<std::byte>& b) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::byte x : b) h = (h ^ std::uint64_t(x)) * 0x100000001b3ull;
    return h;
  }
  /// A submit the injected refusals take (after the ones they let through).
  bool refused() {
    if (refuse_ == 0) return false;
    if (refuse_skip_ > 0) {
      --refuse_skip_;
      return false;
    }
    --refuse_;
    return true;
  }
  std::uint64_t add(Pending t) {
    t.held = hold_;
    pending_.emplace(next_ticket_, std::move(t));
    return next_ticket_++;
  }
  Pending take(std::uint64_t ticket) {
    auto it = pending_.find(ticket);
    if (it == pending_.end()) throw std::logic_error("memory store: unknown ticket");
    Pending t = std::move(it->second);
    pending_.erase(it);
    return t;
  }

  HostArenas* host_ = nullptr;
  StoreGeometry geometry_;
  std::map<std::uint64_t, Record> records_;
  std::map<std::uint64_t, Pending> pending_;
  std::set<std::uint64_t> unsynced_;  ///< records committed since the last sync()
  std::uint64_t next_id_ = 0, next_ticket_ = 1;
  std::uint64_t used_slots_ = 0, reserved_slots_ = 0;
  int fail_writes_ = 0, io_errors_ = 0, refuse_ = 0, io_skip_ = 0, refuse_skip_ = 0;
  bool hold_ = false;
  bool crashed_ = false;
};

}  // namespace radixtier::testing
