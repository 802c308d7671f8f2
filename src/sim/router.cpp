// The cluster router (see router.hpp).
#include "sim/router.hpp"

#include <algorithm>
#include <cstdint>

namespace radixtier::sim {

const char* to_string(RouterKind kind) {
  switch (kind) {
    case RouterKind::kRoundRobin:
      return "round-robin";
    case RouterKind::kSession:
      return "session";
    case RouterKind::kPrefix:
      return "prefix";
  }
  return "?";
}

Result<RouterKind> parse_router_kind(std::string_view text) {
  for (RouterKind k : {RouterKind::kRoundRobin, RouterKind::kSession, RouterKind::kPrefix}) {
    if (text == to_string(k)) return k;
  }
  return invalid_argument("unknown router '" + std::string(text) +
                          "' (known: round-robin, session, prefix)");
}

Router::Router(RouterKind kind, std::size_t instances, std::uint64_t capacity_blocks,
               std::uint32_t page_size)
    : kind_(kind), n_(instances == 0 ? 1 : instances), page_size_(page_size) {
  if (kind_ == RouterKind::kPrefix) index_.assign(n_, BlockLruIdeal(capacity_blocks, page_size));
}

void Router::forget(std::size_t instance) {
  if (instance < index_.size()) {
    index_[instance] = BlockLruIdeal(index_[instance].capacity_blocks(), page_size_);
  }
}

std::size_t Router::least_loaded(std::span<const std::size_t> load) const {
  std::size_t best = 0;
  for (std::size_t i = 1; i < n_ && i < load.size(); ++i) {
    if (load[i] < load[best]) best = i;
  }
  return best;
}

std::size_t Router::smallest_tree(std::span<const std::size_t> load) const {
  // SGLang breaks ties in its map's order; the model breaks them by load, then by index.
  std::size_t best = 0;
  for (std::size_t i = 1; i < n_; ++i) {
    const std::size_t li = i < load.size() ? load[i] : 0;
    const std::size_t lb = best < load.size() ? load[best] : 0;
    if (index_[i].blocks() < index_[best].blocks() ||
        (index_[i].blocks() == index_[best].blocks() && li < lb)) {
      best = i;
    }
  }
  return best;
}

std::size_t Router::route(const TraceRequest& r, std::span<const std::size_t> load) {
  if (n_ == 1) {
    if (kind_ == RouterKind::kPrefix) index_[0].access(r);
    return 0;
  }
  switch (kind_) {
    case RouterKind::kRoundRobin:
      return next_++ % n_;
    case RouterKind::kSession: {
      if (r.hash_ids.empty()) return least_loaded(load);
      auto [it, fresh] = session_.try_emplace(r.hash_ids.front(), 0);
      if (fresh) it->second = least_loaded(load);
      return it->second;
    }
    case RouterKind::kPrefix: {
      // SGLang's cache-aware policy (sgl-router/src/policies/cache_aware.rs, select_worker, at
      // its CLI defaults): an imbalanced cluster routes to the least loaded instance; a
      // request whose best match covers at most cache_threshold of it goes to the instance
      // with the smallest tree (tree.rs, get_smallest_tenant); otherwise the best match.
      std::size_t lo = SIZE_MAX, hi = 0;
      for (std::size_t i = 0; i < n_ && i < load.size(); ++i) {
        lo = std::min(lo, load[i]);
        hi = std::max(hi, load[i]);
      }
      if (!load.empty() && hi - lo > kBalanceAbsThreshold &&
          static_cast<double>(hi) > static_cast<double>(lo) * kBalanceRelThreshold) {
        const std::size_t i = least_loaded(load);
        index_[i].access(r);
        return i;
      }
      std::size_t best = 0;
      std::uint64_t best_match = index_[0].leading_blocks(r);
      for (std::size_t i = 1; i < n_; ++i) {
        const std::uint64_t m = index_[i].leading_blocks(r);
        const std::size_t li = i < load.size() ? load[i] : 0;
        const std::size_t lb = best < load.size() ? load[best] : 0;
        if (m > best_match || (m == best_match && li < lb)) {
          best = i;
          best_match = m;
        }
      }
      if (!r.hash_ids.empty() && static_cast<double>(best_match) <=
                                     kCacheThreshold * static_cast<double>(r.hash_ids.size())) {
        best = smallest_tree(load);
      }
      index_[best].access(r);
      return best;
    }
  }
  return 0;
}

}  // namespace radixtier::sim
