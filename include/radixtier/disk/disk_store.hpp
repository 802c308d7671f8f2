// The disk store: KV page and snapshot records in one directory, within a byte budget,
// surviving a restart and a crash, reused only by the model that wrote them.
//
// Files (docs/architecture.md, "The disk store"): `header` (format, store id, model
// fingerprint), `data` (slots of page_bytes), `journal` (append-only commit and free
// entries), `lock` (flock: one process per store).
//
// Record states and the functions that move a record between them:
//
//   (none) --submit_writes--> Writing   slots reserved, bytes on their way to `data`
//   Writing --complete_writes ok--> Live (unsynced)   commit entry waits in the batch
//   Writing --complete_writes failed--> (none)        slots back to the free list
//   Live (unsynced) --sync--> Live (durable)          survives kill -9 and power loss
//   Live --erase--> (none)      free entry waits in the batch; its slots are reused only
//                               after the sync that makes the free entry durable
//   Live --read fails its checksum--> (none)   reported as kDataLoss, erased ("lost")
//
// Write order (crash consistency): data slices -> fdatasync(data) -> journal entries (each
// with its own checksum) -> fdatasync(journal). Recovery replays the journal's longest valid
// prefix and ignores a torn or uncommitted tail, so a record is whole or absent.
//
// Not thread-safe: one owner thread calls it (the cache's); the I/O engine runs the slices.
// PendingWrites and PendingReads must not outlive their store.
// A failed fsync switches the store off for good (every later call: kFailedPrecondition):
// after a failed fsync the kernel may have dropped dirty pages, and a retry could succeed
// without the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "radixtier/disk/disk_config.hpp"
#include "radixtier/disk/file_system.hpp"
#include "radixtier/disk/io_engine.hpp"
#include "radixtier/disk/record.hpp"
#include "radixtier/status.hpp"

namespace radixtier::disk {

/// What open() found on disk.
struct RecoveryReport {
  bool created = false;                   ///< a fresh store (empty or missing directory)
  bool wiped = false;                     ///< an old store was deleted (OnMismatch::kWipe)
  std::string wipe_reason;                ///< why it was wiped
  std::uint64_t journal_entries = 0;      ///< valid entries replayed
  std::uint64_t torn_tail_bytes = 0;      ///< bytes after the valid prefix, ignored and cut
  std::uint64_t records = 0;              ///< live records after recovery
  std::uint64_t dropped_truncated = 0;    ///< records whose slots lie past the data file's end
  std::uint64_t dropped_over_budget = 0;  ///< records in slots beyond a smaller budget
  std::string io_engine;                  ///< the engine in use ("io_uring" / "thread_pool")
  std::string io_fallback_reason;         ///< why io_uring was not used under kAuto
};

struct DiskStoreStats {
  std::uint64_t capacity_slots = 0;
  std::uint64_t free_slots = 0;     ///< reusable now
  std::uint64_t freeing_slots = 0;  ///< of erased records, reusable after the next sync
  std::uint64_t writing_slots = 0;  ///< reserved by pending writes
  std::uint64_t records = 0;
  std::uint64_t unsynced_entries = 0;  ///< journal entries waiting for sync()
  std::uint64_t records_written = 0;
  std::uint64_t records_read = 0;
  std::uint64_t records_lost = 0;  ///< failed their checksum or were truncated: erased
  std::uint64_t write_failures = 0;
  std::uint64_t read_failures = 0;  ///< I/O errors (the record is kept)
  std::uint64_t syncs = 0;
  std::uint64_t compactions = 0;
};

/// One record to write: what it is and its bytes (page_bytes for a KV page, snapshot_bytes
/// for a snapshot), either contiguous in `bytes` or, when `bytes` is empty, in `pieces`: one
/// span per data slot, page_bytes each but the last (a snapshot kept in host pages, written
/// without a staging copy). The bytes must stay valid and unchanged until complete_writes
/// returns; if they change meanwhile the record fails its checksum when read (lost, never
/// wrong).
struct WriteRequest {
  RecordDesc desc;
  std::span<const std::byte> bytes;
  std::vector<std::span<const std::byte>> pieces;
};

/// One record to read into `out` (exactly the record's size), or, when `out` is empty, into
/// `out_pieces` (one span per data slot, as WriteRequest::pieces).
struct ReadRequest {
  RecordId id;
  std::span<std::byte> out;
  std::vector<std::span<std::byte>> out_pieces;
};

class DiskStore;

/// Writes in flight: move-only; pass it back to complete_writes (destroying it unfinished
/// waits for the I/O and gives the slots back, committing nothing).
class PendingWrites {
 public:
  PendingWrites() = default;
  PendingWrites(PendingWrites&& other) noexcept { *this = std::move(other); }
  PendingWrites& operator=(PendingWrites&&) noexcept;
  PendingWrites(const PendingWrites&) = delete;
  PendingWrites& operator=(const PendingWrites&) = delete;
  ~PendingWrites();
  bool valid() const { return store_ != nullptr; }
  IoState poll() const { return ticket_.poll(); }
  std::size_t size() const { return records_.size(); }

 private:
  friend class DiskStore;
  void abandon();
  DiskStore* store_ = nullptr;
  IoTicket ticket_;
  std::vector<RecordInfo> records_;
};

/// Reads in flight: move-only; pass it back to complete_reads.
class PendingReads {
 public:
  PendingReads() = default;
  PendingReads(PendingReads&& other) noexcept { *this = std::move(other); }
  PendingReads& operator=(PendingReads&&) noexcept;
  PendingReads(const PendingReads&) = delete;
  PendingReads& operator=(const PendingReads&) = delete;
  ~PendingReads();
  bool valid() const { return store_ != nullptr; }
  IoState poll() const { return ticket_.poll(); }
  std::size_t size() const { return reads_.size(); }

