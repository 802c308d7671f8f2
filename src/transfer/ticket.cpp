#include <utility>

#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier {

const char* to_string(Direction dir) {
  switch (dir) {
    case Direction::kDeviceToHost:
      return "device-to-host";
    case Direction::kHostToDevice:
      return "host-to-device";
    case Direction::kDeviceToDevice:
      return "device-to-device";
  }
  return "unknown";
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
