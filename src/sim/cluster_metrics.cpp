// The cluster's load: request arrivals, the trace's offered load and span, the default
// instance count from modeled utilization, and a finished run's TTFT percentiles, utilization
// and clock overrun (see simulator.hpp, "Cluster").
#include <algorithm>
#include <cmath>
#include <vector>

#include "sim/simulator.hpp"
#include "sim/simulator_internal.hpp"

namespace radixtier::sim {

namespace detail {

double arrival_s(const Scenario& s, std::size_t i) {
  return s.is_trace() ? static_cast<double>(s.trace[i].timestamp_ms) / 1000.0
                      : s.requests[i].request.arrival_s;
}

}  // namespace detail

double offered_busy_seconds(const Scenario& s, const HardwarePreset& hw, double decode_step_s) {
  const double per_token =
      decode_step_s / static_cast<double>(std::max<std::size_t>(1, s.max_running));
  double busy = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double prompt = s.is_trace() ? static_cast<double>(s.trace[i].input_length)
                                       : static_cast<double>(s.requests[i].request.prompt.size());
    const std::size_t out =
        s.is_trace() ? s.trace[i].output_length : s.requests[i].request.max_new_tokens;
    busy += prefill_seconds(hw, 0, prompt) + static_cast<double>(out > 0 ? out - 1 : 0) * per_token;
  }
  return busy;
}

double trace_span_seconds(const Scenario& s) {
  return s.size() < 2 ? 0.0 : detail::arrival_s(s, s.size() - 1) - detail::arrival_s(s, 0);
}

std::size_t default_instances(const Scenario& s, const HardwarePreset& hw, double decode_step_s,
                              double target) {
  const double span = trace_span_seconds(s);
  if (span <= 0 || target <= 0) return 1;
  const double busy = offered_busy_seconds(s, hw, decode_step_s);
  // Clamped: a trace that would need more is overloaded at the most the simulator models,
  // and the replay says so (SimResult::overrun).
  const double want = std::ceil(busy / (target * span));
  if (!(want < static_cast<double>(kMaxInstances))) return kMaxInstances;
  auto n = static_cast<std::size_t>(std::max(1.0, want));
  while (n < kMaxInstances && busy / (static_cast<double>(n) * span) > target) ++n;
  return n;
}

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<std::size_t>(1, rank)) - 1];
}

}  // namespace

namespace detail {

void finish_cluster(SimResult& out, const Scenario& s, const HardwarePreset& hw, double decode_s,
                    double executor_s) {
  std::vector<double> ttft;
  for (const RequestRow& row : out.rows) {
    if (row.ok) ttft.push_back(row.ttft_s);
  }
  out.ttft_s_p50 = percentile(ttft, 0.50);
  out.ttft_s_p90 = percentile(ttft, 0.90);
  out.ttft_s_p99 = percentile(ttft, 0.99);
  const double span = trace_span_seconds(s);
  if (span > 0) {
    const double cap = static_cast<double>(out.instances) * span;
    out.utilization = offered_busy_seconds(s, hw, decode_s) / cap;
    out.busy_utilization = executor_s / cap;
    // The replay's clock against the trace's: a cluster too small for the trace finishes
    // late, and its hit ratios and TTFTs describe a queue, not the trace.
    if (out.sim_clock_s > 0) {  // the ideal runs without a clock
      out.clock_span_ratio = (out.sim_clock_s - arrival_s(s, 0)) / span;
      out.overrun = out.clock_span_ratio > kMaxClockOverrun;
    }
  }
}

}  // namespace detail

}  // namespace radixtier::sim
