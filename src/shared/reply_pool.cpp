#include "shared/reply_pool.hpp"

namespace radixtier::shared::detail {

std::size_t ReplyPool::capacity_of(const std::vector<GetReply>& replies) {
  std::size_t bytes = 0;
  for (const GetReply& r : replies) bytes += r.value.capacity();
  return bytes;
}

std::vector<GetReply> ReplyPool::take() {
  std::lock_guard lock(mu_);
  if (kept_.empty()) return {};
  std::vector<GetReply> out = std::move(kept_.back());
  held_bytes_ -= kept_bytes_.back();
  kept_.pop_back();
  kept_bytes_.pop_back();
  return out;
}

void ReplyPool::give(std::vector<GetReply> replies) {
  const std::size_t bytes = capacity_of(replies);  // outside the lock: walks the strings
  std::lock_guard lock(mu_);
  if (kept_.size() >= max_vectors_ || bytes > max_bytes_ - held_bytes_) return;  // freed
  kept_.push_back(std::move(replies));
  kept_bytes_.push_back(bytes);
  held_bytes_ += bytes;
}

std::size_t ReplyPool::held_bytes() const {
  std::lock_guard lock(mu_);
  return held_bytes_;
}

std::size_t ReplyPool::held_vectors() const {
  std::lock_guard lock(mu_);
  return kept_.size();
}

}  // namespace radixtier::shared::detail
