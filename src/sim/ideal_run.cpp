// The ideal's run (cache 'ideal', traces only): the reference column, BlockLruIdeal with the
// same total bytes as the other caches, strictly in order and without time.
#include <string>
#include <utility>

#include "sim/block_lru_ideal.hpp"
#include "sim/simulator_internal.hpp"

namespace radixtier::sim::detail {

RequestRow offline_row(const TraceRequest& t, std::size_t i, std::size_t cached,
                       std::uint64_t bytes_h2d, std::size_t copies, const HardwarePreset& hw) {
  RequestRow row;
  row.id = i + 1;
  row.label = "request " + std::to_string(i + 1);
  row.prompt_tokens = t.input_length;
  row.output_tokens = t.output_length;
  row.cached_tokens = cached;
  row.recomputed_tokens = row.prompt_tokens - row.cached_tokens;
  row.bytes_h2d = bytes_h2d;
  row.reload_s = reload_seconds(hw, copies, row.bytes_h2d);
  row.prefill_s = prefill_seconds(hw, static_cast<double>(row.cached_tokens),
                                  static_cast<double>(row.prompt_tokens));
  row.ttft_s = ttft_seconds(hw, row.reload_s, row.prefill_s);  // no queueing modeled
  return row;
}

Result<SimResult> simulate_ideal(const Scenario& s, const ModelGeometry& m,
                                 const HardwarePreset& hw, SimResult out) {
  if (!s.is_trace()) {
    return invalid_argument("cache 'ideal' is the trace's reference column: scenario '" + s.name +
                            "' is not a trace");
  }
  BlockLruIdeal ideal(out.instances * total_bytes(out.config) /
                          (std::uint64_t{kTraceBlockTokens} * m.kv_bytes_per_token()),
                      s.page_size);
  out.rows.reserve(s.trace.size());
  for (std::size_t i = 0; i < s.trace.size(); ++i) {
    const std::size_t cached = ideal.access(s.trace[i]);
    out.rows.push_back(offline_row(s.trace[i], i, cached, cached * m.kv_bytes_per_token(), 0, hw));
  }
  out.policy = std::string(1, '-');
  out.eviction = std::string("lru-blocks");
  finish_totals(out);
  return out;
}

}  // namespace radixtier::sim::detail
