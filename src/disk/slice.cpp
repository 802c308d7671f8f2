#include "slice.hpp"

#include <algorithm>
#include <string>

namespace radixtier::disk {

Status validate_ops(const std::vector<IoOp>& ops) {
  if (ops.empty()) return invalid_argument("I/O batch is empty");
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const IoOp& op = ops[i];
    if (op.fd < 0) return invalid_argument("I/O op " + std::to_string(i) + " has no fd");
    if (op.buffer == nullptr) {
      return invalid_argument("I/O op " + std::to_string(i) + " has no buffer");
    }
    if (op.length == 0) return invalid_argument("I/O op " + std::to_string(i) + " is empty");
  }
  return Status::ok();
}

std::vector<IoSlice> slice_ops(const std::vector<IoOp>& ops, std::size_t slice_bytes) {
  std::vector<IoSlice> out;
  for (const IoOp& op : ops) {
    for (std::size_t done = 0; done < op.length; done += slice_bytes) {
      const std::size_t n = std::min(slice_bytes, op.length - done);
      out.push_back({op.kind, op.fd, op.offset + done, static_cast<char*>(op.buffer) + done, n});
    }
  }
  return out;
}

}  // namespace radixtier::disk
