// Helpers of the disk store tests: a temporary directory, a small store geometry, record
// bytes that are a function of the record's description (so a reader can check every byte
// of a record it did not write), and an I/O engine that fails on request.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "radixtier/disk/disk_store.hpp"
#include "radixtier/disk/io_engine.hpp"
#include "radixtier/disk/record.hpp"

namespace radixtier::disk::testing {

class TempDir {
 public:
  /// Under `base` (default: the system's temporary directory).
  explicit TempDir(const std::filesystem::path& base = std::filesystem::temp_directory_path()) {
    std::string tmpl = (base / "radixtier-disk-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string store() const { return path_ + "/store"; }

 private:
  std::string path_;
};

inline ModelFingerprint small_fingerprint() {
  ModelFingerprint f;
  f.page_tokens = 4;
  f.page_bytes = 4096;
  f.snapshot_bytes = 3 * 4096 + 100;  // 4 slots, the last one partial
  f.model_id = "tiny-hybrid";
  f.weights_version = "v1";
  return f;
}

inline DiskStoreConfig small_config(const std::string& dir, std::uint64_t slots = 64) {
  DiskStoreConfig c;
  c.directory = dir;
  c.fingerprint = small_fingerprint();
  c.budget_bytes = slots * c.fingerprint.page_bytes;
  c.journal_batch = 8;
  c.io.kind = IoEngineKind::kThreadPool;
  c.io.slice_bytes = 4096;  // several slices per snapshot
  c.io.io_threads = 2;
  return c;
}

inline std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The bytes a record with this description holds: a function of its kind, path and boundary.
inline std::vector<std::byte> expected_bytes(const RecordDesc& d, std::size_t n) {
  const PathHash p = d.node_path();
  std::uint64_t x = p.lo ^ (p.hi * 3) ^ (static_cast<std::uint64_t>(d.kind) << 56) ^ d.boundary;
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t v = splitmix(x);
    std::memcpy(out.data() + i, &v, std::min<std::size_t>(8, n - i));
  }
  return out;
}

inline std::vector<Token> page_tokens_for(std::uint64_t seed, std::uint32_t n) {
  std::vector<Token> t(n);
  for (auto& v : t) v = static_cast<Token>(splitmix(seed) % 50000);
  return t;
}

/// A random record to write beside `live`: a page extending a live page (or the root), or,
/// one time in three when it has a base page, a snapshot at that page's end. Consistent with
/// the store's rules (4-token pages), so a crash test's writes are all valid.
inline RecordDesc random_desc(std::mt19937_64& rng, const std::vector<RecordInfo>& live) {
  const RecordInfo* base = nullptr;
  std::vector<const RecordInfo*> kv;
  for (const RecordInfo& r : live) {
    if (r.desc.kind == RecordKind::kKvPage) kv.push_back(&r);
  }
  if (!kv.empty() && rng() % 4 != 0) base = kv[rng() % kv.size()];
  if (base != nullptr && rng() % 3 == 0) {
    return RecordDesc::snapshot(base->desc.node_path(), base->desc.boundary);
  }
  const PathHash parent = base ? base->desc.node_path() : PathHash::root();
  return RecordDesc::kv_page(parent, (base ? base->desc.boundary : 0) + 4,
                             page_tokens_for(rng(), 4));
}

/// Wraps an engine; arms one failure: at the next submit (refused) or at the next wait (the
/// batch ran, then reports `status`, and its read destinations are scribbled over, as a
/// failed read leaves them).
class FaultyIoEngine final : public DiskIoEngine {
 public:
  explicit FaultyIoEngine(std::unique_ptr<DiskIoEngine> inner) : inner_(std::move(inner)) {}
  void fail_next_submit(Status s) { submit_fault_ = std::move(s); }
  void fail_next_wait(Status s) { wait_fault_ = std::move(s); }

  Result<IoTicket> submit(std::vector<IoOp> ops) override {
    if (!submit_fault_) return std::exchange(submit_fault_, Status::ok());
    std::vector<IoOp> copy = ops;
    auto t = inner_->submit(std::move(ops));
    if (!t) return t.status();
    const std::uint64_t id = t->id();
    inner_tickets_.emplace(id, std::move(t).value());
    ops_[id] = std::move(copy);
    if (!wait_fault_) failing_[id] = std::exchange(wait_fault_, Status::ok());
    return IoTicket(this, id);
  }
  IoState poll(std::uint64_t id) override {
    IoState s = inner_tickets_.at(id).poll();
    if (s == IoState::kDone && failing_.count(id)) return IoState::kFailed;
    return s;
  }
  Status wait(std::uint64_t id) override {
    Status s = inner_tickets_.at(id).wait();
    auto it = failing_.find(id);
    if (it == failing_.end()) return s;
    for (const IoOp& op : ops_[id]) {
      if (op.kind == IoOp::Kind::kRead) std::memset(op.buffer, 0xA5, op.length);
    }
    return it->second;
  }
  void release(std::uint64_t id) override {
    inner_tickets_.erase(id);
    ops_.erase(id);
    failing_.erase(id);
  }
  IoEngineKind kind() const override { return inner_->kind(); }
  const char* name() const override { return "faulty"; }
  IoEngineStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<DiskIoEngine> inner_;
  Status submit_fault_;
  Status wait_fault_;
  std::unordered_map<std::uint64_t, IoTicket> inner_tickets_;
  std::unordered_map<std::uint64_t, std::vector<IoOp>> ops_;
  std::unordered_map<std::uint64_t, Status> failing_;
};

/// Reads every live record of `store` and checks each byte against expected_bytes(); returns
/// "" or what is wrong. Records that report kDataLoss are counted in *lost (never compared).
inline std::string check_every_byte(DiskStore& store, std::uint64_t* lost = nullptr) {
  for (const RecordInfo& r : store.records()) {
    std::vector<std::byte> buf(store.record_bytes(r.desc.kind));
    Status s = store.get(r.id, buf);
    if (s.code() == ErrorCode::kDataLoss) {
      if (lost) ++*lost;
      continue;
    }
    if (!s) return "record " + std::to_string(r.id.value()) + ": " + s.to_string();
    if (buf != expected_bytes(r.desc, buf.size())) {
      return "record " + std::to_string(r.id.value()) + " served wrong bytes";
    }
  }
  return "";
}

}  // namespace radixtier::disk::testing
