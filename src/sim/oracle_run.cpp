// The oracle's run (cache 'oracle', traces only): the headroom column, run_oracle() with the
// cluster's total bytes as one pool (as the ideal's), strictly in order and without time, on
// the trace's prompts as the replay builds them; beside it the same run with free snapshots,
// the attention-only bound (oracle_cache.hpp).
#include <string>
#include <utility>

#include "sim/oracle_cache.hpp"
#include "sim/simulator_internal.hpp"
#include "sim/trace_replay.hpp"

namespace radixtier::sim::detail {

Result<SimResult> simulate_oracle(const Scenario& s, const ModelGeometry& m,
                                  const HardwarePreset& hw, SimResult out) {
  if (!s.is_trace()) {
    return invalid_argument("cache 'oracle' is the trace's headroom column: scenario '" + s.name +
                            "' is not a trace");
  }
  TracePrompts prompts(s.trace, s.trace_parents.get());
  const OracleTrace pages = oracle_trace(s.trace, prompts, s.page_size);
  const std::uint64_t capacity = out.instances * total_bytes(out.config);
  const std::uint64_t page_bytes = std::uint64_t{s.page_size} * m.kv_bytes_per_token();
  const OracleStats st = run_oracle(pages, capacity, page_bytes, m.snapshot_bytes());
  const OracleStats bound = run_oracle(pages, capacity, page_bytes, 0);
  out.rows.reserve(s.trace.size());
  for (std::size_t i = 0; i < s.trace.size(); ++i) {
    const TraceRequest& t = s.trace[i];
    RequestRow row;
    row.id = i + 1;
    row.label = "request " + std::to_string(i + 1);
    row.prompt_tokens = t.input_length;
    row.output_tokens = t.output_length;
    row.cached_tokens = st.hit_tokens[i];
    row.recomputed_tokens = row.prompt_tokens - row.cached_tokens;
    row.bytes_h2d = row.cached_tokens * m.kv_bytes_per_token() +
                    (row.cached_tokens > 0 ? m.snapshot_bytes() : 0);
    row.reload_s = reload_seconds(hw, row.cached_tokens > 0 ? 1 : 0, row.bytes_h2d);
    row.prefill_s = prefill_seconds(hw, static_cast<double>(row.cached_tokens),
                                    static_cast<double>(row.prompt_tokens));
    row.ttft_s = ttft_seconds(hw, row.reload_s, row.prefill_s);  // no queueing modeled
    out.rows.push_back(std::move(row));
  }
  out.policy = std::string("future-targets");
  out.eviction = std::string("belady-bytes");
  out.snapshots_kept = st.snapshots_placed;
  out.oracle_bound_ratio = bound.hit_ratio();
  out.oracle_page_ceiling_ratio = st.ceiling_ratio();
  out.oracle_pages_past_cap = st.pages_past_cap;
  finish_totals(out);
  return out;
}

}  // namespace radixtier::sim::detail
