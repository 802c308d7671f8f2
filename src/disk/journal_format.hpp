// The on-disk byte formats of the store: the header file, the journal's prologue and its
// entries (docs/architecture.md, "The disk store", has the tables). Little-endian machines
// only: the header records an endianness marker and a big-endian reader refuses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "radixtier/disk/disk_config.hpp"
#include "radixtier/disk/record.hpp"
#include "radixtier/status.hpp"

namespace radixtier::disk::format {

inline constexpr std::uint32_t kFormatVersion = 1;
inline constexpr std::size_t kJournalPrologueBytes = 32;
inline constexpr std::size_t kEntryHeaderBytes = 32;
inline constexpr std::uint32_t kMaxEntryPayload = 64u << 20;

struct StoreHeader {
  std::uint64_t store_id = 0;  ///< random at creation; the journal names it too
  ModelFingerprint fingerprint;
};

std::vector<std::byte> encode_header(const StoreHeader& header);
/// kDataLoss naming what is wrong (magic, version, endianness, checksum, truncation).
Result<StoreHeader> decode_header(std::span<const std::byte> bytes);

/// `first_id`: no record id below it may be handed out again (compaction drops the entries
/// of erased records, and ids are never reused).
std::vector<std::byte> encode_journal_prologue(std::uint64_t store_id, std::uint64_t first_id);
/// The prologue's first_id, or kDataLoss when the prologue is not this store's.
Result<std::uint64_t> check_journal_prologue(std::span<const std::byte> bytes,
                                             std::uint64_t store_id);

enum class EntryType : std::uint16_t { kCommit = 1, kFree = 2 };

struct JournalEntry {
  EntryType type = EntryType::kCommit;
  std::uint64_t seq = 0;
  RecordInfo record;  ///< kCommit: the whole record; kFree: only record.id
};

void append_commit(std::vector<std::byte>& out, std::uint64_t seq, const RecordInfo& record);
void append_free(std::vector<std::byte>& out, std::uint64_t seq, RecordId id);

struct DecodedEntry {
  JournalEntry entry;
  std::size_t bytes = 0;  ///< the entry's size in the journal
};
/// The entry at data[pos], or nullopt when it is torn, fails its checksum, is malformed or
/// does not carry sequence number `expected_seq` (the end of the valid journal).
std::optional<DecodedEntry> decode_entry(std::span<const std::byte> data, std::size_t pos,
                                         std::uint64_t expected_seq);

}  // namespace radixtier::disk::format
