// The oracle (see oracle_cache.hpp).
#include "sim/oracle_cache.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "radixtier/cache/block_hash.hpp"
#include "sim/cost_executor.hpp"

namespace radixtier::sim {

namespace {

constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

// The first use after `t` in a sorted list of request indices (kNever: none).
std::uint64_t next_use(const std::vector<std::uint32_t>& uses, std::size_t t) {
  auto it = std::upper_bound(uses.begin(), uses.end(), t);
  return it == uses.end() ? kNever : *it;
}

}  // namespace

OracleTrace oracle_trace(std::span<const TraceRequest> trace, TracePrompts& prompts,
                         std::uint32_t page_size) {
  OracleTrace out;
  out.page_size = std::max<std::uint32_t>(1, page_size);
  const std::uint32_t ps = out.page_size;
  out.pages.resize(trace.size());
  out.cap_pages.resize(trace.size());
  out.input_tokens.resize(trace.size());
  for (std::size_t i = 0; i < trace.size(); ++i) {
    std::vector<Token> seq = prompts.prompt(i);
    out.input_tokens[i] = trace[i].input_length;
    out.cap_pages[i] = seq.empty() ? 0 : static_cast<std::uint32_t>((seq.size() - 1) / ps);
    const std::uint64_t n_out = trace[i].output_length;
    if (n_out > 1) seq = CostExecutor::continuation(std::move(seq), n_out - 1);
    out.pages[i] = block_hashes(seq, ps);
  }
  return out;
}

OracleStats run_oracle(const OracleTrace& t, std::uint64_t capacity_bytes, std::uint64_t page_bytes,
                       std::uint64_t snapshot_bytes) {
  const bool free_snapshots = snapshot_bytes == 0;
  const std::size_t n = t.pages.size();
  const std::uint64_t ps = t.page_size;
  OracleStats st;
  st.hit_tokens.assign(n, 0);

  // Dense ids, each page's depth and parent, its uses (requests with it within their cap)
  // and its snapshot uses (requests whose resume target it is), in request order.
  constexpr std::uint32_t kRoot = std::numeric_limits<std::uint32_t>::max();
  std::unordered_map<std::uint64_t, std::uint32_t> id_of;
  std::vector<std::vector<std::uint32_t>> seq(n);
  std::vector<std::uint32_t> depth, parent;
  std::vector<std::vector<std::uint32_t>> page_uses, snap_uses;
  std::vector<std::uint8_t> seen;
  std::vector<std::int64_t> target(n, -1);  // id of request i's resume page (-1: none)
  for (std::size_t i = 0; i < n; ++i) {
    seq[i].reserve(t.pages[i].size());
    for (std::size_t k = 0; k < t.pages[i].size(); ++k) {
      auto [it, fresh] = id_of.try_emplace(t.pages[i][k], static_cast<std::uint32_t>(depth.size()));
      if (fresh) {
        depth.push_back(static_cast<std::uint32_t>(k + 1));
        parent.push_back(k == 0 ? kRoot : seq[i][k - 1]);
        page_uses.emplace_back();
        snap_uses.emplace_back();
        seen.push_back(0);
      }
      seq[i].push_back(it->second);
    }
    const std::size_t cap = std::min<std::size_t>(t.cap_pages[i], seq[i].size());
    std::size_t d = 0;
    while (d < cap && seen[seq[i][d]] != 0) ++d;
    for (std::size_t k = 0; k < cap; ++k) {
      page_uses[seq[i][k]].push_back(static_cast<std::uint32_t>(i));
    }
    if (d > 0) {
      target[i] = seq[i][d - 1];
      snap_uses[seq[i][d - 1]].push_back(static_cast<std::uint32_t>(i));
    }
    st.reusable_tokens += d * ps;
    for (std::size_t k = cap; k < seq[i].size(); ++k) st.pages_past_cap += seen[seq[i][k]];
    for (std::uint32_t id : seq[i]) seen[id] = 1;
  }

  // The eviction candidates. Pages: resident leaves without a snapshot (evicting one keeps the
  // resident pages prefix-closed and destroys no snapshot), ordered by (next use, depth).
  // Snapshots: by next use within buckets of depth (a factor 2^(1/8) each), so the highest
  // priced one is among the buckets' last ones.
  using PageKey = std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>;  // next, depth, id
  using SnapKey = std::pair<std::uint64_t, std::uint32_t>;                  // next, id
  const std::size_t ids = depth.size();
  std::set<PageKey> leaves;
  std::vector<std::set<SnapKey>> snaps;
  auto bucket = [](std::uint32_t d) {
    return static_cast<std::size_t>(8 * std::log2(static_cast<double>(d)));
  };
  std::vector<std::uint64_t> page_next(ids, 0), snap_next(ids, 0);
  std::vector<std::uint32_t> children(ids, 0);  // resident children
  std::vector<std::uint8_t> resident(ids, 0), has_snap(ids, 0);
  std::uint64_t used = 0;
  auto candidate = [&](std::uint32_t id) {
    return resident[id] != 0 && children[id] == 0 && has_snap[id] == 0;
  };
  auto add_snapshot = [&](std::uint32_t id, std::uint64_t next) {
    if (candidate(id)) leaves.erase({page_next[id], depth[id], id});
    has_snap[id] = 1;
    snap_next[id] = next;
    const std::size_t b = bucket(depth[id]);
    if (snaps.size() <= b) snaps.resize(b + 1);
    snaps[b].insert({next, id});
    used += snapshot_bytes;
  };
  auto drop_snapshot = [&](std::uint32_t id) {
    snaps[bucket(depth[id])].erase({snap_next[id], id});
    has_snap[id] = 0;
    used -= snapshot_bytes;
    ++st.snapshot_evictions;
    if (candidate(id)) leaves.insert({page_next[id], depth[id], id});
  };
  // Bytes held until the next use, per token that use resumes: a page makes its own page_size
  // tokens resumable, a snapshot its whole depth. Never used again: infinite.
  auto price = [&](std::uint64_t next, std::size_t now, std::uint64_t bytes, std::uint64_t tokens) {
    if (next == kNever) return std::numeric_limits<double>::infinity();
    return static_cast<double>(next - now) * static_cast<double>(bytes) /
           static_cast<double>(tokens);
  };

  for (std::size_t i = 0; i < n; ++i) {
    st.input_tokens += t.input_tokens[i];
    // The hit: the deepest resumable boundary of the leading resident run.
    const std::size_t cap = std::min<std::size_t>(t.cap_pages[i], seq[i].size());
    std::size_t b = 0;
    for (std::size_t k = 0; k < cap && resident[seq[i][k]] != 0; ++k) {
      if (free_snapshots || has_snap[seq[i][k]] != 0) b = k + 1;
    }
    st.hit_tokens[i] = b * ps;
    st.hits += b * ps;

    // Every page of the sequence becomes resident (or gets its next use), root first.
    for (std::uint32_t id : seq[i]) {
      const std::uint64_t next = next_use(page_uses[id], i);
      if (resident[id] != 0) {
        if (next == page_next[id]) continue;
        const bool was = candidate(id);
        if (was) leaves.erase({page_next[id], depth[id], id});
        page_next[id] = next;
        if (was) leaves.insert({next, depth[id], id});
        continue;
      }
      resident[id] = 1;
      used += page_bytes;
      page_next[id] = next;
      if (parent[id] != kRoot) {
        const std::uint32_t up = parent[id];
        if (candidate(up)) leaves.erase({page_next[up], depth[up], up});
        ++children[up];
      }
      leaves.insert({next, depth[id], id});
    }
    if (!free_snapshots) {
      // The snapshot this request resumed from (its target) moves to its next use.
      if (target[i] >= 0) {
        const auto id = static_cast<std::uint32_t>(target[i]);
        if (has_snap[id] != 0) {
          snaps[bucket(depth[id])].erase({snap_next[id], id});
          snap_next[id] = next_use(snap_uses[id], i);
          snaps[bucket(depth[id])].insert({snap_next[id], id});
        }
      }
      // A snapshot at each boundary the request computed (past its hit) that a later request
      // resumes from.
      for (std::size_t k = b; k < seq[i].size(); ++k) {
        const std::uint32_t id = seq[i][k];
        if (has_snap[id] != 0 || snap_uses[id].empty()) continue;
        const std::uint64_t next = next_use(snap_uses[id], i);
        if (next == kNever) continue;
        add_snapshot(id, next);
        ++st.snapshots_placed;
      }
    }

    // Belady: evict the farthest use, priced by bytes per token resumed.
    while (used > capacity_bytes) {
      double best = -1;
      std::uint32_t snap_victim = kRoot;
      for (const auto& set : snaps) {
        if (set.empty()) continue;
        const auto& [next, id] = *set.rbegin();
        const double p = price(next, i, snapshot_bytes, std::uint64_t{depth[id]} * ps);
        if (p > best) {
          best = p;
          snap_victim = id;
        }
      }
      if (!leaves.empty()) {
        const auto [next, d, id] = *leaves.rbegin();  // a copy: the element is erased below
        const double p = price(next, i, page_bytes, ps);
        if (snap_victim == kRoot || p >= best) {
          leaves.erase(std::prev(leaves.end()));
          resident[id] = 0;
          used -= page_bytes;
          ++st.page_evictions;
          if (parent[id] != kRoot && --children[parent[id]] == 0 && candidate(parent[id])) {
            leaves.insert({page_next[parent[id]], depth[parent[id]], parent[id]});
          }
          continue;
        }
      }
      if (snap_victim == kRoot) break;  // nothing resident
      drop_snapshot(snap_victim);
    }
    st.peak_bytes = std::max(st.peak_bytes, used);
  }
  return st;
}

}  // namespace radixtier::sim
