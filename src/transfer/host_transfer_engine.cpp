#include "radixtier/transfer/host_transfer_engine.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace radixtier {

HostArenas::HostArenas(const CacheConfig& c)
    : page_bytes_(c.page_bytes),
      snapshot_bytes_(c.snapshot_bytes),
      gpu_pages_(c.gpu_pages),
      host_pages_(static_cast<std::uint32_t>(c.host_pool_pages())),
      gpu_slots_(c.gpu_snapshot_slots),
      host_slots_(c.host_snapshot_slots),
      gpu_kv_(std::size_t{c.gpu_pages} * c.page_bytes),
      host_kv_(c.host_pool_pages() * c.page_bytes),
      gpu_snap_(std::size_t{c.gpu_snapshot_slots} * c.snapshot_bytes),
      host_snap_(std::size_t{c.host_snapshot_slots} * c.snapshot_bytes) {}

namespace {
/// Rule 9: every id is bounds-checked in every build, not by assert alone.
template <class Id>
std::size_t checked_offset(Id id, std::uint32_t count, std::size_t stride, const char* arena) {
  if (id.value() >= count) {
    std::ostringstream os;
    os << "HostArenas: " << id << " is out of range (the arena has " << count << " " << arena
       << ")";
    throw std::out_of_range(os.str());
  }
  return std::size_t{id.value()} * stride;
}
}  // namespace

std::span<std::byte> HostArenas::gpu_page(GpuPageId id) {
  return {gpu_kv_.data() + checked_offset(id, gpu_pages_, page_bytes_, "GPU KV pages"),
          page_bytes_};
}
std::span<std::byte> HostArenas::host_page(HostPageId id) {
  return {host_kv_.data() + checked_offset(id, host_pages_, page_bytes_, "host KV pages"),
          page_bytes_};
}
std::span<std::byte> HostArenas::gpu_snapshot(GpuSlotId id) {
  return {gpu_snap_.data() + checked_offset(id, gpu_slots_, snapshot_bytes_, "GPU snapshot slots"),
          snapshot_bytes_};
}
std::span<std::byte> HostArenas::host_snapshot(HostSlotId id) {
  return {
      host_snap_.data() + checked_offset(id, host_slots_, snapshot_bytes_, "host snapshot slots"),
      snapshot_bytes_};
}

HostTransferEngine::HostTransferEngine(HostArenas& memory, std::size_t slice_pages, Mode mode)
    : memory_(memory), slice_pages_(std::max<std::size_t>(1, slice_pages)), mode_(mode) {
  const std::size_t staging = slice_pages_ * memory_.page_bytes();
  staging_d2h_.resize(staging);
  staging_h2d_.resize(staging);
  stats_.staging_bytes = 2 * staging;
  if (mode_ == Mode::kThreaded) worker_ = std::thread([this] { worker_loop(); });
}

HostTransferEngine::~HostTransferEngine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

EngineCapacity HostTransferEngine::capacity() const {
  EngineCapacity c;
  c.gpu_pages = memory_.gpu_pages();
  c.host_pages = memory_.host_pages();
  c.gpu_snapshot_slots = memory_.gpu_slots();
  c.host_snapshot_slots = memory_.host_slots();
  c.page_bytes = memory_.page_bytes();
  c.snapshot_bytes = memory_.snapshot_bytes();
  return c;
}

Status HostTransferEngine::validate(const TransferBatch& b) const {
  std::ostringstream err;
  if (const char* why = batch_shape_error(b)) err << why << "; ";
  for (const auto& p : b.pages) {
    if (p.gpu.value() >= memory_.gpu_pages()) err << p.gpu << " out of range; ";
    if (p.host.value() >= memory_.host_pages()) err << p.host << " out of range; ";
  }
  for (const auto& s : b.snapshots) {
    if (s.gpu.value() >= memory_.gpu_slots()) err << s.gpu << " out of range; ";
    if (s.host.value() >= memory_.host_slots()) err << s.host << " out of range; ";
  }
  for (const auto& p : b.pieces) {
    if (p.gpu.value() >= memory_.gpu_slots()) err << p.gpu << " out of range; ";
    if (p.host.value() >= memory_.host_pages()) err << p.host << " out of range; ";
    if (p.offset >= memory_.snapshot_bytes() || p.offset % memory_.page_bytes() != 0)
      err << "snapshot piece offset " << p.offset
          << " is not a page multiple inside the snapshot; ";
  }
  for (const auto& p : b.slot_pieces) {
    if (p.slot.value() >= memory_.gpu_slots()) err << p.slot << " out of range; ";
    if (p.page.value() >= memory_.gpu_pages()) err << p.page << " out of range; ";
    if (p.offset >= memory_.snapshot_bytes() || memory_.page_bytes() == 0 ||
        p.offset % memory_.page_bytes() != 0)
      err << "slot piece offset " << p.offset << " is not a page multiple inside the snapshot; ";
  }
  if (err.tellp() > 0) return invalid_argument("transfer batch rejected: " + err.str());
  return Status::ok();
}

