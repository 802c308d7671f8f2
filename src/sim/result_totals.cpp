// The run's totals: the SimResult's sums and last-request fields over its rows, the cache's
// total bytes, and cache and scheduler stats summed over instances and processes.
#include <algorithm>

#include "sim/simulator_internal.hpp"

namespace radixtier::sim::detail {

void finish_totals(SimResult& out) {
  for (const RequestRow& row : out.rows) {
    out.input_tokens += row.prompt_tokens;
    if (!row.ok) {
      ++out.failed;
      continue;
    }
    out.cached_tokens += row.cached_tokens;
    out.recomputed_tokens += row.recomputed_tokens;
    out.ttft_s_total += row.ttft_s;
  }
  out.requests = out.rows.size();
  out.hit_ratio = out.input_tokens == 0 ? 0.0
                                        : static_cast<double>(out.cached_tokens) /
                                              static_cast<double>(out.input_tokens);
  if (!out.rows.empty()) {
    const RequestRow& last = out.rows.back();
    out.ttft_s_last = last.ttft_s;
    out.floor_s_last = last.floor_s;
    out.cached_tokens_last = last.cached_tokens;
    out.recomputed_tokens_last = last.recomputed_tokens;
  }
}

std::uint64_t total_bytes(const CacheConfig& c) {
  return (std::uint64_t{c.gpu_pages} + c.host_pages) * c.page_bytes +
         (std::uint64_t{c.gpu_snapshot_slots} + c.host_snapshot_slots) * c.snapshot_bytes;
}

void add_stats(CacheStats& a, const CacheStats& b) {
  a.admissions += b.admissions;
  a.requested_tokens += b.requested_tokens;
  a.hit_tokens_gpu += b.hit_tokens_gpu;
  a.hit_tokens_host += b.hit_tokens_host;
  a.bytes_d2h += b.bytes_d2h;
  a.bytes_h2d += b.bytes_h2d;
  a.copies_d2h += b.copies_d2h;
  a.copies_h2d += b.copies_h2d;
  a.kv_pages_demoted += b.kv_pages_demoted;
  a.kv_pages_promoted += b.kv_pages_promoted;
  a.kv_pages_dropped_gpu += b.kv_pages_dropped_gpu;
  a.kv_pages_dropped_host += b.kv_pages_dropped_host;
  a.snapshots_demoted += b.snapshots_demoted;
  a.snapshots_promoted += b.snapshots_promoted;
  a.snapshots_dropped += b.snapshots_dropped;
  a.snapshots_inserted += b.snapshots_inserted;
  a.frontier_resumes += b.frontier_resumes;
  a.spent_resumes += b.spent_resumes;
  a.transfers_failed += b.transfers_failed;
  a.alloc_copy_waits += b.alloc_copy_waits;
  a.alloc_wait_bytes += b.alloc_wait_bytes;
  a.alloc_wait_copies += b.alloc_wait_copies;
  a.background_evictions += b.background_evictions;
  a.bytes_to_store += b.bytes_to_store;
  a.bytes_from_store += b.bytes_from_store;
  a.store_writes += b.store_writes;
  a.store_reads += b.store_reads;
  a.kv_pages_stored += b.kv_pages_stored;
  a.kv_pages_loaded += b.kv_pages_loaded;
  a.snapshots_stored += b.snapshots_stored;
  a.snapshots_loaded += b.snapshots_loaded;
  a.kv_pages_dropped_store += b.kv_pages_dropped_store;
  a.store_records_lost += b.store_records_lost;
  a.store_failures += b.store_failures;
  a.store_copy_waits += b.store_copy_waits;
  a.store_wait_bytes += b.store_wait_bytes;
  a.restored_kv_pages += b.restored_kv_pages;
  a.restored_snapshots += b.restored_snapshots;
  a.hit_tokens_store += b.hit_tokens_store;
  a.staged_loads += b.staged_loads;
  a.store_load_misses += b.store_load_misses;
  a.host_bytes_peak = std::max(a.host_bytes_peak, b.host_bytes_peak);  // per instance
}

void add_sched_stats(sched::SchedulerStats& a, const sched::SchedulerStats& b) {
  a.steps += b.steps;
  a.admissions += b.admissions;
  a.transfer_failures += b.transfer_failures;
  a.preemptions += b.preemptions;
  a.stalls += b.stalls;
  a.finished += b.finished;
  a.failed += b.failed;
  a.forwarded_tokens += b.forwarded_tokens;
  a.snapshots_offered += b.snapshots_offered;
  a.snapshots_kept += b.snapshots_kept;
  a.snapshot_slot_misses += b.snapshot_slot_misses;
  a.snapshots_captured += b.snapshots_captured;
  a.copy_wait_s += b.copy_wait_s;
  a.store_wait_s += b.store_wait_s;
}

}  // namespace radixtier::sim::detail
