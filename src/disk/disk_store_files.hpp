// The open files of one DiskStore (internal).
#pragma once

#include <string>

#include "file.hpp"
#include "radixtier/disk/disk_store.hpp"

namespace radixtier::disk {

inline constexpr const char* kHeaderFile = "header";
inline constexpr const char* kJournalFile = "journal";
inline constexpr const char* kDataFile = "data";
inline constexpr const char* kLockFile = "lock";

struct DiskStore::Files {
  UniqueFd lock;     ///< flock'd for the store's life
  UniqueFd data;     ///< slots
  UniqueFd journal;  ///< prologue + entries
};

}  // namespace radixtier::disk
