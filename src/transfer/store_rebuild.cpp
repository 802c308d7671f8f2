#include "radixtier/transfer/store_rebuild.hpp"

#include <algorithm>
#include <unordered_map>

namespace radixtier {

RebuiltPaths rebuild_paths(std::span<const StoredRecord> records, std::uint32_t page_tokens) {
  RebuiltPaths out;
  std::vector<const StoredRecord*> pages;
  std::vector<const StoredRecord*> snaps;
  for (const StoredRecord& r : records) {
    (r.desc.kind == RecordKind::kKvPage ? pages : snaps).push_back(&r);
  }
  // A parent's boundary is smaller than its child's: boundary order places parents first.
  std::sort(pages.begin(), pages.end(), [](const StoredRecord* a, const StoredRecord* b) {
    return a->desc.boundary != b->desc.boundary ? a->desc.boundary < b->desc.boundary
                                                : a->id < b->id;
  });
  std::unordered_map<PathHash, std::size_t> by_path;
  for (const StoredRecord* r : pages) {
    const PathHash path = extend_path(r->desc.parent, r->desc.tokens);
    std::int64_t parent = -1;
    bool ok = r->desc.tokens.size() == page_tokens && path == r->desc.path;
    if (ok && r->desc.parent.is_root()) {
      ok = r->desc.boundary == page_tokens;
    } else if (ok) {
      auto it = by_path.find(r->desc.parent);
      ok = it != by_path.end() && out.pages[it->second].boundary + page_tokens == r->desc.boundary;
      if (ok) parent = static_cast<std::int64_t>(it->second);
    }
    if (!ok) {
      out.orphan_pages.push_back(r->id);
      continue;
    }
    if (by_path.count(path) != 0) {
      out.duplicate_pages.push_back(r->id);
      continue;
    }
    by_path.emplace(path, out.pages.size());
    out.pages.push_back({r->id, path, parent, r->desc.boundary, r->desc.tokens, {}});
  }
  std::sort(snaps.begin(), snaps.end(),
            [](const StoredRecord* a, const StoredRecord* b) { return a->id < b->id; });
  for (const StoredRecord* r : snaps) {
    auto it = by_path.find(r->desc.path);
    if (it == by_path.end() || out.pages[it->second].boundary != r->desc.boundary) {
      out.orphan_snapshots.push_back(r->id);
      continue;
    }
    out.pages[it->second].snapshots.push_back(r->id);
  }
  return out;
}

std::vector<Token> path_tokens(const RebuiltPaths& paths, std::size_t index) {
  std::vector<std::size_t> chain;
  for (std::int64_t i = static_cast<std::int64_t>(index); i >= 0; i = paths.pages[i].parent) {
    chain.push_back(static_cast<std::size_t>(i));
  }
  std::vector<Token> out;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const auto& t = paths.pages[*it].tokens;
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

}  // namespace radixtier
