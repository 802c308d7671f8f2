// describe(id): an id as its stream form ("gpu_page#3"), for error messages; owned_by(lock):
// " (it belongs to request lock#N)" or nothing. Internal: not installed.
#pragma once

#include <sstream>
#include <string>

#include "radixtier/ids.hpp"

namespace radixtier {

template <class Id>
std::string describe(Id id) {
  std::ostringstream os;
  os << id;
  return os.str();
}

inline std::string owned_by(LockId owner) {
  return owner.valid() ? " (it belongs to request " + describe(owner) + ")" : std::string();
}

}  // namespace radixtier
