// File helpers of the disk store over its FileSystem: an owning fd, whole reads and writes,
// durable creation and renames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "radixtier/disk/file_system.hpp"
#include "radixtier/status.hpp"

namespace radixtier::disk {

class UniqueFd {
 public:
  UniqueFd() = default;
  UniqueFd(FileSystem& fs, int fd) : fs_(&fs), fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fs_(o.fs_), fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  FileSystem* fs_ = nullptr;
  int fd_ = -1;
};

/// open(2) with O_CLOEXEC; the Status names the path and errno.
Result<UniqueFd> open_file(FileSystem& fs, const std::string& path, int flags, int mode = 0644);
/// pwrite until all n bytes are written (EINTR retried).
Status pwrite_all(FileSystem& fs, int fd, const void* src, std::size_t n, std::uint64_t offset,
                  const char* what);
/// pread until n bytes or the end of the file; returns the bytes read.
Result<std::size_t> pread_upto(FileSystem& fs, int fd, void* dst, std::size_t n,
                               std::uint64_t offset, const char* what);
Result<std::uint64_t> file_size(FileSystem& fs, int fd, const char* what);
Status fdatasync_fd(FileSystem& fs, int fd, const char* what);
Status truncate_fd(FileSystem& fs, int fd, std::uint64_t size, const char* what);
/// fsync of a directory: its entries (files created, renamed, removed in it) are durable.
Status fsync_dir(FileSystem& fs, const std::string& dir);
/// The directory `path` is in ("." when it names none).
std::string parent_dir(const std::string& path);
/// Writes `bytes` to `path` durably and atomically: path.tmp, fsync, rename, fsync dir.
Status write_file_atomic(FileSystem& fs, const std::string& dir, const std::string& name,
                         const std::vector<std::byte>& bytes);
bool file_exists(FileSystem& fs, const std::string& path);
/// Removes `path` if it exists.
Status remove_file(FileSystem& fs, const std::string& path);

}  // namespace radixtier::disk
