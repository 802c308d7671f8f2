#include "radixtier/status.hpp"

#include "radixtier/config.hpp"
#include "radixtier/transfer_engine.hpp"

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
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(radixtier::to_string(code_)) + ": " + message_;
}

const char* to_string(WritePolicy policy) {
  return policy == WritePolicy::kWriteBack ? "write-back" : "write-through";
}

const char* to_string(SnapshotEviction eviction) {
  return eviction == SnapshotEviction::kLru ? "lru" : "utility";
}

const char* to_string(Direction dir) {
  return dir == Direction::kDeviceToHost ? "device-to-host" : "host-to-device";
}

const char* to_string(TransferState state) {
  switch (state) {
    case TransferState::kPending:
      return "pending";
    case TransferState::kDone:
      return "done";
    case TransferState::kFailed:
      return "failed";
  }
  return "unknown";
}

Status CacheConfig::validate() const {
  auto bad = [](const char* field, const char* why) {
    return invalid_argument(std::string("CacheConfig.") + field + ": " + why);
  };
  if (page_size == 0) return bad("page_size", "must be at least 1 token");
  if (gpu_pages == 0) return bad("gpu_pages", "must be at least 1 page");
  if (gpu_snapshot_slots == 0) return bad("gpu_snapshot_slots", "must be at least 1 slot");
  if (page_bytes == 0) return bad("page_bytes", "must be at least 1 byte");
  if (snapshot_bytes == 0) return bad("snapshot_bytes", "must be at least 1 byte");
  if (slice_pages == 0) return bad("slice_pages", "must be at least 1 page");
  if (write_policy == WritePolicy::kWriteThrough && host_pages == 0)
    return bad("write_policy", "write-through needs a host tier (host_pages > 0)");
  return Status::ok();
}

void Ticket::reset() {
  if (engine_ == nullptr) return;
  engine_->wait(id_);
  engine_->release(id_);
  engine_ = nullptr;
  id_ = TicketId();
}

Ticket& Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    reset();
    engine_ = std::exchange(other.engine_, nullptr);
    id_ = std::exchange(other.id_, TicketId());
  }
  return *this;
}

TransferState Ticket::poll() const {
  return engine_ ? engine_->poll(id_) : TransferState::kDone;
}
TransferState Ticket::wait() const {
  return engine_ ? engine_->wait(id_) : TransferState::kDone;
}

}  // namespace radixtier
