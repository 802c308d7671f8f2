#include "radixtier/disk/rebuild.hpp"

namespace radixtier::disk {

RebuiltPaths rebuild_paths(const std::vector<RecordInfo>& records, std::uint32_t page_tokens) {
  std::vector<StoredRecord> stored;
  stored.reserve(records.size());
  for (const RecordInfo& r : records) stored.push_back({r.id, r.desc});
  return radixtier::rebuild_paths(stored, page_tokens);
}

}  // namespace radixtier::disk
