// Internal to src/sim: the helpers simulate() (simulator.cpp) shares with the files it was
// split into: the per-request accounting, the totals over rows and instances, the cluster's
// metrics and the ideal's run. Not part of the simulator's interface (simulator.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/config.hpp"
#include "radixtier/scheduler/scheduler.hpp"
#include "sim/cost_model.hpp"
#include "sim/model_config.hpp"
#include "sim/scenarios.hpp"
#include "sim/simulator.hpp"

namespace radixtier::sim::detail {

// --- cluster_metrics.cpp ---
/// Request i's arrival (seconds): the trace's timestamp or the scenario request's arrival_s.
double arrival_s(const Scenario& s, std::size_t i);
/// The TTFT percentiles, the modeled and executor utilization and the clock overrun.
void finish_cluster(SimResult& out, const Scenario& s, const HardwarePreset& hw, double decode_s,
                    double executor_s);

// --- request_accounting.cpp ---
/// floor_seconds() with every reusable byte read from the preset's disk instead of moved over
/// PCIe: the floor of a request whose prefix survives only on the store (after a restart).
double disk_floor_seconds(const HardwarePreset& hw, const ModelGeometry& m, std::size_t reusable,
                          std::size_t prompt);
/// The TTFT floor: every reusable KV byte and one snapshot reloaded, the rest prefilled.
double floor_seconds(const HardwarePreset& hw, const ModelGeometry& m, std::size_t reusable,
                     std::size_t prompt);
/// A finished request's row from its scheduler result: tokens, the admission's transfers and
/// store reads, and its reload_s, disk_s, prefill_s, queue_s and TTFT.
void account_request(RequestRow& row, const sched::RequestResult& res, const HardwarePreset& hw,
                     bool include_queue);

// --- result_totals.cpp ---
/// The SimResult's totals, hit ratio and last-request fields from its rows.
void finish_totals(SimResult& out);
/// GPU KV + GPU snapshot slots + host KV + host snapshot slots, in bytes.
std::uint64_t total_bytes(const CacheConfig& c);
/// a += b (host_bytes_peak: the maximum, it is per instance).
void add_stats(CacheStats& a, const CacheStats& b);
/// a += b
void add_sched_stats(sched::SchedulerStats& a, const sched::SchedulerStats& b);

// --- ideal_run.cpp ---
/// Request i's row in a column that runs without time (the ideal, the oracle): it reused
/// `cached` tokens by copying `bytes_h2d` in `copies` calls; TTFT = t0 + reload + prefill.
RequestRow offline_row(const TraceRequest& t, std::size_t i, std::size_t cached,
                       std::uint64_t bytes_h2d, std::size_t copies, const HardwarePreset& hw);
/// The ideal's column (trace only): BlockLruIdeal with the same total bytes, no time.
Result<SimResult> simulate_ideal(const Scenario& s, const ModelGeometry& m,
                                 const HardwarePreset& hw, SimResult out);

// --- oracle_run.cpp ---
/// The oracle's column (trace only): run_oracle() with the same total bytes, no time.
Result<SimResult> simulate_oracle(const Scenario& s, const ModelGeometry& m,
                                  const HardwarePreset& hw, SimResult out);

}  // namespace radixtier::sim::detail
