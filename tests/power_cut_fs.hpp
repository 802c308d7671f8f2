// A power-cut model of the page cache, for the disk store's tests.
//
// PowerCutFs is a FileSystem that passes every call to the kernel (the store runs on real
// files in a real directory, as in production) and records, for every file and directory
// under its root, each operation that changes them: creations (open O_CREAT, mkdir), writes
// (pwrite, and every write the store's I/O engine runs: observe() wraps the engine, io_uring
// included), truncations, fsync / fdatasync, renames and unlinks.
//
// write_image(cut, ...) then builds, in another directory, the tree a power cut after the
// first `cut` operations could leave:
//   - a file: what precedes its last fsync (or fdatasync) is durable; the writes and
//     truncations after it persist per 512-byte sector, each sector at a random point of
//     them (kSectors), or as a random prefix of them (kPrefix), or not at all
//     (kDurableOnly);
//   - a directory: entries created, renamed or removed after its last fsync persist as a
//     random in-order prefix (kDurableOnly: none of them). A directory whose entry is lost
//     takes everything under it.
// The lying disk (CutOptions::lying_disk) honours each fsync with probability 1/2: outside
// the store's promise (it may lose synced records) but never an excuse to serve a wrong byte.
//
// What exists under the root when the model is made is durable (a crash image can be the
// root of a new model: a cut during recovery from a cut, "chained crashes").
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "radixtier/disk/file_system.hpp"

namespace radixtier::disk::testing {

enum class CutMode {
  kDurableOnly,  ///< only what was fsynced: the strictest image, deterministic
  kPrefix,       ///< per file and directory, a random prefix of what came after
  kSectors,      ///< files per sector at random; directories as a prefix
};

struct CutOptions {
  CutMode mode = CutMode::kSectors;
  bool lying_disk = false;
};

/// The kernel's file system with fsync and fdatasync skipped: for opening crash images, whose
/// own durability no test looks at (the kernel's flushes would only cost time).
std::shared_ptr<FileSystem> unsynced_file_system();

class PowerCutFs final : public FileSystem {
 public:
  /// Models everything under `root` (an existing directory; its own entry is durable).
  explicit PowerCutFs(std::string root);

  int open(const char* path, int flags, mode_t mode) override;
  int close(int fd) override;
  ssize_t pwrite(int fd, const void* src, std::size_t n, off_t offset) override;
  ssize_t pread(int fd, void* dst, std::size_t n, off_t offset) override;
  int fdatasync(int fd) override;
  int fsync(int fd) override;
  int ftruncate(int fd, off_t size) override;
  int fstat(int fd, struct stat* st) override;
  int stat(const char* path, struct stat* st) override;
  int rename(const char* from, const char* to) override;
  int unlink(const char* path) override;
  int mkdir(const char* path, mode_t mode) override;
  int flock(int fd, int operation) override;
  std::unique_ptr<DiskIoEngine> observe(std::unique_ptr<DiskIoEngine> engine) override;

  /// Operations recorded so far; a cut point is a count of them (0: before the first).
  std::size_t operations() const;
  /// Fills `image_root` (an existing, empty directory) with what a power cut after the first
  /// `cut` operations could leave under the root.
  void write_image(std::size_t cut, const CutOptions& options, std::mt19937_64& rng,
                   const std::string& image_root) const;
  /// Cut points right after a write to a file named `name` (its last name), where a torn
  /// write is possible: e.g. "journal".
  std::vector<std::size_t> cuts_after_writes_to(const std::string& name) const;
  /// "write data @4096 +4096" and the like, for failure messages.
  std::string describe(std::size_t op) const;

  /// The record of one write (the observed engine calls it for each write it is given).
  void note_write(int fd, const void* src, std::size_t n, std::uint64_t offset);

 private:
  using Ino = std::uint32_t;
  struct Op {
    enum class Kind : std::uint8_t { kCreate, kWrite, kTruncate, kSync, kRename, kUnlink };
    Kind kind = Kind::kWrite;
    Ino ino = 0;  ///< the file written, truncated or synced; the node created or renamed
    Ino dir = 0;  ///< create, rename (from), unlink: the directory
    Ino to_dir = 0;
    std::string name, to_name;
    bool is_dir = false;
    std::uint64_t offset = 0;  ///< write: where; truncate: the new size
    std::vector<std::byte> bytes;
  };
  struct Initial {
    bool dir = false;
    std::vector<std::byte> content;
    std::map<std::string, Ino> entries;
  };
  struct Where {
    bool inside = false;  ///< under the root
    Ino dir = 0;          ///< the directory holding the leaf
    std::string leaf;
    bool exists = false;
    Ino ino = 0;  ///< when it exists
  };
  struct Replay;

  Where resolve(const char* path) const;
  Ino add_node(bool dir);
  void record(Op op);
  void scan(Ino dir, const std::string& path);

  std::string root_;
  mutable std::mutex mu_;
  std::vector<Initial> initial_;      ///< by ino: the tree found at construction
  std::vector<bool> is_dir_;          ///< by ino
  std::vector<std::string> name_of_;  ///< by ino: its last name in its directory
  std::vector<std::map<std::string, Ino>> live_entries_;  ///< by ino (directories)
  std::unordered_map<int, Ino> fds_;
  std::vector<Op> log_;
};

}  // namespace radixtier::disk::testing