// mu_ held: an `after` id this engine never issued is bad input (a released one is done).
Status HostTransferEngine::validate_after_locked(const TransferBatch& b) const {
  for (TicketId dep : b.after) {
    if (!dep.valid() || dep.value() >= next_id_) {
      std::ostringstream err;
      err << "transfer batch rejected: `after` names " << dep
          << ", a ticket this engine never issued";
      return invalid_argument(err.str());
    }
  }
  return Status::ok();
}

Result<Ticket> HostTransferEngine::submit(TransferBatch batch) {
  if (Status s = validate(batch); !s) return s;
  TicketId id;
  {
    std::unique_lock lock(mu_);
    if (Status s = validate_after_locked(batch); !s) return s;
    id = TicketId(next_id_++);
    Job job{std::move(batch)};
    const std::uint64_t n = submissions_++;
    auto it = std::find(fail_submissions_.begin(), fail_submissions_.end(), n);
    if (it != fail_submissions_.end()) {
      job.fail = true;
      fail_submissions_.erase(it);
    }
    auto held = std::find(delay_submissions_.begin(), delay_submissions_.end(), n);
    if (held != delay_submissions_.end()) {
      job.delayed = true;
      delay_submissions_.erase(held);
    }
    const bool now = mode_ == Mode::kManual && device_at_submit_ &&
                     job.batch.direction == Direction::kDeviceToDevice &&
                     deps_state_locked(job) != TransferState::kPending;
    jobs_.emplace(id, std::move(job));
    queue_.push_back(id);
    ++stats_.batches;
    if (now) run_job(lock, id);
  }
  cv_.notify_all();
  return Ticket(this, id);
}

TransferState HostTransferEngine::poll(TicketId id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? TransferState::kFailed : it->second.state;
}

TransferState HostTransferEngine::wait(TicketId id) {
  std::unique_lock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return TransferState::kFailed;
  // Manual mode runs the copy here unless another caller is already running it; then (and
  // in threaded mode) wait for whoever runs it.
  if (mode_ == Mode::kManual && it->second.state == TransferState::kPending &&
      !it->second.running) {
    run_with_deps(lock, id);
  }
  cv_.wait(lock, [&] { return jobs_.at(id).state != TransferState::kPending; });
  return jobs_.at(id).state;
}

void HostTransferEngine::release(TicketId id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.state == TransferState::kPending) return;
  if (it->second.state == TransferState::kFailed) {
    // Forgotten, but the batches that run after it still fail: a caller that reaped the
    // failure before they ran must not see them copy the garbage it left.
    for (TicketId q : queue_) {
      Job& job = jobs_.at(q);
      if (std::find(job.batch.after.begin(), job.batch.after.end(), id) != job.batch.after.end())
        job.after_failed = true;
    }
  }
  jobs_.erase(it);
}

void HostTransferEngine::fail_ticket(TicketId id) {
  std::lock_guard lock(mu_);
  if (auto it = jobs_.find(id); it != jobs_.end()) it->second.fail = true;
}

void HostTransferEngine::fail_nth_submission(std::uint64_t n) {
  std::lock_guard lock(mu_);
  fail_submissions_.push_back(submissions_ + n);
}

void HostTransferEngine::delay_nth_submission(std::uint64_t n) {
  std::lock_guard lock(mu_);
  delay_submissions_.push_back(submissions_ + n);
}

void HostTransferEngine::delay_ticket(TicketId id) {
  std::lock_guard lock(mu_);
  if (auto it = jobs_.find(id); it != jobs_.end()) it->second.delayed = true;
}

void HostTransferEngine::resume(TicketId id) {
  {
    std::lock_guard lock(mu_);
    if (auto it = jobs_.find(id); it != jobs_.end()) it->second.delayed = false;
  }
  cv_.notify_all();
}

std::vector<TicketId> HostTransferEngine::pending() const {
  std::lock_guard lock(mu_);
  std::vector<TicketId> out;
  for (TicketId id : queue_) out.push_back(id);
  return out;
}

bool HostTransferEngine::complete(TicketId id) {
  std::unique_lock lock(mu_);
  if (mode_ != Mode::kManual) return false;
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.state != TransferState::kPending || it->second.running)
    return false;
  run_with_deps(lock, id);
  return true;
}

