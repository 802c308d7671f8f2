// The thread-pool engine: `io_threads` workers take slices from one queue and run blocking
// pread/pwrite. Tickets, the queue and the stats are guarded by mu_.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "radixtier/disk/io_engine.hpp"
#include "slice.hpp"

namespace radixtier::disk {

/// Runs one slice to its end: EINTR retried, short transfers continued; a read that meets
/// the end of the file is data loss (the file was cut).
Status run_slice_blocking(const IoSlice& s) {
  std::size_t done = 0;
  while (done < s.length) {
    const off_t off = static_cast<off_t>(s.offset + done);
    const ssize_t r = s.kind == IoOp::Kind::kRead
                          ? ::pread(s.fd, s.buffer + done, s.length - done, off)
                          : ::pwrite(s.fd, s.buffer + done, s.length - done, off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return io_error(errno, s.kind == IoOp::Kind::kRead ? "pread" : "pwrite");
    }
    if (r == 0) {
      if (s.kind == IoOp::Kind::kRead) {
        return {ErrorCode::kDataLoss, "short read at offset " + std::to_string(off) +
                                          ": the file ends early (truncated)"};
      }
      return io_error(EIO, "pwrite wrote nothing");
    }
    done += static_cast<std::size_t>(r);
  }
  return Status::ok();
}

namespace {

class ThreadPoolIoEngine final : public DiskIoEngine {
 public:
  explicit ThreadPoolIoEngine(const IoEngineConfig& config) : config_(config) {
    for (std::uint32_t i = 0; i < config_.io_threads; ++i) {
      workers_.emplace_back([this] { work(); });
    }
  }

  ~ThreadPoolIoEngine() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  Result<IoTicket> submit(std::vector<IoOp> ops) override {
    if (Status s = validate_ops(ops); !s) return s;
    std::vector<IoSlice> slices = slice_ops(ops, config_.slice_bytes);
    std::uint64_t id = 0;
    {
      std::lock_guard lock(mu_);
      id = next_id_++;
      tickets_[id] = Job{slices.size(), Status::ok()};
      for (const IoSlice& s : slices) queue_.push_back({id, s});
      ++stats_.batches;
      stats_.slices += slices.size();
    }
    work_cv_.notify_all();
    return IoTicket(this, id);
  }

  IoState poll(std::uint64_t ticket) override {
    std::lock_guard lock(mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return IoState::kFailed;
    return state_locked(it->second);
  }

  Status wait(std::uint64_t ticket) override {
    std::unique_lock lock(mu_);
    auto it = tickets_.find(ticket);
    if (it == tickets_.end()) return not_found("unknown I/O ticket " + std::to_string(ticket));
    done_cv_.wait(lock, [&] { return it->second.remaining == 0; });
    return it->second.error;
  }

  void release(std::uint64_t ticket) override {
    std::lock_guard lock(mu_);
    auto it = tickets_.find(ticket);
    if (it != tickets_.end() && it->second.remaining == 0) tickets_.erase(it);
  }

  IoEngineKind kind() const override { return IoEngineKind::kThreadPool; }
  const char* name() const override { return "thread_pool"; }
  IoEngineStats stats() const override {
    std::lock_guard lock(mu_);
    return stats_;
  }

 private:
  struct Job {
    std::size_t remaining = 0;  ///< slices not finished
    Status error;               ///< the first failure
  };
  struct Work {
    std::uint64_t ticket;
    IoSlice slice;
  };

  static IoState state_locked(const Job& j) {
    if (j.remaining > 0) return IoState::kPending;
    return j.error ? IoState::kDone : IoState::kFailed;
  }

  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      Work w = queue_.front();
      queue_.pop_front();
      lock.unlock();
      Status s = run_slice_blocking(w.slice);
      lock.lock();
      Job& job = tickets_.at(w.ticket);
      if (s) {
        (w.slice.kind == IoOp::Kind::kRead ? stats_.bytes_read : stats_.bytes_written) +=
            w.slice.length;
      } else if (job.error) {
        job.error = std::move(s);
      }
      if (--job.remaining == 0) {
        if (!job.error) ++stats_.failed_batches;
        done_cv_.notify_all();
      }
    }
  }

  const IoEngineConfig config_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;                 ///< a slice was queued, or stop_
  std::condition_variable done_cv_;                 ///< a ticket finished
  std::deque<Work> queue_;                          // guarded by mu_
  std::unordered_map<std::uint64_t, Job> tickets_;  // guarded by mu_
  std::uint64_t next_id_ = 1;                       // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  IoEngineStats stats_;                             // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<DiskIoEngine>> make_thread_pool_engine(const IoEngineConfig& config) {
  if (Status s = config.validate(); !s) return s;
  return std::unique_ptr<DiskIoEngine>(std::make_unique<ThreadPoolIoEngine>(config));
}

}  // namespace radixtier::disk
