// The shared tier's fetch decision (fetch_plan.hpp). Part of the core library: the simulator
// uses it without the Redis client.
#include "radixtier/shared/fetch_plan.hpp"

#include <algorithm>

namespace radixtier::shared {

ProbeRange probe_range(const FetchPlanInput& in, std::size_t min_tokens, std::size_t max_pages) {
  ProbeRange r;
  if (in.page_size == 0 || in.prompt_tokens == 0) return r;
  const std::size_t ps = in.page_size;
  const std::size_t last = (in.prompt_tokens - 1) / ps;  // pages admit() could resume after
  r.first_kv_page = in.kv_tokens / ps;
  r.first_snapshot_page = in.resume_tokens / ps;
  r.end_page = std::min(last, r.first_kv_page + max_pages);
  if (r.end_page * ps < in.resume_tokens + std::max<std::size_t>(min_tokens, 1)) {
    r.end_page = r.first_snapshot_page;  // not worth a round trip
  }
  return r;
}

std::vector<FetchCandidate> plan_fetch(const FetchPlanInput& in, const ProbeRange& range,
                                       const std::vector<bool>& kv_shared,
                                       const std::vector<bool>& snapshot_shared) {
  std::vector<FetchCandidate> out;
  if (range.empty()) return out;
  const std::size_t ps = in.page_size;
  // The KV pages shared contiguously from the local KV's end.
  std::size_t kv_end = range.first_kv_page;
  while (kv_end < range.end_page && kv_end - range.first_kv_page < kv_shared.size() &&
         kv_shared[kv_end - range.first_kv_page]) {
    ++kv_end;
  }
  for (std::size_t b = std::min(kv_end, range.end_page); b > range.first_snapshot_page; --b) {
    const std::size_t j = b - range.first_snapshot_page - 1;
    if (j >= snapshot_shared.size() || !snapshot_shared[j]) continue;
    FetchCandidate c;
    c.boundary_page = b;
    // A boundary inside the local KV needs only its snapshot (no KV page to fetch).
    c.first_kv_page = std::min(range.first_kv_page, b);
    c.bytes = std::uint64_t(b - c.first_kv_page) * in.page_bytes + in.snapshot_bytes;
    c.fetch_s = in.latency_s + (in.bandwidth > 0 ? double(c.bytes) / in.bandwidth : 0.0);
    c.recompute_s = in.recompute_s ? in.recompute_s(in.resume_tokens, b * ps) : 0.0;
    if (c.fetch_s < c.recompute_s) out.push_back(c);
  }
  return out;
}

}  // namespace radixtier::shared
