// The SimResult as one JSON object (to_json): its fields, the config, the miss breakdown,
// the restart's report, the shared tier and the fresh instance and, on request, the
// per-request rows.
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "sim/simulator.hpp"

namespace radixtier::sim {

namespace {

/// The value printed with 6 significant digits, as the JSON always carried it.
double num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return std::strtod(buf, nullptr);
}

}  // namespace

std::string to_json(const SimResult& r, bool rows) {
  nlohmann::ordered_json o;
  o["scenario"] = r.scenario;
  o["cache"] = r.cache;
  o["model"] = r.model;
  o["hardware"] = r.hardware;
  o["policy"] = r.policy;
  o["eviction"] = r.eviction;
  o["requests"] = r.requests;
  o["failed"] = r.failed;
  o["input_tokens"] = r.input_tokens;
  o["cached_tokens"] = r.cached_tokens;
  o["hit_ratio"] = num(r.hit_ratio);
  o["recomputed_tokens"] = r.recomputed_tokens;
  o["ttft_s_total"] = num(r.ttft_s_total);
  o["ttft_s_last"] = num(r.ttft_s_last);
  o["floor_s_last"] = num(r.floor_s_last);
  o["cached_tokens_last"] = r.cached_tokens_last;
  o["recomputed_tokens_last"] = r.recomputed_tokens_last;
  o["bytes_h2d"] = r.bytes_h2d;
  o["bytes_d2h"] = r.bytes_d2h;
  o["host_bytes_peak"] = r.host_bytes_peak;
  o["snapshots_kept"] = r.snapshots_kept;
  o["total_budget_bytes"] = r.total_budget_bytes;
  o["ceiling_ratio"] = num(r.ceiling_ratio);
  if (!r.trace_construction.empty()) {
    o["ceiling_blocks_ratio"] = num(r.ceiling_blocks_ratio);
    o["trace_construction"] = r.trace_construction;
    o["trace_with_parent"] = r.trace_with_parent;
  }
  if (r.cache == "oracle") {
    o["oracle_bound_ratio"] = num(r.oracle_bound_ratio);
    o["oracle_page_ceiling_ratio"] = num(r.oracle_page_ceiling_ratio);
    o["oracle_pages_past_cap"] = r.oracle_pages_past_cap;
  }
  o["sim_clock_s"] = num(r.sim_clock_s);
  o["clock_span_ratio"] = num(r.clock_span_ratio);
  o["overrun"] = r.overrun;
  o["wall_s"] = num(r.wall_s);
  nlohmann::ordered_json& c = o["config"];
  c["page_size"] = r.config.page_size;
  c["gpu_pages"] = r.config.gpu_pages;
  c["host_pages"] = r.config.host_pages;
  c["gpu_snapshot_slots"] = r.config.gpu_snapshot_slots;
  c["host_snapshot_slots"] = r.config.host_snapshot_slots;
  c["page_bytes"] = r.config.page_bytes;
  c["snapshot_bytes"] = r.config.snapshot_bytes;
  c["kv_bytes_per_token"] = r.config.page_size == 0 ? 0 : r.config.page_bytes / r.config.page_size;
  o["snapshots_dropped"] = r.stats.snapshots_dropped;
  o["preemptions"] = r.sched.preemptions;
  o["snapshot_slot_misses"] = r.sched.snapshot_slot_misses;
  o["snapshots_captured"] = r.sched.snapshots_captured;
  o["alloc_copy_waits"] = r.stats.alloc_copy_waits;
  o["alloc_wait_bytes"] = r.stats.alloc_wait_bytes;
  o["copy_wait_s"] = num(r.sched.copy_wait_s);
  o["background_evictions"] = r.stats.background_evictions;
  o["frontier_resumes"] = r.stats.frontier_resumes;
  o["spent_resumes"] = r.stats.spent_resumes;
  o["disk_bytes"] = r.disk_bytes;
  o["bytes_to_store"] = r.stats.bytes_to_store;
  o["bytes_from_store"] = r.stats.bytes_from_store;
  o["store_writes"] = r.stats.store_writes;
  o["store_reads"] = r.stats.store_reads;
  o["kv_pages_stored"] = r.stats.kv_pages_stored;
  o["kv_pages_loaded"] = r.stats.kv_pages_loaded;
  o["snapshots_stored"] = r.stats.snapshots_stored;
  o["snapshots_loaded"] = r.stats.snapshots_loaded;
  o["kv_pages_dropped_store"] = r.stats.kv_pages_dropped_store;
  o["store_records_lost"] = r.stats.store_records_lost;
  o["store_failures"] = r.stats.store_failures;
  o["store_copy_waits"] = r.stats.store_copy_waits;
  o["store_wait_bytes"] = r.stats.store_wait_bytes;
  o["store_wait_s"] = num(r.sched.store_wait_s);
  o["restored_kv_pages"] = r.stats.restored_kv_pages;
  o["restored_snapshots"] = r.stats.restored_snapshots;
  o["hit_tokens_store"] = r.stats.hit_tokens_store;
  o["store_records"] = r.store_records;
  o["store_syncs"] = r.store_syncs;
  o["instances"] = r.instances;
  o["router"] = r.router;
  o["utilization"] = num(r.utilization);
  o["busy_utilization"] = num(r.busy_utilization);
  o["ttft_s_p50"] = num(r.ttft_s_p50);
  o["ttft_s_p90"] = num(r.ttft_s_p90);
  o["ttft_s_p99"] = num(r.ttft_s_p99);
  o["gpu_kv_share"] = num(r.gpu_kv_share);
  o["gpu_snapshot_share"] = num(r.gpu_snapshot_share);
  o["placement_alignment"] = r.placement_alignment;
  o["keep_finish"] = r.keep_finish;
  {
    const char* names[] = {"prompt_end", "tail", "chunk", "finish", "branch"};
    nlohmann::ordered_json credits;
    for (std::size_t k = 0; k < r.placement_credits.size(); ++k) {
      credits[names[k]] = r.placement_credits[k];
    }
    o["placement_credits"] = credits;
    o["keep_prompt_end"] = r.keep_kinds[0];
    o["keep_tail"] = r.keep_kinds[1];
    o["keep_chunks"] = r.keep_kinds[2];
  }
  nlohmann::ordered_json& mb = o["misses"];
  mb["reachable_tokens"] = r.misses.reachable_tokens;
  mb["cached_tokens"] = r.misses.cached_tokens;
  mb["no_snapshot_placed"] = r.misses.no_snapshot_placed;
  mb["no_snapshot_tail"] = r.misses.no_snapshot_tail;
  mb["no_snapshot_branch"] = r.misses.no_snapshot_branch;
  mb["no_snapshot_divergence"] = r.misses.no_snapshot_divergence;
  mb["kv_missing"] = r.misses.kv_missing;
  mb["snapshot_missing"] = r.misses.snapshot_missing;
  if (r.restart.ran) {
    nlohmann::ordered_json& x = o["restart"];
    x["request"] = r.restart.request;
    x["cached_tokens"] = r.restart.cached_tokens;
    x["cached_tokens_no_restart"] = r.restart.cached_tokens_no_restart;
    x["reuse_ratio"] = num(r.restart.reuse_ratio);
    x["ttft_s"] = num(r.restart.ttft_s);
    x["ttft_s_no_restart"] = num(r.restart.ttft_s_no_restart);
    x["disk_floor_s"] = num(r.restart.disk_floor_s);
    x["ttft_ratio"] = num(r.restart.ttft_ratio);
    x["bytes_from_store"] = r.restart.bytes_from_store;
    x["store_reads"] = r.restart.store_reads;
    x["persist_bytes"] = r.restart.persist_bytes;
    x["persist_writes"] = r.restart.persist_writes;
    x["persist_s"] = num(r.restart.persist_s);
  }
  {
    // The shared tier (zeros without one: capacity_bytes 0).
    const SharedTierCounters& k = r.shared.counters;
    nlohmann::ordered_json& x = o["shared"];
    x["capacity_bytes"] = r.shared.capacity_bytes;
    x["shards"] = r.shared.shards;
    x["bandwidth"] = num(r.shared.bandwidth);
    x["latency_s"] = num(r.shared.latency_s);
    x["probes"] = k.probes;
    x["candidates"] = k.candidates;
    x["fetches"] = k.fetches;
    x["import_failures"] = k.import_failures;
    x["fetched_tokens"] = k.fetched_tokens;
    x["fetched_bytes"] = k.fetched_bytes;
    x["fetched_kv_pages"] = k.fetched_kv_pages;
    x["fetched_snapshots"] = k.fetched_snapshots;
    x["wait_s"] = num(k.wait_s);
    x["published_kv_pages"] = k.published_kv_pages;
    x["published_snapshots"] = k.published_snapshots;
    x["publish_touches"] = k.publish_touches;
    x["evicted_entries"] = k.evicted_entries;
    x["pending_queued"] = k.pending_queued;
    x["pending_dropped"] = k.pending_dropped;
    x["pending_given_up"] = k.pending_given_up;
    x["entries"] = k.entries;
    x["bytes"] = k.bytes;
    x["peak_bytes"] = k.peak_bytes;
  }
  if (r.fresh.ran) {
    nlohmann::ordered_json& x = o["fresh"];
    x["restart_request"] = r.fresh.restart_request;
    x["restart_s"] = num(r.fresh.restart_s);
    x["fresh_requests"] = r.fresh.fresh_requests;
    x["warm_requests"] = r.fresh.warm_requests;
    x["fresh_hit_ratio"] = num(r.fresh.fresh_hit_ratio);
    x["warm_hit_ratio"] = num(r.fresh.warm_hit_ratio);
    x["ratio"] = num(r.fresh.ratio);
    x["same_warm_hit_ratio"] = num(r.fresh.same_warm_hit_ratio);
    x["same_ratio"] = num(r.fresh.same_ratio);
  }
  o["status"] = r.status;
  if (rows) {
    nlohmann::ordered_json& list = o["rows"] = nlohmann::ordered_json::array();
    for (const RequestRow& w : r.rows) {
      nlohmann::ordered_json& x = list.emplace_back();
      x["label"] = w.label;
      x["ok"] = w.ok;
      x["prompt_tokens"] = w.prompt_tokens;
      x["output_tokens"] = w.output_tokens;
      x["cached_tokens"] = w.cached_tokens;
      x["host_cached_tokens"] = w.host_cached_tokens;
      x["recomputed_tokens"] = w.recomputed_tokens;
      x["reusable_tokens"] = w.reusable_tokens;
      x["bytes_h2d"] = w.bytes_h2d;
      x["reload_s"] = num(w.reload_s);
      x["prefill_s"] = num(w.prefill_s);
      x["queue_s"] = num(w.queue_s);
      x["ttft_s"] = num(w.ttft_s);
      x["floor_s"] = num(w.floor_s);
      x["store_cached_tokens"] = w.store_cached_tokens;
      x["bytes_from_store"] = w.bytes_from_store;
      x["store_reads"] = w.store_reads;
      x["disk_s"] = num(w.disk_s);
      x["shared_tokens"] = w.shared_tokens;
      x["shared_bytes"] = w.shared_bytes;
      x["shared_s"] = num(w.shared_s);
      x["disk_floor_s"] = num(w.disk_floor_s);
      x["snapshots_kept"] = w.snapshots_kept;
      x["error"] = w.error;
    }
  }
  return o.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace radixtier::sim
