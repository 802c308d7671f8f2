// The disk store's one validated config: where, how much, which model, how it does I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "radixtier/disk/record.hpp"
#include "radixtier/status.hpp"

namespace radixtier::disk {

class FileSystem;

/// Which model wrote the bytes. Persisted in the store's header; a store opened with another
/// fingerprint is refused (or wiped, when the caller asks): bytes of another model, another
/// geometry or older weights are never reused (brief rule 10).
struct ModelFingerprint {
  std::uint32_t page_tokens = 0;     ///< tokens per page (the cache's page_size)
  std::uint64_t page_bytes = 0;      ///< bytes of one KV page (all attention layers)
  std::uint64_t snapshot_bytes = 0;  ///< bytes of one snapshot (all GDN layers' states)
  std::string model_id;              ///< caller-given, e.g. "Qwen/Qwen3-Next-80B-A3B"
  std::string weights_version;       ///< caller-given, e.g. a checkpoint hash

  bool operator==(const ModelFingerprint&) const = default;
  /// "" when equal, else which fields differ with both values (for the refusal message).
  std::string difference(const ModelFingerprint& stored) const;
};

/// What open() does when the directory holds a store of another fingerprint, or a header
/// that cannot be read (corrupt, truncated, or files without a header).
enum class OnMismatch {
  kRefuse,  ///< open fails with a Status naming the difference; nothing on disk changes
  kWipe,    ///< the store's files are deleted and a fresh store is created
};

enum class IoEngineKind {
  kAuto,        ///< io_uring when the kernel allows it, else the thread pool
  kIoUring,     ///< io_uring only (open fails where it is unavailable)
  kThreadPool,  ///< pread/pwrite on `io_threads` threads
};

const char* to_string(IoEngineKind kind);

struct IoEngineConfig {
  /// io_uring where the kernel allows it, else the thread pool: io_uring reached >= 80% of a
  /// plain pread loop's read bandwidth in 7 of 8 benchmark runs, the pool in 3 of 8
  /// (docs/performance.md).
  IoEngineKind kind = IoEngineKind::kAuto;
  std::size_t slice_bytes = std::size_t{1} << 20;  ///< an I/O is cut into slices of this size
  std::uint32_t queue_depth = 32;                  ///< io_uring: slices in flight at most
  std::uint32_t io_threads = 4;                    ///< thread pool: worker threads

  Status validate() const;
};

struct DiskStoreConfig {
  std::string directory;           ///< created when missing (its parent must exist)
  std::uint64_t budget_bytes = 0;  ///< data file at most this many bytes (whole slots)
  ModelFingerprint fingerprint;
  OnMismatch on_mismatch = OnMismatch::kRefuse;
  /// Commit records are made durable in batches: sync() runs by itself once this many
  /// journal entries are waiting (the caller may call sync() any time).
  std::uint32_t journal_batch = 64;
  /// The journal is rewritten (compacted) when it holds more than this many entries beyond
  /// twice the live records.
  std::uint64_t compact_slack = 4096;
  IoEngineConfig io;
  /// Every file operation of the store goes through it; null: the kernel's
  /// (posix_file_system()). Tests put a model of the page cache here (file_system.hpp).
  std::shared_ptr<FileSystem> file_system;

  /// Names the first bad field; OK when the config can open a store.
  Status validate() const;
  /// Data-file slots of the budget: budget_bytes / page_bytes.
  std::uint64_t capacity_slots() const;
  /// Slots one snapshot takes: ceil(snapshot_bytes / page_bytes).
  std::uint32_t snapshot_slots() const;
};

}  // namespace radixtier::disk
