// The disk I/O engine: asynchronous, sliced reads and writes of byte ranges of files.
//
// submit() takes a batch of operations (read or write `length` bytes at `offset` of `fd`,
// from or into caller memory) and hands back a move-only IoTicket at once. The engine cuts
// every operation into slices of at most `slice_bytes` and runs them asynchronously; short
// reads and writes are continued, EINTR retried.
//
// Ticket states:   Pending --(every slice done)--> Done
//                  Pending --(any slice failed)--> Failed  (destination bytes are garbage;
//                                                           wait() says why)
// Errors: ENOSPC / EDQUOT / EFBIG -> kOutOfMemory ("disk full"); a read that meets the end of
// the file -> kDataLoss ("short read": the file was truncated); any other errno ->
// kTransferFailed with the errno's text.
//
// Contract (the store keeps it): the memory and fds of a pending batch stay valid and
// untouched until the ticket is done. Engines are used by one owner thread (the store's);
// the thread pool's workers and io_uring's kernel side are what runs concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "radixtier/disk/disk_config.hpp"
#include "radixtier/status.hpp"

namespace radixtier::disk {

struct IoOp {
  enum class Kind : std::uint8_t { kRead, kWrite };
  Kind kind = Kind::kRead;
  int fd = -1;
  std::uint64_t offset = 0;
  void* buffer = nullptr;  ///< read: destination; write: source (not modified)
  std::size_t length = 0;

  static IoOp read(int fd, std::uint64_t offset, void* dst, std::size_t n) {
    return {Kind::kRead, fd, offset, dst, n};
  }
  static IoOp write(int fd, std::uint64_t offset, const void* src, std::size_t n) {
    return {Kind::kWrite, fd, offset, const_cast<void*>(src), n};
  }
};

enum class IoState { kPending, kDone, kFailed };

class DiskIoEngine;

/// Move-only handle of one submitted batch; destroying a pending ticket waits for it.
class IoTicket {
 public:
  IoTicket() = default;
  IoTicket(DiskIoEngine* engine, std::uint64_t id) : engine_(engine), id_(id) {}
  IoTicket(IoTicket&& other) noexcept { *this = std::move(other); }
  IoTicket& operator=(IoTicket&& other) noexcept;
  IoTicket(const IoTicket&) = delete;
  IoTicket& operator=(const IoTicket&) = delete;
  ~IoTicket() { reset(); }

  bool valid() const { return engine_ != nullptr; }
  std::uint64_t id() const { return id_; }
  IoState poll() const;
  /// Blocks until the batch is done; OK or the first slice's error.
  Status wait() const;
  /// Waits if pending, then lets the engine forget the ticket.
  void reset();

 private:
  DiskIoEngine* engine_ = nullptr;
  std::uint64_t id_ = 0;
};

struct IoEngineStats {
  std::uint64_t batches = 0;
  std::uint64_t slices = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t failed_batches = 0;
};

class DiskIoEngine {
 public:
  virtual ~DiskIoEngine() = default;
  /// An empty batch, a negative fd or a null buffer is rejected whole (nothing runs).
  virtual Result<IoTicket> submit(std::vector<IoOp> ops) = 0;
  virtual IoState poll(std::uint64_t ticket) = 0;
  virtual Status wait(std::uint64_t ticket) = 0;
  /// Forgets a finished ticket (IoTicket::reset calls it after wait).
  virtual void release(std::uint64_t ticket) = 0;
  virtual IoEngineKind kind() const = 0;
  virtual const char* name() const = 0;
  virtual IoEngineStats stats() const = 0;
};

/// The engine `config.kind` asks for. kAuto tries io_uring and falls back to the thread pool
/// when the kernel (or a container's seccomp profile) refuses io_uring; `fallback_reason`,
/// when given, receives why ("" when io_uring was used or not asked for).
Result<std::unique_ptr<DiskIoEngine>> make_io_engine(const IoEngineConfig& config,
                                                     std::string* fallback_reason = nullptr);
Result<std::unique_ptr<DiskIoEngine>> make_uring_engine(const IoEngineConfig& config);
Result<std::unique_ptr<DiskIoEngine>> make_thread_pool_engine(const IoEngineConfig& config);

/// The Status of a failed read or write (errno mapping above); `what` names the operation.
Status io_error(int err, const char* what);

}  // namespace radixtier::disk
