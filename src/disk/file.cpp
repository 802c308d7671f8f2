#include "file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "radixtier/disk/io_engine.hpp"

namespace radixtier::disk {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<UniqueFd> open_file(const std::string& path, int flags, int mode) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) {
    const int err = errno;
    return Status(ErrorCode::kTransferFailed, "cannot open " + path + ": " + std::strerror(err));
  }
  return UniqueFd(fd);
}

Status pwrite_all(int fd, const void* src, std::size_t n, std::uint64_t offset, const char* what) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error(errno, what);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
  return Status::ok();
}

Result<std::size_t> pread_upto(int fd, void* dst, std::size_t n, std::uint64_t offset,
                               const char* what) {
  auto* p = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return io_error(errno, what);
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return done;
}

Result<std::uint64_t> file_size(int fd, const char* what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error(errno, what);
  return static_cast<std::uint64_t>(st.st_size);
}

Status fdatasync_fd(int fd, const char* what) {
  while (::fdatasync(fd) != 0) {
    if (errno == EINTR) continue;
    return io_error(errno, what);
  }
  return Status::ok();
}

Status fsync_dir(const std::string& dir) {
  auto fd = open_file(dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return fd.status();
  while (::fsync(fd->get()) != 0) {
    if (errno == EINTR) continue;
    return io_error(errno, "fsync of the store directory");
  }
  return Status::ok();
}

Status write_file_atomic(const std::string& dir, const std::string& name,
                         const std::vector<std::byte>& bytes) {
  const std::string tmp = dir + "/" + name + ".tmp";
  auto fd = open_file(tmp, O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd) return fd.status();
  if (Status s = pwrite_all(fd->get(), bytes.data(), bytes.size(), 0, name.c_str()); !s) return s;
  if (Status s = fdatasync_fd(fd->get(), name.c_str()); !s) return s;
  fd->reset();
  if (::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) {
    return io_error(errno, "rename into place");
  }
  return fsync_dir(dir);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

Status remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return io_error(errno, ("unlink " + path).c_str());
  }
  return Status::ok();
}

}  // namespace radixtier::disk
