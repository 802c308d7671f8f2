// Rebuilding the tree's paths from the disk store's records: the core's rebuild
// (radixtier/transfer/store_rebuild.hpp, which the cache runs at create()) over RecordInfo.
#pragma once

#include <cstdint>
#include <vector>

#include "radixtier/disk/record.hpp"
#include "radixtier/transfer/store_rebuild.hpp"

namespace radixtier::disk {

using radixtier::path_tokens;
using radixtier::RebuiltPage;
using radixtier::RebuiltPaths;

/// rebuild_paths() of the records' ids and descriptions.
RebuiltPaths rebuild_paths(const std::vector<RecordInfo>& records, std::uint32_t page_tokens);

}  // namespace radixtier::disk
