// The io_uring engine: one ring, at most queue_depth slices in flight, the rest in a
// backlog. Used by one owner thread: submit() queues and submits, poll() reaps what has
// completed without blocking, wait() blocks on completions. Short transfers are continued.
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "radixtier/disk/io_engine.hpp"
#include "slice.hpp"

namespace radixtier::disk {

namespace {

class UringIoEngine final : public DiskIoEngine {
 public:
  UringIoEngine(const IoEngineConfig& config, io_uring ring)
      : config_(config), ring_(ring), inflight_(config.queue_depth) {
    for (std::uint32_t i = config.queue_depth; i > 0; --i) free_.push_back(i - 1);
  }

  ~UringIoEngine() override {
    for (auto& [id, job] : tickets_) {
      (void)job;
      (void)wait(id);
    }
    io_uring_queue_exit(&ring_);
  }

  Result<IoTicket> submit(std::vector<IoOp> ops) override {
    if (Status s = validate_ops(ops); !s) return s;
    std::vector<IoSlice> slices = slice_ops(ops, config_.slice_bytes);
    const std::uint64_t id = next_id_++;
    tickets_[id] = Job{slices.size(), Status::ok()};
    for (const IoSlice& s : slices) backlog_.push_back({id, s});
    ++stats_.batches;
    stats_.slices += slices.size();
    pump();
    return IoTicket(this, id);
  }

  IoState poll(std::uint64_t ticket) override {
    reap(false);
    pump();
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return IoState::kFailed;
    return state(it->second);
  }

  Status wait(std::uint64_t ticket) override {
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return not_found("unknown I/O ticket " + std::to_string(ticket));
    while (it->second.remaining > 0) {
      pump();
      reap(true);
    }
    return it->second.error;
  }

  void release(std::uint64_t ticket) override {
    auto it = tickets_.find(ticket);
    if (it != tickets_.end() && it->second.remaining == 0) tickets_.erase(it);
  }

  IoEngineKind kind() const override { return IoEngineKind::kIoUring; }
  const char* name() const override { return "io_uring"; }
  IoEngineStats stats() const override { return stats_; }

 private:
  struct Job {
    std::size_t remaining = 0;
    Status error;
  };
  struct Work {
    std::uint64_t ticket = 0;
    IoSlice slice;  ///< what is left of it
  };

  static IoState state(const Job& j) {
    if (j.remaining > 0) return IoState::kPending;
    return j.error ? IoState::kDone : IoState::kFailed;
  }

  void finish(const Work& w, Status s) {
    Job& job = tickets_.at(w.ticket);
    if (!s && job.error) job.error = std::move(s);
    if (--job.remaining == 0 && !job.error) ++stats_.failed_batches;
  }

  /// Moves backlog slices into free ring entries and submits them.
  void pump() {
    unsigned queued = 0;
    while (!backlog_.empty() && !free_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      const std::uint32_t slot = free_.back();
      free_.pop_back();
      inflight_[slot] = backlog_.front();
      backlog_.pop_front();
      const IoSlice& s = inflight_[slot].slice;
      if (s.kind == IoOp::Kind::kRead) {
        io_uring_prep_read(sqe, s.fd, s.buffer, static_cast<unsigned>(s.length), s.offset);
      } else {
        io_uring_prep_write(sqe, s.fd, s.buffer, static_cast<unsigned>(s.length), s.offset);
      }
      io_uring_sqe_set_data64(sqe, slot);
      ++queued;
    }
    if (queued == 0) return;
    int r = 0;
    do {
      r = io_uring_submit(&ring_);
    } while (r == -EINTR);
    // On failure the entries stay in the submission ring; io_uring_wait_cqe submits them
    // again. The error is kept for fail_backlog's message.
    if (r < 0) fatal_ = io_error(-r, "io_uring_submit");
  }

