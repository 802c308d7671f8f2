#include "radixtier/status.hpp"

namespace radixtier {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kTransferFailed:
      return "transfer failed";
    case ErrorCode::kPending:
      return "pending";
    case ErrorCode::kFailedPrecondition:
      return "failed precondition";
    case ErrorCode::kDeviceLost:
      return "device lost";
    case ErrorCode::kDataLoss:
      return "data loss";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(radixtier::to_string(code_)) + ": " + message_;
}

}  // namespace radixtier
