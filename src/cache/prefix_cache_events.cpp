// KV events (events.hpp): refresh() calls emit_changes() after every state change of a node
// while a sink is attached, so the stream follows each node's usable residency exactly (what
// inspect() reports: the destination of a copy in flight is not usable yet).
#include <algorithm>

#include "radixtier/cache/block_hash.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

namespace {
constexpr std::uint8_t kOnGpu = 1, kOnHost = 2, kOnStore = 4;
constexpr std::uint8_t kMedia[] = {kOnGpu, kOnHost, kOnStore};

// Every row a request could resume from, as vLLM's media: GPU, CPU (host) and STORAGE (the
// store tier). A store record exists only once its write finished (store_pages and
// store_snapshot are set on completion), so the store row needs no in-flight check.
std::uint8_t usable_kv(const Node& n) {
  return std::uint8_t((n.gpu.has_kv() && !n.kv_to_gpu() ? kOnGpu : 0) |
                      (n.host.has_kv() && !n.kv_to_host() ? kOnHost : 0) |
                      (n.store.has_kv() ? kOnStore : 0));
}

std::uint8_t usable_snapshot(const Node& n) {
  return std::uint8_t((n.gpu.has_snapshot() && !n.snap_to_gpu() ? kOnGpu : 0) |
                      (n.host.has_snapshot() && !n.snap_to_host() ? kOnHost : 0) |
                      (n.store.snapshot.valid() ? kOnStore : 0));
}

Medium medium_of(std::uint8_t bit) {
  return bit == kOnGpu ? Medium::kGpu : bit == kOnHost ? Medium::kHost : Medium::kStore;
}
}  // namespace

void PrefixCache::add_event_sink(EventSink* sink) {
  if (sink == nullptr) return;
  sinks_.add(sink);
  // The reports are not kept while no sink is attached: emit_contents() sets them afresh.
  sinks_.only(sink, [this] { emit_contents(); });
}

void PrefixCache::remove_event_sink(EventSink* sink) {
  sinks_.remove(sink);
}

void PrefixCache::emit(const CacheEvent& event) {
  sinks_.emit(event);
}

std::uint32_t PrefixCache::namespace_of(const Node* n) const {
  while (!n->is_root()) n = n->parent;
  if (n == tree_.root()) return kDefaultNamespace.value();
  for (const auto& [ns, root] : tree_.namespace_roots())
    if (root == n) return ns;
  return kDefaultNamespace.value();
}

std::uint64_t PrefixCache::tail_hash(Node* n) {
  // A root's "hash" is its namespace id: the first page of namespace k hashes with parent k,
  // so equal tokens in two namespaces are different blocks (0: the default namespace).
  // Iteratively: a deep tree must not recurse once per node.
  std::vector<Node*> up;
  Node* p = n;
  for (; !p->tail_hash_known; p = p->parent) {
    if (p->is_root()) {
      p->tail_hash = namespace_of(p);
      p->tail_hash_known = true;
      break;
    }
    up.push_back(p);
  }
  for (auto it = up.rbegin(); it != up.rend(); ++it) {
    Node* q = *it;
    std::uint64_t h = q->parent->tail_hash;
    const std::span<const Token> t(q->tokens);
    for (std::size_t pos = 0; pos < t.size(); pos += config_.page_size)
      h = block_hash(h, t.subspan(pos, config_.page_size));
    q->tail_hash = h;
    q->tail_hash_known = true;
  }
  return n->tail_hash;
}

std::vector<std::uint64_t> PrefixCache::page_hashes(Node* n) {
  std::vector<std::uint64_t> out = block_hashes(n->tokens, config_.page_size, tail_hash(n->parent));
  n->tail_hash = out.empty() ? tail_hash(n->parent) : out.back();
  n->tail_hash_known = true;
  return out;
}

void PrefixCache::emit_changes(Node* n) {
  if (n->is_root()) return;
  const std::uint8_t kv = usable_kv(*n), snap = usable_snapshot(*n);
  if (kv == n->reported_kv && snap == n->reported_snapshot) return;
  const std::uint8_t old_kv = n->reported_kv, old_snap = n->reported_snapshot;
  n->reported_kv = kv;
  n->reported_snapshot = snap;
  if (sinks_.quiet) return;
  std::vector<std::uint64_t> hashes;
  auto hashes_of = [&]() -> const std::vector<std::uint64_t>& {
    if (hashes.empty()) hashes = page_hashes(n);
    return hashes;
  };
  // Removals first and a snapshot before its KV, stores the other way round, so a router
  // never holds a snapshot whose KV it has not seen.
  for (std::uint8_t bit : kMedia) {
    if ((old_snap & bit) && !(snap & bit))
      emit(SnapshotRemoved{tail_hash(n), n->boundary, medium_of(bit)});
  }
  for (std::uint8_t bit : kMedia) {
    if ((old_kv & bit) && !(kv & bit)) emit(BlockRemoved{hashes_of(), medium_of(bit)});
  }
  for (std::uint8_t bit : kMedia) {
    if (!(old_kv & bit) && (kv & bit)) {
      std::optional<std::uint64_t> parent;
      if (!n->parent->is_root()) parent = tail_hash(n->parent);
      std::optional<std::uint32_t> ns;
      if (const std::uint32_t k = namespace_of(n); k != kDefaultNamespace.value()) ns = k;
      emit(BlockStored{hashes_of(), parent, n->tokens, config_.page_size, medium_of(bit), ns});
    }
  }
  for (std::uint8_t bit : kMedia) {
    if (!(old_snap & bit) && (snap & bit))
      emit(SnapshotStored{tail_hash(n), n->boundary, medium_of(bit)});
  }
}

void PrefixCache::emit_contents() {
  sinks_.quiet = false;
  // One piece per sink (EventSink::on_restart): a bounded queue smaller than the contents
  // must not drop the restart that makes its consumer's copy exact again.
  sinks_.restart([this] {
    emit(AllBlocksCleared{});
    std::vector<Node*> stack{tree_.root()};  // parents before children, every namespace
    for (const auto& [ns, root] : tree_.namespace_roots()) stack.push_back(root);
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (auto& [key, child] : n->children) stack.push_back(child);
      if (n->is_root()) continue;
      n->reported_kv = 0;
      n->reported_snapshot = 0;
      emit_changes(n);
    }
  });
}

void PrefixCache::restart_lossy_sinks() {
  // Called where every node's report is current (the end of poll()), so the other sinks,
  // which are not restarted, lose nothing when the reports are set afresh.
  if (sinks_.quiet) return;
  // Each restart clears the sink's loss (an EventSink that reported one and kept it after its
  // restart would be asked again at the next poll(), not here).
  std::vector<EventSink*> done;
  while (EventSink* sink = sinks_.lossy()) {
    if (std::find(done.begin(), done.end(), sink) != done.end()) break;
    done.push_back(sink);
    sinks_.only(sink, [this] { emit_contents(); });
  }
}

}  // namespace radixtier