  void complete(io_uring_cqe* cqe) {
    const auto slot = static_cast<std::uint32_t>(io_uring_cqe_get_data64(cqe));
    Work w = inflight_[slot];
    inflight_[slot] = Work{};
    free_.push_back(slot);
    const int res = cqe->res;
    const bool read = w.slice.kind == IoOp::Kind::kRead;
    if (res == -EINTR || res == -EAGAIN) {
      backlog_.push_front(w);
      return;
    }
    if (res < 0) {
      finish(w, io_error(-res, read ? "io_uring read" : "io_uring write"));
      return;
    }
    const auto n = static_cast<std::size_t>(res);
    (read ? stats_.bytes_read : stats_.bytes_written) += n;
    if (n == 0) {
      finish(w, read ? Status(ErrorCode::kDataLoss, "short read at offset " +
                                                        std::to_string(w.slice.offset) +
                                                        ": the file ends early (truncated)")
                     : io_error(EIO, "io_uring write wrote nothing"));
      return;
    }
    if (n < w.slice.length) {  // short: continue with the rest
      w.slice.offset += n;
      w.slice.buffer += n;
      w.slice.length -= n;
      backlog_.push_front(w);
      return;
    }
    finish(w, Status::ok());
  }

  /// Handles completions: all that are ready; with `block`, at least one.
  void reap(bool block) {
    if (block && free_.size() == inflight_.size()) {
      // Nothing in flight: the backlog could not be submitted (fatal_), fail it.
      fail_backlog();
      return;
    }
    io_uring_cqe* cqe = nullptr;
    if (block) {
      int r = 0;
      do {
        r = io_uring_wait_cqe(&ring_, &cqe);
      } while (r == -EINTR);
      if (r < 0) {
        fatal_ = io_error(-r, "io_uring_wait_cqe");
        return;
      }
      complete(cqe);
      io_uring_cqe_seen(&ring_, cqe);
    }
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      complete(cqe);
      io_uring_cqe_seen(&ring_, cqe);
    }
  }

  void fail_backlog() {
    Status why =
        fatal_ ? Status(ErrorCode::kTransferFailed, "io_uring: nothing in flight") : fatal_;
    while (!backlog_.empty()) {
      Work w = backlog_.front();
      backlog_.pop_front();
      finish(w, why);
    }
  }

  const IoEngineConfig config_;
  io_uring ring_;
  std::vector<Work> inflight_;       ///< by ring slot (user_data)
  std::vector<std::uint32_t> free_;  ///< ring slots not in flight
  std::deque<Work> backlog_;
  std::unordered_map<std::uint64_t, Job> tickets_;
  std::uint64_t next_id_ = 1;
  Status fatal_;
  IoEngineStats stats_;
};

}  // namespace

Result<std::unique_ptr<DiskIoEngine>> make_uring_engine(const IoEngineConfig& config) {
  if (Status s = config.validate(); !s) return s;
  io_uring ring{};
  const int r = io_uring_queue_init(config.queue_depth, &ring, 0);
  if (r < 0) {
    return Status(
        ErrorCode::kFailedPrecondition,
        std::string("io_uring unavailable (io_uring_queue_init: ") + std::strerror(-r) + ")");
  }
  // Setup can succeed where submission is filtered (seccomp): prove a NOP round trip.
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  io_uring_prep_nop(sqe);
  io_uring_cqe* cqe = nullptr;
  int s = io_uring_submit_and_wait(&ring, 1);
  if (s >= 0) s = io_uring_wait_cqe(&ring, &cqe);
  if (s < 0 || cqe == nullptr || cqe->res < 0) {
    const int err = s < 0 ? -s : (cqe ? -cqe->res : EIO);
    io_uring_queue_exit(&ring);
    return Status(ErrorCode::kFailedPrecondition,
                  std::string("io_uring unavailable (NOP round trip: ") + std::strerror(err) + ")");
  }
  io_uring_cqe_seen(&ring, cqe);
  return std::unique_ptr<DiskIoEngine>(std::make_unique<UringIoEngine>(config, ring));
}

}  // namespace radixtier::disk
