// IoTicket, the errno mapping and the engine factory (with io_uring's clean fallback).
#include "radixtier/disk/io_engine.hpp"

#include <cerrno>
#include <cstring>
#include <string>

namespace radixtier::disk {

IoTicket& IoTicket::operator=(IoTicket&& other) noexcept {
  if (this != &other) {
    reset();
    engine_ = std::exchange(other.engine_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

IoState IoTicket::poll() const {
  return engine_ ? engine_->poll(id_) : IoState::kFailed;
}

Status IoTicket::wait() const {
  return engine_ ? engine_->wait(id_)
                 : Status(ErrorCode::kFailedPrecondition, "wait on an empty I/O ticket");
}

void IoTicket::reset() {
  if (engine_ == nullptr) return;
  (void)engine_->wait(id_);
  engine_->release(id_);
  engine_ = nullptr;
}

Status io_error(int err, const char* what) {
  const std::string text = std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return out_of_memory("disk full: " + text);
    default:
      return {ErrorCode::kTransferFailed, "I/O error: " + text};
  }
}

Result<std::unique_ptr<DiskIoEngine>> make_io_engine(const IoEngineConfig& config,
                                                     std::string* fallback_reason) {
  if (fallback_reason) fallback_reason->clear();
  if (Status s = config.validate(); !s) return s;
  switch (config.kind) {
    case IoEngineKind::kIoUring:
      return make_uring_engine(config);
    case IoEngineKind::kThreadPool:
      return make_thread_pool_engine(config);
    case IoEngineKind::kAuto: {
      auto uring = make_uring_engine(config);
      if (uring) return uring;
      if (fallback_reason) *fallback_reason = uring.status().message();
      return make_thread_pool_engine(config);
    }
  }
  return invalid_argument("io.kind is not a known engine");
}

}  // namespace radixtier::disk
