// The "host prefix tier" of the index-based baseline: a second index beside the GPU tree.
//
// One LRU-ordered map keyed by the WHOLE page-aligned prefix (its tokens as bytes). Entry:
//   tokens        the prefix
//   kv            optional: one host page per page of the whole prefix (no sharing between
//                 entries: host memory grows with the sum of prefix lengths)
//   snapshot      optional: one host snapshot slot
//
// Entry transitions:  absent --put--> present --put (merge, frees what it replaces)--> present
//                     present --drop_oldest / drop (frees everything)--> absent
// lookup() re-hashes every shorter page-aligned prefix from the longest down; lookup_exact()
// hashes once; both move a hit to most-recent. The index lives in process memory only.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "radixtier/cache/id_pool.hpp"
#include "radixtier/ids.hpp"

namespace radixtier::index_tier {

struct HostEntry {
  std::vector<Token> tokens;
  std::optional<std::vector<HostPageId>> kv;
  HostSlotId snapshot;  ///< invalid: no snapshot

  bool complete() const { return kv.has_value() && snapshot.valid(); }
};

struct HostIndexStats {
  std::uint64_t lookups = 0;
  std::uint64_t hashed_tokens = 0;  ///< tokens turned into keys by lookups (the O(L^2) cost)
  std::uint64_t entries_dropped = 0;
  std::uint64_t pages_freed = 0;     ///< host pages freed by drops and replacements
  std::uint64_t slots_dropped = 0;   ///< host snapshot slots freed by dropping an entry
  std::uint64_t slots_replaced = 0;  ///< host snapshot slots freed by a merging put
  std::uint64_t bytes_peak = 0;
};

class HostPrefixIndex {
 public:
  HostPrefixIndex(std::uint32_t page_size, std::uint32_t host_pages,
                  std::uint32_t host_snapshot_slots, std::size_t page_bytes,
                  std::size_t snapshot_bytes);

  /// Longest entry whose prefix is a page-aligned prefix of `tokens`; moves it to most-recent.
  const HostEntry* lookup(std::span<const Token> tokens);
  /// The entry for exactly `prefix`; moves it to most-recent.
  const HostEntry* lookup_exact(std::span<const Token> prefix);
  /// Merges into the entry for `prefix` (creating it), freeing the pages or slot it
  /// replaces, and moves it to most-recent. Ids given must be held by kNode (allocated here).
  void put(std::span<const Token> prefix, std::optional<std::vector<HostPageId>> kv,
           HostSlotId snapshot);

  /// `n` host pages for a KV write, dropping the oldest whole entries until they fit;
  /// nullopt when n exceeds the whole budget (nothing is dropped then).
  std::optional<std::vector<HostPageId>> alloc_kv(std::size_t n);
  /// A slot of the snapshot bank; invalid when the bank is full (the caller decides).
  HostSlotId alloc_snapshot_slot();
  /// Returns ids allocated above but not put (a failed copy).
  void free_kv(std::span<const HostPageId> pages);
  void free_snapshot_slot(HostSlotId slot);
  /// Drops the least recently used entry; false when empty.
  bool drop_oldest();

  std::size_t entries() const { return lru_.size(); }
  std::uint64_t bytes_in_use() const;
  const HostIndexStats& stats() const { return stats_; }
  const IdPool<HostPageId>& page_pool() const { return pages_; }
  const IdPool<HostSlotId>& slot_pool() const { return slots_; }

  /// Every entry's key equals its tokens, KV has one page per page, every id it names is
  /// held by kNode exactly once, and the pools' kNode counts match. "" or the violation.
  std::string check() const;

 private:
  using Lru = std::list<HostEntry>;  // front: most recent
  static std::string key_of(std::span<const Token> tokens);
  void touch(Lru::iterator it) { lru_.splice(lru_.begin(), lru_, it); }
  void release(HostEntry& e, bool dropping);
  void note_peak();

  const std::uint32_t page_size_;
  const std::size_t page_bytes_, snapshot_bytes_;
  IdPool<HostPageId> pages_;
  IdPool<HostSlotId> slots_;
  Lru lru_;
  std::unordered_map<std::string, Lru::iterator> map_;
  HostIndexStats stats_;
};

}  // namespace radixtier::index_tier
