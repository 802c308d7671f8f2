// The simulator's shared tier (shared_tier_model.hpp): the content LRU, and per instance the
// hook that looks up and fetches before an admission and publishes after a finish.
#include "sim/shared_tier_model.hpp"

#include <algorithm>
#include <utility>

#include "radixtier/shared/fetch_plan.hpp"

namespace radixtier::sim {

std::size_t SharedTierModel::KeyHash::operator()(const Key& k) const {
  // The path hash is already uniform; fold in the namespace and the kind.
  return static_cast<std::size_t>(k.path.lo ^ (k.path.hi * 0x9e3779b97f4a7c15ull) ^
                                  (std::uint64_t{k.ns} << 8) ^ static_cast<std::uint64_t>(k.kind));
}

/// One instance's side of the shared tier: a SharedHook over its cache.
class SharedTierModel::Client final : public sched::SharedHook {
 public:
  Client(SharedTierModel& model, PrefixCache& cache) : model_(model), cache_(cache) {}

  sched::SharedFetch before_admit(sched::RequestId, std::span<const Token> prompt,
                                  NamespaceId ns) override {
    retry_pending();
    return lookup(prompt, ns);
  }

  void after_finish(sched::RequestId, std::span<const Token> tokens, NamespaceId ns) override {
    retry_pending();
    if (publish(tokens, ns)) return;
    // Host copies of the last insert are still on their way: retry at later calls.
    SharedTierCounters& c = model_.counters_;
    ++c.pending_queued;
    if (pending_.size() >= model_.options_.pending_per_instance) {
      pending_.pop_front();
      ++c.pending_dropped;
    }
    pending_.push_back({std::vector<Token>(tokens.begin(), tokens.end()), ns, 0});
  }

 private:
  struct Pending {
    std::vector<Token> tokens;
    NamespaceId ns;
    std::size_t retries = 0;
  };

  sched::SharedFetch lookup(std::span<const Token> prompt, NamespaceId ns) {
    const SharedTierOptions& o = model_.options_;
    SharedTierCounters& c = model_.counters_;
    auto match = cache_.peek(prompt, ns);
    if (!match) return {};
    shared::FetchPlanInput in;
    in.page_size = o.page_size;
    in.prompt_tokens = prompt.size();
    in.resume_tokens = match->usable_tokens;
    in.kv_tokens = match->kv_tokens;
    in.page_bytes = o.page_bytes;
    in.snapshot_bytes = o.snapshot_bytes;
    in.bandwidth = o.bandwidth;
    in.latency_s = o.latency_s;
    in.recompute_s = o.recompute_s;
    const shared::ProbeRange range = shared::probe_range(in, o.min_tokens, o.max_pages);
    if (range.empty()) return {};
    ++c.probes;
    sched::SharedFetch out;
    out.seconds = o.latency_s;  // the probe's round trip
    const std::vector<PathHash> h = page_path_hashes(prompt, o.page_size, range.end_page);
    std::vector<bool> kv(range.end_page - std::min(range.first_kv_page, range.end_page));
    for (std::size_t i = 0; i < kv.size(); ++i) {
      kv[i] = model_.contains(ns, h[range.first_kv_page + i + 1], Kind::kKvPage);
    }
    std::vector<bool> snap(range.end_page - range.first_snapshot_page);
    for (std::size_t j = 0; j < snap.size(); ++j) {
      snap[j] = model_.contains(ns, h[range.first_snapshot_page + 1 + j], Kind::kSnapshot);
    }
    const auto candidates = shared::plan_fetch(in, range, kv, snap);
    if (candidates.empty()) {
      c.wait_s += out.seconds;
      return out;
    }
    ++c.candidates;
    const shared::FetchCandidate& best = candidates.front();
    const std::size_t boundary = best.boundary_page * o.page_size;
    auto imported = cache_.import_host(
        prompt.first(boundary), ns,
        [](std::size_t, std::span<const HostPageId>, std::span<const HostPageId>) { return true; });
    if (!imported) {
      ++c.import_failures;
      c.wait_s += out.seconds;
      return out;
    }
    // What arrived: the pages the tree lacked and the snapshot unless it had one.
    for (std::size_t p = best.first_kv_page; p < best.boundary_page; ++p) {
      model_.touch({ns.value(), Kind::kKvPage, h[p + 1]});
    }
    model_.touch({ns.value(), Kind::kSnapshot, h[best.boundary_page]});
    const std::uint64_t bytes = std::uint64_t{imported->kv_pages} * o.page_bytes +
                                (imported->snapshot ? o.snapshot_bytes : 0);
    out.tokens = boundary;
    out.bytes = bytes;
    out.seconds += o.latency_s + (o.bandwidth > 0 ? static_cast<double>(bytes) / o.bandwidth : 0);
    ++c.fetches;
    c.fetched_tokens += boundary - std::min(boundary, match->usable_tokens);
    c.fetched_bytes += bytes;
    c.fetched_kv_pages += imported->kv_pages;
    c.fetched_snapshots += imported->snapshot ? 1 : 0;
    c.wait_s += out.seconds;
    return out;
  }

