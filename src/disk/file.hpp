// POSIX file helpers of the disk store: an owning fd, whole reads and writes, durable renames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::disk {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

/// open(2) with O_CLOEXEC; the Status names the path and errno.
Result<UniqueFd> open_file(const std::string& path, int flags, int mode = 0644);
/// pwrite until all n bytes are written (EINTR retried).
Status pwrite_all(int fd, const void* src, std::size_t n, std::uint64_t offset, const char* what);
/// pread until n bytes or the end of the file; returns the bytes read.
Result<std::size_t> pread_upto(int fd, void* dst, std::size_t n, std::uint64_t offset,
                               const char* what);
Result<std::uint64_t> file_size(int fd, const char* what);
Status fdatasync_fd(int fd, const char* what);
Status fsync_dir(const std::string& dir);
/// Writes `bytes` to `path` durably and atomically: path.tmp, fsync, rename, fsync dir.
Status write_file_atomic(const std::string& dir, const std::string& name,
                         const std::vector<std::byte>& bytes);
bool file_exists(const std::string& path);
/// Removes `path` if it exists.
Status remove_file(const std::string& path);

}  // namespace radixtier::disk
