#include "sim/counting_transfer_engine.hpp"

#include <algorithm>
#include <sstream>

namespace radixtier::sim {

CountingTransferEngine::CountingTransferEngine(const CacheConfig& c, Completion completion)
    : gpu_pages_(c.gpu_pages),
      host_pages_(static_cast<std::uint32_t>(c.host_pool_pages())),
      gpu_slots_(c.gpu_snapshot_slots),
      host_slots_(c.host_snapshot_slots),
      page_bytes_(c.page_bytes),
      snapshot_bytes_(c.snapshot_bytes),
      slice_pages_(std::max<std::size_t>(1, c.slice_pages)),
      completion_(completion) {}

Result<Ticket> CountingTransferEngine::submit(TransferBatch batch) {
  std::ostringstream err;
  if (const char* why = batch_shape_error(batch)) err << why << "; ";
  for (const auto& p : batch.pages) {
    if (p.gpu.value() >= gpu_pages_) err << p.gpu << " out of range; ";
    if (p.host.value() >= host_pages_) err << p.host << " out of range; ";
  }
  for (const auto& s : batch.snapshots) {
    if (s.gpu.value() >= gpu_slots_) err << s.gpu << " out of range; ";
    if (s.host.value() >= host_slots_) err << s.host << " out of range; ";
  }
  std::uint64_t piece_total = 0;
  for (const auto& p : batch.pieces) {
    if (p.gpu.value() >= gpu_slots_) err << p.gpu << " out of range; ";
    if (p.host.value() >= host_pages_) err << p.host << " out of range; ";
    if (p.offset >= snapshot_bytes_) err << "snapshot piece offset " << p.offset << " too large; ";
    piece_total += piece_bytes(p, page_bytes_, snapshot_bytes_);
  }
  for (const auto& p : batch.slot_pieces) {
    if (p.slot.value() >= gpu_slots_) err << p.slot << " out of range; ";
    if (p.page.value() >= gpu_pages_) err << p.page << " out of range; ";
    if (p.offset >= snapshot_bytes_ || (page_bytes_ != 0 && p.offset % page_bytes_ != 0))
      err << "slot piece offset " << p.offset << " is not a page multiple inside the snapshot; ";
    piece_total += piece_bytes(p, page_bytes_, snapshot_bytes_);
  }
  std::lock_guard lock(mu_);
  for (TicketId dep : batch.after) {
    if (!dep.valid() || dep.value() >= next_id_)
      err << "`after` names " << dep << ", a ticket this engine never issued; ";
  }
  if (err.tellp() > 0) {
    ++stats_.rejected;
    return invalid_argument("transfer batch rejected: " + err.str());
  }
  if (batch.direction == Direction::kDeviceToDevice) {
    DirectionCounts& d = stats_.d2d;
    ++d.batches;
    d.slices += (batch.slot_pieces.size() + slice_pages_ - 1) / slice_pages_;
    d.pages += batch.slot_pieces.size();
    for (const auto& p : batch.slot_pieces) d.snapshots += p.offset == 0;
    d.bytes += piece_total;
  } else {
    DirectionCounts& d = batch.direction == Direction::kDeviceToHost ? stats_.d2h : stats_.h2d;
    ++d.batches;
    d.slices += (batch.pages.size() + slice_pages_ - 1) / slice_pages_ + batch.snapshots.size() +
                (batch.pieces.size() + slice_pages_ - 1) / slice_pages_;
    d.pages += batch.pages.size();
    d.snapshots += batch.snapshots.size();
    for (const auto& p : batch.pieces) d.snapshots += p.offset == 0;
    d.bytes +=
        batch.pages.size() * page_bytes_ + batch.snapshots.size() * snapshot_bytes_ + piece_total;
  }
  const TicketId id(next_id_++);
  // kImmediate: the tickets it runs after are done already (each was at its submission).
  tickets_.emplace(id, Entry{completion_ == Completion::kImmediate ? TransferState::kDone
                                                                   : TransferState::kPending,
                             std::move(batch.after)});
  return Ticket(this, id);
}

TransferState CountingTransferEngine::poll(TicketId id) {
  std::lock_guard lock(mu_);
  auto it = tickets_.find(id);
  return it == tickets_.end() ? TransferState::kFailed : it->second.state;
}

void CountingTransferEngine::complete_locked(TicketId id) {
  auto it = tickets_.find(id);
  if (it == tickets_.end() || it->second.state != TransferState::kPending) return;
  // The tickets it runs after complete first (earlier ids only: the recursion ends).
  const std::vector<TicketId> deps = it->second.after;
  for (TicketId dep : deps) complete_locked(dep);
  tickets_.at(id).state = TransferState::kDone;
}

TransferState CountingTransferEngine::wait(TicketId id) {
  std::lock_guard lock(mu_);
  auto it = tickets_.find(id);
  if (it == tickets_.end()) return TransferState::kFailed;
  complete_locked(id);
  return tickets_.at(id).state;
}

void CountingTransferEngine::release(TicketId id) {
  std::lock_guard lock(mu_);
  auto it = tickets_.find(id);
  if (it != tickets_.end() && it->second.state != TransferState::kPending) tickets_.erase(it);
}

CountingStats CountingTransferEngine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::size_t CountingTransferEngine::outstanding() const {
  std::lock_guard lock(mu_);
  return tickets_.size();
}

}  // namespace radixtier::sim