  /// Publishes what has host copies; true when they cover every whole page of `tokens`.
  bool publish(std::span<const Token> tokens, NamespaceId ns) {
    const SharedTierOptions& o = model_.options_;
    SharedTierCounters& c = model_.counters_;
    const HostCopies hc = cache_.host_copies(tokens, ns);
    const std::size_t deepest = hc.snapshots.empty() ? 0 : hc.snapshots.back().boundary;
    const std::size_t pages = deepest / o.page_size;  // KV with a snapshot at or below it
    std::size_t reached = 0;                          // pages the content holds from the root
    if (pages > 0) {
      const std::vector<PathHash> h = page_path_hashes(tokens, o.page_size, pages);
      auto snap = hc.snapshots.begin();
      for (std::size_t p = 0; p < pages; ++p) {  // parents first
        const Key key{ns.value(), Kind::kKvPage, h[p + 1]};
        if (hc.kv[p].valid()) {
          count(model_.put(key, o.page_bytes), c.published_kv_pages);
        } else if (model_.contains(ns, h[p + 1], Kind::kKvPage)) {
          model_.touch(key);  // published before, its host copy gone: the content has it
          ++c.publish_touches;
        } else {
          break;  // nothing deeper is reachable, so nothing deeper goes (as the real tier's job)
        }
        for (; snap != hc.snapshots.end() && snap->boundary == (p + 1) * o.page_size; ++snap) {
          count(model_.put({ns.value(), Kind::kSnapshot, h[p + 1]}, o.snapshot_bytes),
                c.published_snapshots);
        }
        reached = p + 1;
      }
    }
    cache_.mark_published(tokens.first(reached * o.page_size), ns);
    return hc.kv.size() >= tokens.size() / o.page_size;
  }

  void count(Put put, std::uint64_t& published) {
    if (put == Put::kNew) ++published;
    if (put == Put::kTouched) ++model_.counters_.publish_touches;
  }

  void retry_pending() {
    SharedTierCounters& c = model_.counters_;
    for (std::size_t k = pending_.size(); k > 0; --k) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      if (publish(p.tokens, p.ns)) continue;
      if (++p.retries >= model_.options_.pending_retries) {
        ++c.pending_given_up;
        continue;
      }
      pending_.push_back(std::move(p));
    }
  }

  SharedTierModel& model_;
  PrefixCache& cache_;
  std::deque<Pending> pending_;
};

SharedTierModel::SharedTierModel(SharedTierOptions options) : options_(std::move(options)) {}

SharedTierModel::~SharedTierModel() = default;

sched::SharedHook& SharedTierModel::attach(std::size_t instance, PrefixCache& cache) {
  if (clients_.size() <= instance) clients_.resize(instance + 1);
  clients_[instance] = std::make_unique<Client>(*this, cache);
  return *clients_[instance];
}

bool SharedTierModel::contains(NamespaceId ns, const PathHash& path, Kind kind) const {
  return index_.contains({ns.value(), kind, path});
}

SharedTierModel::Put SharedTierModel::put(const Key& key, std::uint64_t bytes) {
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return Put::kTouched;
  }
  if (bytes > options_.capacity_bytes) return Put::kTooLarge;  // never fits
  lru_.push_front({key, bytes});
  index_.emplace(key, lru_.begin());
  counters_.bytes += bytes;
  ++counters_.entries;
  while (counters_.bytes > options_.capacity_bytes) {
    const Entry& victim = lru_.back();
    counters_.bytes -= victim.bytes;
    --counters_.entries;
    ++counters_.evicted_entries;
    index_.erase(victim.key);
    lru_.pop_back();
  }
  counters_.peak_bytes = std::max(counters_.peak_bytes, counters_.bytes);
  return Put::kNew;
}

void SharedTierModel::touch(const Key& key) {
  if (auto it = index_.find(key); it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second);
}

}  // namespace radixtier::sim
