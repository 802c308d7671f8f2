// The capture checks every executor that captures shares (executor.hpp).
#include "radixtier/scheduler/executor.hpp"

#include <string>

namespace radixtier::sched {

Status check_captures(std::span<const StateCapture> captures, std::size_t pos, std::size_t tokens,
                      std::size_t granularity) {
  std::size_t previous = pos;
  for (const StateCapture& c : captures) {
    const std::string where = "forward_capturing: capture at " + std::to_string(c.position);
    if (granularity == 0) return invalid_argument(where + ": this executor cannot capture");
    if (c.position <= previous || c.position >= pos + tokens) {
      return invalid_argument(where + " is not ascending strictly inside (" + std::to_string(pos) +
                              ", " + std::to_string(pos + tokens) + ")");
    }
    if ((c.position - pos) % granularity != 0) {
      return invalid_argument(where + " is not " + std::to_string(pos) + " plus a multiple of " +
                              std::to_string(granularity) + " tokens");
    }
    previous = c.position;
  }
  return Status::ok();
}

}  // namespace radixtier::sched
