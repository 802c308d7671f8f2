// Cutting a batch of I/O operations into slices (shared by both engines).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "radixtier/disk/io_engine.hpp"

namespace radixtier::disk {

/// A slice: at most slice_bytes of one operation.
struct IoSlice {
  IoOp::Kind kind = IoOp::Kind::kRead;
  int fd = -1;
  std::uint64_t offset = 0;
  char* buffer = nullptr;
  std::size_t length = 0;
};

/// OK when every op has an fd, a buffer and a length.
Status validate_ops(const std::vector<IoOp>& ops);
std::vector<IoSlice> slice_ops(const std::vector<IoOp>& ops, std::size_t slice_bytes);

}  // namespace radixtier::disk