 private:
  friend class DiskStore;
  void abandon();
  DiskStore* store_ = nullptr;
  IoTicket ticket_;
  std::vector<ReadRequest> reads_;
};

class DiskStore {
 public:
  /// Opens (or creates) the store in config.directory and recovers it. `engine` may be null
  /// (then config.io decides). Fails with kInvalidArgument (bad config), kFailedPrecondition
  /// (another fingerprint, or another process has the store open), kDataLoss (unreadable
  /// header under kRefuse) or kTransferFailed (an I/O error).
  static Result<std::unique_ptr<DiskStore>> open(const DiskStoreConfig& config,
                                                 std::unique_ptr<DiskIoEngine> engine = nullptr);
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  /// Reserves slots for every request, checksums the bytes and submits the writes; all or
  /// nothing: bad input -> kInvalidArgument, not enough free slots -> kOutOfMemory ("disk
  /// budget"), and the store is unchanged.
  Result<PendingWrites> submit_writes(std::vector<WriteRequest> requests);
  /// Waits; on success the records are live (commit entries queued; durable at the next
  /// sync, which runs by itself every journal_batch entries) and their ids are returned in
  /// request order. On an I/O error (ENOSPC -> kOutOfMemory) nothing is committed.
  Result<std::vector<RecordId>> complete_writes(PendingWrites&& pending);
  /// submit_writes + complete_writes of one record.
  Result<RecordId> put(const RecordDesc& desc, std::span<const std::byte> bytes);

  /// Submits reads of live records (unknown id or wrong size: kInvalidArgument / kNotFound,
  /// nothing submitted). A record being read cannot be erased until its read completes.
  Result<PendingReads> submit_reads(std::vector<ReadRequest> requests);
  /// Waits and checks every record's checksum: per request OK, kDataLoss (the bytes failed
  /// their check or the file was cut: the record is erased, "lost") or kTransferFailed (an
  /// I/O error: the record is kept). Only an OK request's `out` holds the record's bytes.
  std::vector<Status> complete_reads(PendingReads&& pending);
  Status get(RecordId id, std::span<std::byte> out);

  /// Drops a live record (kNotFound when unknown, kFailedPrecondition while being read).
  Status erase(RecordId id);
  /// Makes every queued commit and free entry durable (fdatasync data, append, fdatasync
  /// journal); compacts the journal when it grew past its slack.
  Status sync();
  /// Reads and checks every live record; lost ones are erased. Returns how many were lost.
  Result<std::uint64_t> scrub();

  const RecordInfo* find(RecordId id) const;
  /// Every live record, in id order (the input of rebuild_paths()).
  std::vector<RecordInfo> records() const;
  std::size_t record_bytes(RecordKind kind) const;
  const RecoveryReport& recovery() const { return recovery_; }
  DiskStoreStats stats() const;
  /// Slots reusable now, and slots of erased records reusable after the next sync (O(1);
  /// stats() walks every slot).
  std::uint64_t free_slot_count() const { return free_.size(); }
  std::uint64_t freeing_slot_count() const { return freeing_.size(); }
  const DiskStoreConfig& config() const { return config_; }
  /// Non-empty when sticky-disabled by a failed fsync: why.
  const std::string& disabled_reason() const { return disabled_; }

  /// Every slot below capacity is in exactly one place (free list, freeing list, a pending
  /// write, one live record); counts add up; ids are below next_id. "" when all hold.
  std::string check_invariants() const;

 private:
  friend class PendingWrites;
  friend class PendingReads;
  struct Files;
  DiskStore(DiskStoreConfig config, std::unique_ptr<DiskIoEngine> engine);

  Status recover();
  Status create_fresh();
  Status wipe_files();
  Status replay_journal();
  Status validate_request(const WriteRequest& r) const;
  Status refuse_or_wipe(Status why);
  Status check_usable() const;
  void queue_commit(const RecordInfo& info);
  void queue_free(RecordId id);
  void forget_record(RecordId id);
  void release_slots(const std::vector<DiskSlotId>& slots);
  void abandon_writes(std::vector<RecordInfo>& records);
  void unpin(const std::vector<ReadRequest>& reads);
  Status write_journal_entries(std::span<const std::byte> bytes);
  Status compact();
  Status disable(std::string why);

  DiskStoreConfig config_;
  FileSystem& fs_;  ///< config_.file_system's, or the kernel's
  std::unique_ptr<DiskIoEngine> engine_;
  std::unique_ptr<Files> files_;
  RecoveryReport recovery_;
  std::uint64_t store_id_ = 0;
  std::uint64_t next_id_ = 0;
  std::uint64_t next_seq_ = 1;     ///< of the next journal entry
  std::uint64_t journal_end_ = 0;  ///< bytes of the valid journal
  std::uint64_t journal_entries_ = 0;
  std::unordered_map<RecordId, RecordInfo> live_;
  std::unordered_map<RecordId, std::uint32_t> read_pins_;
  enum class SlotState : std::uint8_t { kFree, kFreeing, kWriting, kLive };
  std::vector<SlotState> slot_state_;  ///< by slot, capacity_slots() of them
  std::vector<DiskSlotId> free_;       ///< reusable now (popped from the back)
  std::vector<DiskSlotId> freeing_;    ///< reusable after the next sync
  std::vector<std::byte> batch_;       ///< encoded journal entries waiting for sync()
  std::uint64_t batch_entries_ = 0;
  std::string disabled_;
  DiskStoreStats stats_;
};

}  // namespace radixtier::disk
