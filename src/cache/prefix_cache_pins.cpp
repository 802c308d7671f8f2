// Host-only pins of PrefixCache: an operator keeps a prefix (a system prompt) resident on
// host, never dropped, within CacheConfig::host_pin_share of the host pool.
//
// A pin counts on every node of its prefix (host_pin, root included, as a lock does) and on
// the end node's snapshot (snap_pin). Those counts take the host copies out of the host
// eviction orders (node.hpp); the GPU copies stay evictable, and leaving the GPU is free for
// them because the host copy is clean. pins_.pinned_pages is the pages of every pinned node
// and pinned snapshot, each counted once, whether or not a failed copy has since taken them
// (rule 7 still holds for pinned nodes): it is what the budget charges.
#include <algorithm>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

std::size_t PrefixCache::pin_budget_pages() const {
  return static_cast<std::size_t>(config_.host_pin_share * double(host_.pages.capacity()));
}

std::size_t PrefixCache::pin_cost(const Node* end) const {
  std::size_t pages = end->snap_pin == 0 ? config_.snapshot_pages() : 0;
  for (const Node* n = end; !n->is_root(); n = n->parent) {
    if (n->host_pin == 0) pages += n->page_count(config_.page_size);
  }
  return pages;
}

void PrefixCache::add_pin_counts(Node* end, int delta) {
  const std::size_t snap_pages = config_.snapshot_pages();
  if (delta > 0 && end->snap_pin++ == 0) pins_.pinned_pages += snap_pages;
  if (delta < 0 && --end->snap_pin == 0) pins_.pinned_pages -= snap_pages;
  for (Node* p = end; p != nullptr; p = p->parent) {
    const std::size_t pages = p->page_count(config_.page_size);
    if (delta > 0 && p->host_pin++ == 0) pins_.pinned_pages += pages;
    if (delta < 0 && --p->host_pin == 0) pins_.pinned_pages -= pages;
    refresh(p);
  }
}

Result<PinId> PrefixCache::pin(std::span<const Token> tokens, NamespaceId ns) {
  const std::uint32_t ps = config_.page_size;
  if (tokens.empty() || tokens.size() % ps != 0) {
    return invalid_argument("pin: " + std::to_string(tokens.size()) +
                            " tokens is not a positive whole number of pages of " +
                            std::to_string(ps));
  }
  if (!ns.valid()) return invalid_argument("pin: the invalid namespace id");
  // A pinned node then has no copy in flight: its host copies are whole or absent.
  drain();
  Node* end = nullptr;
  tree_.walk_kv_path(root_of(ns), tokens, [&](const Node* c, std::size_t reached) {
    if (reached == tokens.size() && reached == c->boundary) end = const_cast<Node*>(c);
  });
  const std::string what =
      std::to_string(tokens.size()) + " tokens of namespace#" + std::to_string(ns.value());
  if (end == nullptr) {
    return invalid_argument("pin: the " + what +
                            " are not a cached prefix ending at a node (KV on every page)");
  }
  if (!end->has_snapshot()) {
    return invalid_argument("pin: the " + what +
                            " have no snapshot at their end: nothing could resume from them");
  }
  // Pins copy from GPU; what is on the store only comes back by an admission first.
  bool in_memory = end->gpu.has_snapshot() || end->host.has_snapshot();
  for (const Node* n = end; !n->is_root(); n = n->parent) {
    in_memory = in_memory && (n->gpu.has_kv() || n->host.has_kv());
  }
  if (!in_memory) {
    return Status(ErrorCode::kFailedPrecondition,
                  "pin: part of the " + what +
                      " is on the store tier only: admit it first (pins keep host copies)");
  }
  const std::size_t cost = pin_cost(end);
  if (pins_.pinned_pages + cost > pin_budget_pages()) {
    return out_of_memory(
        "pin: the " + what + " need " + std::to_string(cost) + " more pinned host pages; " +
        std::to_string(pins_.pinned_pages) + " are pinned and CacheConfig.host_pin_share allows " +
        std::to_string(pin_budget_pages()) + " of " + std::to_string(host_.pages.capacity()));
  }
  // Decide host room before anything changes: what the copies need against the free pages
  // and the host copies no lock and no pin holds (all reclaimable, leaf-first).
  const std::vector<Node*> path = RadixTree::path_of(end);
  std::size_t need_kv = 0, need_snap = 0, free_kv = 0, free_snap = 0;
  for (const Node* n : path) {
    if (!n->host.has_kv()) need_kv += n->page_count(ps);
  }
  if (!end->host.has_snapshot()) need_snap = config_.snapshot_pages();
  std::vector<const Node*> stack{tree_.root()};
  for (const auto& [id, r] : tree_.namespace_roots()) stack.push_back(r);
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [key, c] : n->children) stack.push_back(c);
    if (std::find(path.begin(), path.end(), n) != path.end()) continue;  // to be pinned
    if (n->lock_count == 0 && n->host_pin == 0) free_kv += n->host.pages.size();
    if (n->snapshot_lock == 0 && n->snap_pin == 0) free_snap += n->host.snapshot.size();
  }
  bool room = host_.pages.free_count() + free_kv + free_snap >= need_kv + need_snap;
  if (!shared_host_) {
    const std::size_t snap_share =
        std::size_t{config_.host_snapshot_slots} * config_.snapshot_pages();
    room = room && host_.kv_held - free_kv + need_kv <= config_.host_pages &&
           host_.snap_held - free_snap + need_snap <= snap_share;
  }
  if (!room) {
    return out_of_memory("pin: the " + what + " need " + std::to_string(need_kv + need_snap) +
                         " host pages for their copies; " +
                         std::to_string(host_.pages.free_count()) + " are free and " +
                         std::to_string(free_kv + free_snap) +
                         " reclaimable (the rest are locked, pinned or in their kind's share)");
  }
  // Pinned first, so making room cannot take the prefix's own host copies.
  add_pin_counts(end, +1);
  PendingBatch copy = down_batch<Tier::kGpu>();
  for (Node* n : path) {
    if (n->host.has_kv()) continue;
    // Room was checked above: it is made.
    if (!plan_down<Tier::kGpu>(n, Held::kKv, Xfer::kWriteThrough, copy)) break;
  }
  if (!end->host.has_snapshot())
    (void)plan_down<Tier::kGpu>(end, Held::kSnapshot, Xfer::kWriteThrough, copy);
  std::optional<std::uint32_t> id;
  Status submitted = submit_link<Tier::kGpu>(std::move(copy), &id);
  if (id) wait_link<Tier::kGpu>(*id);
  bool whole = end->host.has_snapshot();
  for (const Node* n : path) whole = whole && n->host.has_kv();
  if (!submitted || !whole) {
    add_pin_counts(end, -1);
    if (!submitted) return Status(submitted.code(), "pin: " + submitted.message());
    return Status(ErrorCode::kTransferFailed,
                  "pin: the copy of the " + what + " to host failed; nothing is pinned");
  }
  return pins_.add(PinRecord{end, root_of(ns)});
}

Status PrefixCache::unpin(PinId pin) {
  const PinRecord* rec = pins_.find(pin);
  if (rec == nullptr) {
    return not_found("unpin: pin#" + std::to_string(pin.value()) +
                     " is unknown (never pinned, or already unpinned)");
  }
  Node* end = rec->node;
  pins_.erase(pin);
  add_pin_counts(end, -1);
  remove_if_empty(end);  // a pinned node a failed copy emptied may leave now
  return Status::ok();
}

}  // namespace radixtier