// mu_ held. kManual: the pending tickets `id` runs after run first (theirs first, recursively;
// submission order makes the graph acyclic: a batch can only name earlier tickets), then it.
void HostTransferEngine::run_with_deps(std::unique_lock<std::mutex>& lock, TicketId id) {
  // Copy: running a dependency releases mu_, and jobs_ may rehash meanwhile.
  const std::vector<TicketId> deps = jobs_.at(id).batch.after;
  for (TicketId dep : deps) {
    auto it = jobs_.find(dep);
    if (it == jobs_.end() || it->second.state != TransferState::kPending) continue;
    if (it->second.running) {
      cv_.wait(lock, [&] { return jobs_.at(dep).state != TransferState::kPending; });
    } else {
      run_with_deps(lock, dep);
    }
  }
  Job& job = jobs_.at(id);
  if (job.state == TransferState::kPending && !job.running) run_job(lock, id);
}

// mu_ held: kFailed when a ticket `job` runs after failed, kPending while one is still
// pending, kDone when all landed (a released one landed: the caller reaped it).
TransferState HostTransferEngine::deps_state_locked(const Job& job) const {
  if (job.after_failed) return TransferState::kFailed;
  TransferState out = TransferState::kDone;
  for (TicketId dep : job.batch.after) {
    auto it = jobs_.find(dep);
    if (it == jobs_.end()) continue;
    if (it->second.state == TransferState::kFailed) return TransferState::kFailed;
    if (it->second.state == TransferState::kPending) out = TransferState::kPending;
  }
  return out;
}

void HostTransferEngine::set_device_copies_at_submit(bool on) {
  std::lock_guard lock(mu_);
  device_at_submit_ = on;
}

HostEngineStats HostTransferEngine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

// Called with mu_ held; releases it while bytes move.
void HostTransferEngine::run_job(std::unique_lock<std::mutex>& lock, TicketId id) {
  Job& job = jobs_.at(id);
  job.running = true;
  queue_.erase(std::find(queue_.begin(), queue_.end(), id));
  // Every ticket it runs after has finished (the worker and run_with_deps see to it); one that
  // failed fails this one: its destinations are poisoned, never filled from garbage.
  const bool after_failed = deps_state_locked(job) == TransferState::kFailed;
  const bool fail = job.fail || after_failed;
  const TransferBatch* batch = &job.batch;  // stable: unordered_map nodes do not move
  lock.unlock();
  // A batch after a failed one reads nothing: its sources may be that one's garbage, already
  // freed and reused by the caller. It only poisons its destinations.
  const bool ok = run_copy(*batch, fail, after_failed);
  lock.lock();
  Job& done = jobs_.at(id);
  done.running = false;
  done.state = ok ? TransferState::kDone : TransferState::kFailed;
  std::size_t bytes = done.batch.pages.size() * memory_.page_bytes() +
                      done.batch.snapshots.size() * memory_.snapshot_bytes();
  for (const auto& p : done.batch.pieces)
    bytes += piece_bytes(p, memory_.page_bytes(), memory_.snapshot_bytes());
  for (const auto& p : done.batch.slot_pieces)
    bytes += piece_bytes(p, memory_.page_bytes(), memory_.snapshot_bytes());
  if (!ok) ++stats_.failed;
  const Direction dir = done.batch.direction;
  (dir == Direction::kDeviceToHost   ? stats_.bytes_d2h
   : dir == Direction::kHostToDevice ? stats_.bytes_h2d
                                     : stats_.bytes_d2d) += ok ? bytes : 0;
  cv_.notify_all();
}

void HostTransferEngine::worker_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    TicketId next;
    cv_.wait(lock, [&] {
      if (stop_) return true;
      for (TicketId id : queue_) {
        const Job& job = jobs_.at(id);
        if (!job.delayed && deps_state_locked(job) != TransferState::kPending) {
          next = id;
          return true;
        }
      }
      return false;
    });
    if (stop_) return;
    run_job(lock, next);
  }
}

void HostTransferEngine::copy_sliced(std::span<const std::byte> src, std::span<std::byte> dst,
                                     std::vector<std::byte>& staging) {
  for (std::size_t off = 0; off < src.size(); off += staging.size()) {
    const std::size_t n = std::min(staging.size(), src.size() - off);
    std::memcpy(staging.data(), src.data() + off, n);
    std::memcpy(dst.data() + off, staging.data(), n);
  }
}

