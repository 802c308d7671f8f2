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
    const std::size_t cached = st.hit_tokens[i];
    // A hit reloads its KV and the snapshot it resumes from (one more copy).
    const std::uint64_t bytes =
        cached * m.kv_bytes_per_token() + (cached > 0 ? m.snapshot_bytes() : 0);
    out.rows.push_back(offline_row(s.trace[i], i, cached, bytes, cached > 0 ? 1 : 0, hw));
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
