#include "radixtier/disk/disk_transfer_engine.hpp"

#include <string>
#include <unordered_set>

namespace radixtier::disk {

std::size_t DiskTransferEngine::pieces_of(RecordKind kind) const {
  return kind == RecordKind::kKvPage ? 1 : store_.config().snapshot_slots();
}

Status DiskTransferEngine::check_geometry() const {
  const ModelFingerprint& f = store_.config().fingerprint;
  if (host_.page_bytes() != f.page_bytes) {
    return invalid_argument("host pages of " + std::to_string(host_.page_bytes()) +
                            " bytes, the disk store's are " + std::to_string(f.page_bytes));
  }
  return Status::ok();
}

Status DiskTransferEngine::check_pages(const std::vector<HostPageId>& pages, std::size_t want,
                                       std::size_t item) const {
  if (pages.size() != want) {
    return invalid_argument("item " + std::to_string(item) + " names " +
                            std::to_string(pages.size()) + " host pages, its record takes " +
                            std::to_string(want));
  }
  for (HostPageId p : pages) {
    if (!p.valid() || p.value() >= host_.host_pages()) {
      return invalid_argument("item " + std::to_string(item) + ": host page id " +
                              std::to_string(p.value()) + " is out of range (" +
                              std::to_string(host_.host_pages()) + " host pages)");
    }
  }
  return Status::ok();
}

Result<DiskTransfer> DiskTransferEngine::demote(const std::vector<HostToDisk>& batch) {
  if (Status s = check_geometry(); !s) return s;
  const std::size_t total_snap = store_.record_bytes(RecordKind::kSnapshot);
  const std::size_t pb = host_.page_bytes();
  std::vector<WriteRequest> requests;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const HostToDisk& item = batch[i];
    if (Status s = check_pages(item.pages, pieces_of(item.desc.kind), i); !s) return s;
    WriteRequest r;
    r.desc = item.desc;
    for (std::size_t k = 0; k < item.pages.size(); ++k) {
      std::span<const std::byte> page = host_.host_page(item.pages[k]);
      if (item.desc.kind == RecordKind::kSnapshot) {
        page = page.first(std::min(pb, total_snap - k * pb));  // the last piece is partial
      }
      r.pieces.push_back(page);
    }
    requests.push_back(std::move(r));
  }
  auto pending = store_.submit_writes(std::move(requests));
  if (!pending) return pending.status();
  DiskTransfer t;
  t.writes_ = std::move(pending).value();
  return t;
}

Result<std::vector<RecordId>> DiskTransferEngine::finish_demotion(DiskTransfer&& transfer) {
  if (!transfer.writes_.valid()) return invalid_argument("not a pending demotion");
  return store_.complete_writes(std::move(transfer.writes_));
}

Result<DiskTransfer> DiskTransferEngine::promote(const std::vector<DiskToHost>& batch) {
  if (Status s = check_geometry(); !s) return s;
  const std::size_t pb = host_.page_bytes();
  std::vector<ReadRequest> requests;
  std::unordered_set<std::uint32_t> targets;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const DiskToHost& item = batch[i];
    const RecordInfo* info = store_.find(item.record);
    if (info == nullptr) {
      return not_found("item " + std::to_string(i) + ": no live disk record " +
                       std::to_string(item.record.value()));
    }
    if (Status s = check_pages(item.pages, pieces_of(info->desc.kind), i); !s) return s;
    ReadRequest r;
    r.id = item.record;
    const std::size_t total = store_.record_bytes(info->desc.kind);
    for (std::size_t k = 0; k < item.pages.size(); ++k) {
      if (!targets.insert(item.pages[k].value()).second) {
        return invalid_argument("host page " + std::to_string(item.pages[k].value()) +
                                " is the destination of two pieces");
      }
      r.out_pieces.push_back(host_.host_page(item.pages[k]).first(std::min(pb, total - k * pb)));
    }
    requests.push_back(std::move(r));
  }
  auto pending = store_.submit_reads(std::move(requests));
  if (!pending) return pending.status();
  DiskTransfer t;
  t.reads_ = std::move(pending).value();
  return t;
}

std::vector<Status> DiskTransferEngine::finish_promotion(DiskTransfer&& transfer) {
  if (!transfer.reads_.valid()) return {invalid_argument("not a pending promotion")};
  return store_.complete_reads(std::move(transfer.reads_));
}

}  // namespace radixtier::disk
