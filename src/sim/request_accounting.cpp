// Per-request accounting: a finished request's row (its admission's reload and store reads,
// prefill, queueing and TTFT; the shared tier's wait before them) and the TTFT floors it is
// measured against (see simulator.hpp, "Per request" and "The disk tier").
#include "sim/simulator_internal.hpp"

namespace radixtier::sim::detail {

/// floor_seconds() with every reusable byte read from the preset's disk instead of moved over
/// PCIe: the floor of a request whose prefix survives only on the store (after a restart).
double disk_floor_seconds(const HardwarePreset& hw, const ModelGeometry& m, std::size_t reusable,
                          std::size_t prompt) {
  const std::uint64_t bytes =
      reusable == 0 ? 0 : reusable * m.kv_bytes_per_token() + m.snapshot_bytes();
  return ttft_seconds(
      hw, disk_read_seconds(hw, 0, bytes),
      prefill_seconds(hw, static_cast<double>(reusable), static_cast<double>(prompt)));
}

double floor_seconds(const HardwarePreset& hw, const ModelGeometry& m, std::size_t reusable,
                     std::size_t prompt) {
  const std::uint64_t bytes =
      reusable == 0 ? 0 : reusable * m.kv_bytes_per_token() + m.snapshot_bytes();
  return ttft_seconds(
      hw, reload_seconds(hw, 0, bytes),
      prefill_seconds(hw, static_cast<double>(reusable), static_cast<double>(prompt)));
}

void account_request(RequestRow& row, const sched::RequestResult& res, const HardwarePreset& hw,
                     bool include_queue) {
  row.ok = res.status.is_ok();
  if (!row.ok) row.error = res.status.to_string();
  row.output_tokens = res.output.size();
  row.cached_tokens = res.cached_tokens;
  row.gpu_cached_tokens = res.gpu_cached_tokens;
  row.host_cached_tokens = res.host_cached_tokens;
  row.recomputed_tokens = res.recomputed_tokens;
  row.bytes_h2d = res.admit_bytes_h2d;
  row.copies_h2d = res.admit_copies_h2d;
  row.reload_s = reload_seconds(hw, row.copies_h2d, row.bytes_h2d);
  row.store_cached_tokens = res.store_cached_tokens;
  row.store_reads = res.admit_store_reads;
  row.bytes_from_store = res.admit_bytes_from_store;
  // Without a store there are no store reads: disk_s is 0 and TTFT is as it always was.
  row.disk_s = disk_read_seconds(hw, row.store_reads, row.bytes_from_store);
  row.shared_tokens = res.shared_tokens;
  row.shared_bytes = res.shared_bytes;
  row.shared_s = res.shared_s;  // 0 without a shared tier
  row.prefill_s = res.prefill_s;
  row.queue_s = res.queue_s();
  row.ttft_s = ttft_seconds(hw, row.shared_s + row.disk_s + row.reload_s,
                            include_queue ? res.first_token_s - res.arrival_s : res.prefill_s);
  row.snapshots_kept = res.snapshots_kept;
  row.preemptions = res.preemptions;
}

}  // namespace radixtier::sim::detail
