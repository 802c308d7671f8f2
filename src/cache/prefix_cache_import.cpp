// What the shared tier (radixtier::shared, shared_tier.hpp) needs of PrefixCache: the host
// copies along a path, for publishing, and entering fetched bytes as host-resident nodes.
//
// import_host() keeps rule 8 (validate, then mutate) and rule 5 (the host pages it takes are
// held as a copy's destinations until the caller's fill() returned true): a fill that fails,
// or a tree that lost KV below the fetched pages meanwhile, enters nothing and frees what it
// took. What it enters is exactly what a finished demotion leaves: host-only KV and a
// host-only snapshot, promoted by the next admission as any host node.
#include <algorithm>

#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

namespace {

/// Where `tokens` leave the KV a tree already has, walking from `root`.
struct KvEdge {
  Node* last_kv = nullptr;        ///< deepest node on the path whose KV is present (or root)
  std::size_t first_missing = 0;  ///< tokens from the root with KV everywhere before
  Node* busy = nullptr;           ///< the node a split would cut while its KV is mid-copy
  Node* end = nullptr;            ///< the node ending exactly at tokens.size() (if any)
};

/// A host copy of n's KV that a publisher may read now (landed, not being written).
bool host_kv_usable(const Node& n) {
  return n.host.has_kv() && !n.kv_to_host();
}

/// Whether a publish walking from the root goes on through n: it has a usable host copy, or
/// a shared tier has its pages already (mark_published).
bool publish_walks_on(const Node& n) {
  return host_kv_usable(n) || n.published;
}

}  // namespace

HostCopies PrefixCache::host_copies(std::span<const Token> tokens, NamespaceId ns) const {
  HostCopies out;
  const std::uint32_t ps = config_.page_size;
  const std::size_t whole = tokens.size() / ps * ps;
  bool contiguous = true;
  tree_.walk_kv_path(root_of(ns), tokens.first(whole), [&](const Node* c, std::size_t reached) {
    if (!contiguous) return;
    // A published node's copy may have left host first (KeyClass::kCopy): the tier has its
    // pages, so the path goes on past it.
    if (!publish_walks_on(*c)) {
      contiguous = false;
      return;
    }
    const std::size_t first = (c->boundary - c->tokens.size()) / ps;
    for (std::size_t p = first; p < reached / ps; ++p)
      out.kv.push_back(host_kv_usable(*c) ? c->host.pages[p - first] : HostPageId{});
    if (reached == c->boundary && c->host.has_snapshot() && !c->snap_to_host()) {
      out.snapshots.push_back({c->boundary, c->host.snapshot});
    }
  });
  return out;
}

void PrefixCache::mark_published(std::span<const Token> tokens, NamespaceId ns) {
  if (!ns.valid()) return;
  const std::size_t whole = tokens.size() / config_.page_size * config_.page_size;
  std::vector<Node*> path;  // as host_copies() walks: whole nodes with host KV or published
  bool contiguous = true;
  tree_.walk_kv_path(root_of(ns), tokens.first(whole), [&](Node* c, std::size_t reached) {
    contiguous = contiguous && publish_walks_on(*c);
    if (contiguous && reached == c->boundary && !c->published) path.push_back(c);
  });
  for (Node* n : path) {
    n->published = true;
    refresh(n);
  }
}

