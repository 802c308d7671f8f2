// The kernel's FileSystem: each call is the system call of its name.
#include "radixtier/disk/file_system.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "radixtier/disk/io_engine.hpp"

namespace radixtier::disk {

namespace {

class PosixFileSystem final : public FileSystem {
 public:
  int open(const char* path, int flags, mode_t mode) override { return ::open(path, flags, mode); }
  int close(int fd) override { return ::close(fd); }
  ssize_t pwrite(int fd, const void* src, std::size_t n, off_t offset) override {
    return ::pwrite(fd, src, n, offset);
  }
  ssize_t pread(int fd, void* dst, std::size_t n, off_t offset) override {
    return ::pread(fd, dst, n, offset);
  }
  int fdatasync(int fd) override { return ::fdatasync(fd); }
  int fsync(int fd) override { return ::fsync(fd); }
  int ftruncate(int fd, off_t size) override { return ::ftruncate(fd, size); }
  int fstat(int fd, struct stat* st) override { return ::fstat(fd, st); }
  int stat(const char* path, struct stat* st) override { return ::stat(path, st); }
  int rename(const char* from, const char* to) override { return ::rename(from, to); }
  int unlink(const char* path) override { return ::unlink(path); }
  int mkdir(const char* path, mode_t mode) override { return ::mkdir(path, mode); }
  int flock(int fd, int operation) override { return ::flock(fd, operation); }
  std::unique_ptr<DiskIoEngine> observe(std::unique_ptr<DiskIoEngine> engine) override {
    return engine;
  }
};

}  // namespace

FileSystem& posix_file_system() {
  static PosixFileSystem fs;
  return fs;
}

}  // namespace radixtier::disk
