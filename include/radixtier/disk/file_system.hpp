// The disk store's view of the file system: every open, write, read, sync, truncate, rename,
// unlink and mkdir the store makes goes through one FileSystem, and the I/O engine that runs
// its data reads and writes is handed to FileSystem::observe() first. The default is the
// kernel's (posix_file_system()); tests swap in a model of the page cache that records every
// operation and builds the files a power cut could leave (tests/power_cut_fs.hpp).
//
// The calls are shaped like the system calls they stand for: they return what the system
// call returns (-1 with errno set on failure), so one error path serves both.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <memory>

namespace radixtier::disk {

class DiskIoEngine;

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual int open(const char* path, int flags, mode_t mode) = 0;
  virtual int close(int fd) = 0;
  virtual ssize_t pwrite(int fd, const void* src, std::size_t n, off_t offset) = 0;
  virtual ssize_t pread(int fd, void* dst, std::size_t n, off_t offset) = 0;
  virtual int fdatasync(int fd) = 0;
  /// Of a directory opened O_RDONLY | O_DIRECTORY: makes its entries durable.
  virtual int fsync(int fd) = 0;
  virtual int ftruncate(int fd, off_t size) = 0;
  virtual int fstat(int fd, struct stat* st) = 0;
  virtual int stat(const char* path, struct stat* st) = 0;
  virtual int rename(const char* from, const char* to) = 0;
  virtual int unlink(const char* path) = 0;
  virtual int mkdir(const char* path, mode_t mode) = 0;
  virtual int flock(int fd, int operation) = 0;
  /// The engine the store runs its data reads and writes on (the store calls it once, at
  /// open). The kernel's returns `engine` itself; a model wraps it to see every write.
  virtual std::unique_ptr<DiskIoEngine> observe(std::unique_ptr<DiskIoEngine> engine) = 0;
};

/// The kernel's file system (the default of DiskStoreConfig::file_system).
FileSystem& posix_file_system();

}  // namespace radixtier::disk
