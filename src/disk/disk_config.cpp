#include "radixtier/disk/disk_config.hpp"

#include <string>

namespace radixtier::disk {

const char* to_string(IoEngineKind kind) {
  switch (kind) {
    case IoEngineKind::kAuto:
      return "auto";
    case IoEngineKind::kIoUring:
      return "io_uring";
    case IoEngineKind::kThreadPool:
      return "thread_pool";
  }
  return "unknown";
}

std::string ModelFingerprint::difference(const ModelFingerprint& stored) const {
  std::string out;
  auto add = [&out](const char* field, const std::string& mine, const std::string& theirs) {
    if (mine == theirs) return;
    if (!out.empty()) out += ", ";
    out += std::string(field) + " is '" + theirs + "' in the store, '" + mine + "' asked";
  };
  add("page_tokens", std::to_string(page_tokens), std::to_string(stored.page_tokens));
  add("page_bytes", std::to_string(page_bytes), std::to_string(stored.page_bytes));
  add("snapshot_bytes", std::to_string(snapshot_bytes), std::to_string(stored.snapshot_bytes));
  add("model_id", model_id, stored.model_id);
  add("weights_version", weights_version, stored.weights_version);
  return out;
}

Status IoEngineConfig::validate() const {
  if (slice_bytes == 0 || slice_bytes % 4096 != 0) {
    return invalid_argument("io.slice_bytes must be a positive multiple of 4096, got " +
                            std::to_string(slice_bytes));
  }
  if (queue_depth == 0 || queue_depth > 4096) {
    return invalid_argument("io.queue_depth must be in [1, 4096], got " +
                            std::to_string(queue_depth));
  }
  if (io_threads == 0 || io_threads > 256) {
    return invalid_argument("io.io_threads must be in [1, 256], got " + std::to_string(io_threads));
  }
  return Status::ok();
}

std::uint64_t DiskStoreConfig::capacity_slots() const {
  return fingerprint.page_bytes == 0 ? 0 : budget_bytes / fingerprint.page_bytes;
}

std::uint32_t DiskStoreConfig::snapshot_slots() const {
  const std::uint64_t pb = fingerprint.page_bytes;
  return pb == 0 ? 0 : static_cast<std::uint32_t>((fingerprint.snapshot_bytes + pb - 1) / pb);
}

Status DiskStoreConfig::validate() const {
  if (directory.empty()) return invalid_argument("directory must not be empty");
  // The path goes to the system as a C string: a NUL would cut it short, and the store would
  // open (or create) another directory than the one named.
  if (directory.find('\0') != std::string::npos)
    return invalid_argument("directory must not contain a NUL byte");
  const ModelFingerprint& f = fingerprint;
  if (f.page_tokens == 0) return invalid_argument("fingerprint.page_tokens must be > 0");
  if (f.page_tokens > (1u << 20)) {
    return invalid_argument("fingerprint.page_tokens must be <= 2^20, got " +
                            std::to_string(f.page_tokens));
  }
  if (f.page_bytes == 0) return invalid_argument("fingerprint.page_bytes must be > 0");
  if (f.page_bytes > (std::uint64_t{1} << 32)) {
    return invalid_argument("fingerprint.page_bytes must be <= 4 GiB");
  }
  if (f.snapshot_bytes / f.page_bytes >= (std::uint64_t{1} << 20)) {
    return invalid_argument("fingerprint.snapshot_bytes must be < 2^20 pages");
  }
  if (f.model_id.empty()) return invalid_argument("fingerprint.model_id must not be empty");
  if (f.model_id.size() > 4096 || f.weights_version.size() > 4096) {
    return invalid_argument("fingerprint.model_id and weights_version must be <= 4096 bytes");
  }
  const std::uint64_t slots = capacity_slots();
  if (slots == 0) {
    return invalid_argument("budget_bytes (" + std::to_string(budget_bytes) +
                            ") must hold at least one page of " + std::to_string(f.page_bytes) +
                            " bytes");
  }
  if (slots >= DiskSlotId::kInvalid) {
    return invalid_argument("budget_bytes holds too many pages (at most 2^32 - 2)");
  }
  if (f.snapshot_bytes > 0 && snapshot_slots() > slots) {
    return invalid_argument("budget_bytes (" + std::to_string(budget_bytes) +
                            ") must hold one snapshot of " + std::to_string(f.snapshot_bytes) +
                            " bytes");
  }
  if (journal_batch == 0) return invalid_argument("journal_batch must be > 0");
  return io.validate();
}

}  // namespace radixtier::disk