Result<ImportResult> PrefixCache::import_host(std::span<const Token> tokens, NamespaceId ns,
                                              const ImportFill& fill) {
  const std::uint32_t ps = config_.page_size;
  if (tokens.empty() || tokens.size() % ps != 0) {
    return invalid_argument("import_host: " + std::to_string(tokens.size()) +
                            " tokens is not a positive whole number of pages of " +
                            std::to_string(ps));
  }
  if (!ns.valid()) return invalid_argument("import_host: the invalid namespace id");
  if (!fill) return invalid_argument("import_host: no fill function");
  poll();

  // Where the tree's KV ends along `tokens`; a node a split would cut must not be mid-copy.
  auto edge_of = [&](Node* root) {
    KvEdge e;
    e.last_kv = root;
    if (root == nullptr) return e;
    Node* n = root;
    bool kv_run = true;
    for (std::size_t pos = 0; pos < tokens.size();) {
      Node* c = tree_.find_child(n, tokens, pos);
      if (c == nullptr) break;
      const std::size_t k = tree_.common_pages(c, tokens, pos);
      if (kv_run && c->has_kv()) {
        e.last_kv = c;
        e.first_missing = pos + k * ps;
      } else {
        kv_run = false;
      }
      if (k < c->page_count(ps)) {
        if (c->kv_xfer != Xfer::kNone) e.busy = c;
        break;
      }
      pos += c->tokens.size();
      if (pos == tokens.size()) e.end = c;
      n = c;
    }
    return e;
  };
  KvEdge e = edge_of(root_of(ns));
  while (e.busy != nullptr) {
    wait_kv_copy(e.busy);
    e = edge_of(root_of(ns));
  }
  const bool need_snapshot = e.end == nullptr || !e.end->has_snapshot();
  const std::size_t kv_pages = (tokens.size() - e.first_missing) / ps;
  ImportResult out;
  out.first_page = e.first_missing / ps;
  if (kv_pages == 0 && !need_snapshot) return out;  // the tree has all of it
  const std::size_t snap_pages = need_snapshot ? config_.snapshot_pages() : 0;
  if (kv_pages + snap_pages > host_.pages.capacity()) {
    return out_of_memory("import_host: " + std::to_string(kv_pages + snap_pages) +
                         " host pages asked, the host pool has " +
                         std::to_string(host_.pages.capacity()));
  }

  // Host room, with the KV the import continues locked so that making room cannot take it.
  Node* root = tree_.ensure_root(ns);
  Node* keep = e.last_kv != nullptr ? e.last_kv : root;
  // Each kind's room is taken as soon as it is made, so making room for the other cannot count
  // the same free pages twice.
  lock_path(keep);
  std::vector<HostPageId> kv, snap;
  bool room = make_host_page_room(snap_pages, true) && host_.pages.free_count() >= snap_pages;
  for (std::size_t i = 0; room && i < snap_pages; ++i) {
    snap.push_back(*host_.pages.take(Holder::kTransfer));
  }
  room = room && make_host_page_room(kv_pages) && host_.pages.free_count() >= kv_pages;
  for (std::size_t i = 0; room && i < kv_pages; ++i) {
    kv.push_back(*host_.pages.take(Holder::kTransfer));
  }
  unlock_path(keep);
  if (!room) {
    release(kv);
    release(snap);
    remove_root_if_empty(root);
    return out_of_memory("import_host: no host room for " + std::to_string(kv_pages) +
                         " KV pages and a snapshot");
  }
  // Making room evicts only unlocked leaves: the locked KV is whole, so the edge is the same
  // unless an eviction removed a tombstone the path ran through (the walk below makes it new).
  const KvEdge now = edge_of(root);
  if (now.first_missing != e.first_missing || now.busy != nullptr ||
      !fill(out.first_page, kv, snap)) {
    release(kv);
    release(snap);
    remove_root_if_empty(root);
    return Status(ErrorCode::kFailedPrecondition,
                  "import_host: the bytes did not arrive or the tree changed below them; "
                  "nothing entered");
  }

  // Enter the pages: new nodes, revived tombstones and split parts, as insert() adopts.
  Node* n = root;
  std::vector<Node*> entered;
  for (std::size_t pos = 0; pos < tokens.size();) {
    Node* c = tree_.find_child(n, tokens, pos);
    if (c == nullptr) {
      c = tree_.new_node(n, tokens.subspan(pos));
    } else if (std::size_t k = tree_.common_pages(c, tokens, pos); k < c->page_count(ps)) {
      c = split(c, k);
    }
    // Below the first page without KV, a node may still hold KV of its own (a failed copy
    // can leave a tombstone above nodes that kept theirs): it keeps it, and the fetched
    // pages for it go back to the pool.
    if (pos >= e.first_missing) {
      const std::size_t at = (pos - e.first_missing) / ps;
      std::vector<HostPageId> seg(kv.begin() + std::ptrdiff_t(at),
                                  kv.begin() + std::ptrdiff_t(at + c->page_count(ps)));
      if (c->has_kv()) {
        release(seg);
      } else {
        for (HostPageId id : seg) host_.pages.reassign(id, Holder::kNode);
        set_pages<Tier::kHost>(c, std::move(seg));
        entered.push_back(c);
        out.kv_pages += c->page_count(ps);
      }
    }
    pos += c->tokens.size();
    n = c;
  }
  for (Node* c : entered) touch(c);
  if (need_snapshot) {
    for (HostPageId id : snap) host_.pages.reassign(id, Holder::kNode);
    set_snapshot<Tier::kHost>(n, std::move(snap));
    touch_snapshot(n);
    out.snapshot = true;
    cap_path_snapshots(n);  // CacheConfig::max_snapshots_per_path, as insert() keeps it
  }
  touch(n);
  return out;
}

}  // namespace radixtier