// Device to device: slot pieces in slices of slice_pages_ pieces, each copied directly
// between the GPU slot arena and the GPU page arena (no host staging, as on a GPU). A failing
// copy stops after its first slice and poisons every destination of the batch.
bool HostTransferEngine::run_device_copy(const TransferBatch& b, bool fail, bool read_nothing) {
  const std::size_t pb = memory_.page_bytes();
  auto slot_span = [&](const SlotPieceCopy& p) {
    return memory_.gpu_snapshot(p.slot).subspan(p.offset,
                                                piece_bytes(p, pb, memory_.snapshot_bytes()));
  };
  auto page_span = [&](const SlotPieceCopy& p) {
    return memory_.gpu_page(p.page).first(piece_bytes(p, pb, memory_.snapshot_bytes()));
  };
  std::uint64_t slices = 0;
  for (std::size_t first = 0; first < b.slot_pieces.size() && !read_nothing;
       first += slice_pages_) {
    const std::size_t last = std::min(b.slot_pieces.size(), first + slice_pages_);
    for (std::size_t i = first; i < last; ++i) {
      const SlotPieceCopy& p = b.slot_pieces[i];
      const auto src = p.to_slot ? page_span(p) : slot_span(p);
      const auto dst = p.to_slot ? slot_span(p) : page_span(p);
      std::memcpy(dst.data(), src.data(), src.size());
    }
    ++slices;
    if (fail) break;
  }
  if (fail) {
    for (const SlotPieceCopy& p : b.slot_pieces) {
      const auto dst = p.to_slot ? slot_span(p) : page_span(p);
      std::fill(dst.begin(), dst.end(), kPoison);
    }
  }
  std::lock_guard lock(mu_);
  stats_.slices += slices;
  return !fail;
}

bool HostTransferEngine::run_copy(const TransferBatch& b, bool fail, bool read_nothing) {
  std::lock_guard copy_lock(copy_mu_);
  if (b.direction == Direction::kDeviceToDevice) return run_device_copy(b, fail, read_nothing);
  const bool d2h = b.direction == Direction::kDeviceToHost;
  auto& staging = d2h ? staging_d2h_ : staging_h2d_;
  const std::size_t pb = memory_.page_bytes();
  std::uint64_t slices = 0;
  auto page_src = [&](const PageCopy& p) {
    return d2h ? memory_.gpu_page(p.gpu) : memory_.host_page(p.host);
  };
  auto page_dst = [&](const PageCopy& p) {
    return d2h ? memory_.host_page(p.host) : memory_.gpu_page(p.gpu);
  };
  // Pages: slices of at most slice_pages_ pages, each staged whole.
  for (std::size_t first = 0; first < b.pages.size() && !read_nothing; first += slice_pages_) {
    const std::size_t last = std::min(b.pages.size(), first + slice_pages_);
    for (std::size_t i = first; i < last; ++i) {
      std::memcpy(staging.data() + (i - first) * pb, page_src(b.pages[i]).data(), pb);
    }
    for (std::size_t i = first; i < last; ++i) {
      std::memcpy(page_dst(b.pages[i]).data(), staging.data() + (i - first) * pb, pb);
    }
    ++slices;
    if (fail) break;
  }
  for (const auto& s : b.snapshots) {
    if (fail) break;
    auto src = d2h ? memory_.gpu_snapshot(s.gpu) : memory_.host_snapshot(s.host);
    auto dst = d2h ? memory_.host_snapshot(s.host) : memory_.gpu_snapshot(s.gpu);
    copy_sliced(src, dst, staging);
    slices += (src.size() + staging.size() - 1) / std::max<std::size_t>(1, staging.size());
  }
  // Snapshot pieces: one host page's share each, staged like pages, slice_pages per slice.
  auto piece_span = [&](const SnapshotPieceCopy& p, bool gpu_side) {
    const std::size_t n = piece_bytes(p, pb, memory_.snapshot_bytes());
    return gpu_side ? memory_.gpu_snapshot(p.gpu).subspan(p.offset, n)
                    : memory_.host_page(p.host).first(n);
  };
  for (std::size_t first = 0; first < b.pieces.size() && !fail; first += slice_pages_) {
    const std::size_t last = std::min(b.pieces.size(), first + slice_pages_);
    for (std::size_t i = first; i < last; ++i) {
      auto src = piece_span(b.pieces[i], d2h);
      std::memcpy(staging.data() + (i - first) * pb, src.data(), src.size());
    }
    for (std::size_t i = first; i < last; ++i) {
      auto dst = piece_span(b.pieces[i], !d2h);
      std::memcpy(dst.data(), staging.data() + (i - first) * pb, dst.size());
    }
    ++slices;
  }
  if (fail) {
    for (const auto& p : b.pieces) {
      auto dst = piece_span(p, !d2h);
      std::fill(dst.begin(), dst.end(), kPoison);
    }
    // A failed copy leaves garbage behind: poison every destination so that any use of
    // these bytes is caught by the byte checks.
    for (const auto& p : b.pages) {
      auto dst = page_dst(p);
      std::fill(dst.begin(), dst.end(), kPoison);
    }
    for (const auto& s : b.snapshots) {
      auto dst = d2h ? memory_.host_snapshot(s.host) : memory_.gpu_snapshot(s.gpu);
      std::fill(dst.begin(), dst.end(), kPoison);
    }
  }
  std::lock_guard lock(mu_);
  stats_.slices += slices;
  return !fail;
}

}  // namespace radixtier
