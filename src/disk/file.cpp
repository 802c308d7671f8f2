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
    fs_ = o.fs_;
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void UniqueFd::reset() {
  if (fd_ >= 0) fs_->close(fd_);
  fd_ = -1;
}

Result<UniqueFd> open_file(FileSystem& fs, const std::string& path, int flags, int mode) {
  const int fd = fs.open(path.c_str(), flags | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) {
    const int err = errno;
    return Status(ErrorCode::kTransferFailed, "cannot open " + path + ": " + std::strerror(err));
  }
  return UniqueFd(fs, fd);
}

Status pwrite_all(FileSystem& fs, int fd, const void* src, std::size_t n, std::uint64_t offset,
                  const char* what) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    const ssize_t w = fs.pwrite(fd, p, n, static_cast<off_t>(offset));
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

Result<std::size_t> pread_upto(FileSystem& fs, int fd, void* dst, std::size_t n,
                               std::uint64_t offset, const char* what) {
  auto* p = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = fs.pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return io_error(errno, what);
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return done;
}

Result<std::uint64_t> file_size(FileSystem& fs, int fd, const char* what) {
  struct stat st {};
  if (fs.fstat(fd, &st) != 0) return io_error(errno, what);
  return static_cast<std::uint64_t>(st.st_size);
}

Status fdatasync_fd(FileSystem& fs, int fd, const char* what) {
  while (fs.fdatasync(fd) != 0) {
    if (errno == EINTR) continue;
    return io_error(errno, what);
  }
  return Status::ok();
}

Status truncate_fd(FileSystem& fs, int fd, std::uint64_t size, const char* what) {
  if (fs.ftruncate(fd, static_cast<off_t>(size)) != 0) return io_error(errno, what);
  return Status::ok();
}

Status fsync_dir(FileSystem& fs, const std::string& dir) {
  auto fd = open_file(fs, dir, O_RDONLY | O_DIRECTORY);
  if (!fd) return fd.status();
  while (fs.fsync(fd->get()) != 0) {
    if (errno == EINTR) continue;
    return io_error(errno, ("fsync of the directory " + dir).c_str());
  }
  return Status::ok();
}

std::string parent_dir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

Status write_file_atomic(FileSystem& fs, const std::string& dir, const std::string& name,
                         const std::vector<std::byte>& bytes) {
  const std::string tmp = dir + "/" + name + ".tmp";
  auto fd = open_file(fs, tmp, O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd) return fd.status();
  if (Status s = pwrite_all(fs, fd->get(), bytes.data(), bytes.size(), 0, name.c_str()); !s) {
    return s;
  }
  if (Status s = fdatasync_fd(fs, fd->get(), name.c_str()); !s) return s;
  fd->reset();
  if (fs.rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) {
    return io_error(errno, "rename into place");
  }
  return fsync_dir(fs, dir);
}

bool file_exists(FileSystem& fs, const std::string& path) {
  struct stat st {};
  return fs.stat(path.c_str(), &st) == 0;
}

Status remove_file(FileSystem& fs, const std::string& path) {
  if (fs.unlink(path.c_str()) != 0 && errno != ENOENT) {
    return io_error(errno, ("unlink " + path).c_str());
  }
  return Status::ok();
}

}  // namespace radixtier::disk
