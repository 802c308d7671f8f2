// Rebuilding the tree's paths from a store's records alone (no second index).
//
// The cache, on restart, inserts `pages` in order (every parent before its children, so
// each page extends a path already in the tree) and attaches each snapshot to the node end
// of its KV page. Records that cannot be placed are listed, not guessed at: a KV page whose
// parent is not on disk (it was dropped or lost) and a snapshot whose KV page is not on disk
// can never be part of a usable match (brief rule 1: KV everywhere on the path), so the
// cache erases them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "radixtier/transfer/store_record.hpp"

namespace radixtier {

struct RebuiltPage {
  RecordId record;
  PathHash path;             ///< this page's node-end path hash
  std::int64_t parent = -1;  ///< index into RebuiltPaths::pages; -1: the root
  std::uint64_t boundary = 0;
  std::vector<Token> tokens;
  std::vector<RecordId> snapshots;  ///< snapshot records at this page's end
};

struct RebuiltPaths {
  std::vector<RebuiltPage> pages;      ///< parents before children
  std::vector<RecordId> orphan_pages;  ///< parent not on disk, or boundary inconsistent
  std::vector<RecordId> orphan_snapshots;
  std::vector<RecordId> duplicate_pages;  ///< same path as a page already placed
};

/// `page_tokens`: the store's tokens per page (a page's boundary must be its parent's plus
/// page_tokens, its path hash must be extend_path(parent, tokens)).
RebuiltPaths rebuild_paths(std::span<const StoredRecord> records, std::uint32_t page_tokens);

/// The full token path of pages[index] (root to its end), by walking parents.
std::vector<Token> path_tokens(const RebuiltPaths& paths, std::size_t index);

}  // namespace radixtier
