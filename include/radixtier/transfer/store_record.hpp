// Store records: what a tier below host (the disk, later a store shared across machines)
// persists, and the path identity the tree rebuilds itself from after a restart.
//
// A record is one KV page or one snapshot. A KV page record carries its own page's tokens,
// the boundary at its end and the path hash of its parent (the page before it on the path),
// so the token path of every page can be rebuilt from the records alone: follow parent
// hashes up to the root. A snapshot record carries the path hash and boundary of the node
// end it was taken at; it belongs to the KV page record with the same path hash.
//
// Path hash: root = all zero; hash(page) = XXH3-128(parent hash || page tokens) (little-endian
// bytes). 128 bits, so two different paths collide with probability ~2^-128 per pair; the
// store also keeps the tokens, so a rebuilt tree compares tokens, not only hashes.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "radixtier/ids.hpp"

namespace radixtier {

/// A record's id: never reused within one store, across restarts too (the store continues
/// from the largest id its journal ever named).
class RecordId {
 public:
  static constexpr std::uint64_t kInvalid = std::numeric_limits<std::uint64_t>::max();
  constexpr RecordId() = default;
  constexpr explicit RecordId(std::uint64_t v) : v_(v) {}
  constexpr std::uint64_t value() const { return v_; }
  constexpr bool valid() const { return v_ != kInvalid; }
  constexpr auto operator<=>(const RecordId&) const = default;
  friend std::ostream& operator<<(std::ostream& os, RecordId id) {
    return id.valid() ? os << "record#" << id.v_ : os << "record#none";
  }

 private:
  std::uint64_t v_ = kInvalid;
};

struct PathHash {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  constexpr auto operator<=>(const PathHash&) const = default;
  static constexpr PathHash root() { return {}; }
  bool is_root() const { return lo == 0 && hi == 0; }
  std::string to_string() const;
};

/// The path hash of the page `tokens` whose parent page has path hash `parent`.
PathHash extend_path(PathHash parent, std::span<const Token> tokens);

/// Path hashes of the first `pages` whole pages of `tokens` (fewer when it has fewer): out[p]
/// ends after p pages (out[0] = the root), so page p is named by out[p + 1] and the boundary
/// after b pages by out[b].
std::vector<PathHash> page_path_hashes(std::span<const Token> tokens, std::uint32_t page_size,
                                       std::size_t pages);

enum class RecordKind : std::uint8_t {
  kKvPage = 1,
  kSnapshot = 2,
};

const char* to_string(RecordKind kind);

/// What the caller says about a record it writes. For a KV page: tokens = that page's
/// page_tokens tokens, parent = the path hash of the page before it (root for the first),
/// boundary = tokens from the root to the page's end. For a snapshot: path = the path hash
/// of the KV page that ends at `boundary`; tokens and parent are unused (must be empty/root).
struct RecordDesc {
  RecordKind kind = RecordKind::kKvPage;
  std::uint64_t boundary = 0;
  PathHash parent;            ///< KV page: the parent page's path hash
  std::vector<Token> tokens;  ///< KV page: its page_tokens tokens
  PathHash path;              ///< snapshot: the path hash at `boundary`

  static RecordDesc kv_page(PathHash parent, std::uint64_t boundary, std::vector<Token> tokens);
  static RecordDesc snapshot(PathHash path, std::uint64_t boundary);
  /// The path hash of the node end this record belongs to (KV: extend_path(parent, tokens)).
  PathHash node_path() const;
};

/// A committed record as a store lists it (StoreEngine::records(), the input of the rebuild).
struct StoredRecord {
  RecordId id;
  RecordDesc desc;
};

}  // namespace radixtier

template <>
struct std::hash<radixtier::RecordId> {
  std::size_t operator()(radixtier::RecordId id) const noexcept {
    return std::hash<std::uint64_t>{}(id.value());
  }
};
template <>
struct std::hash<radixtier::PathHash> {
  std::size_t operator()(const radixtier::PathHash& h) const noexcept {
    return static_cast<std::size_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ULL));
  }
};
