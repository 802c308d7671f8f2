#include "radixtier/shared/shared_store.hpp"

namespace radixtier::shared {

const char* to_string(KeyState state) {
  switch (state) {
    case KeyState::kFound:
      return "found";
    case KeyState::kMissing:
      return "missing";
    case KeyState::kFailed:
      return "failed";
  }
  return "unknown";
}

}  // namespace radixtier::shared
