// The request lifecycle of PrefixCache, second half: the GPU pages and snapshot slots a
// running request allocates and frees (rule 9), insert (the tree adopts what the request
// computed) and release (prefix_cache_requests.cpp: admit, wait).
#include <algorithm>
#include <limits>
#include <sstream>

#include "describe_id.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

void PrefixCache::new_page_list() const {
  if (page_stamp_.size() != gpu_.pages.capacity()) page_stamp_.assign(gpu_.pages.capacity(), 0);
  if (++page_epoch_ == 0) {  // wrapped: forget every old stamp
    std::fill(page_stamp_.begin(), page_stamp_.end(), 0);
    page_epoch_ = 1;
  }
}

bool PrefixCache::seen_before(GpuPageId id) const {
  if (page_stamp_[id.value()] == page_epoch_) return true;
  page_stamp_[id.value()] = page_epoch_;
  return false;
}

// ---------------------------------------------------------------------------------------
// allocation for running requests

Result<std::vector<GpuPageId>> PrefixCache::alloc_pages(LockId lock, std::size_t n) {
  if (auto rec = find_lock(lock); !rec) return rec.status();
  if (n > gpu_.pages.capacity()) {
    return invalid_argument("alloc_pages: " + std::to_string(n) +
                            " pages asked, the GPU pool has " +
                            std::to_string(gpu_.pages.capacity()));
  }
  reap_transfers();  // not poll(): a refused allocation must change nothing
  StreamScope scope(this, requests_.at(lock).stream);  // demotions made for it
  if (Status s = make_gpu_page_room(n); !s) return s;
  requests_.note_alloc(n);  // the watermark step's unit (demote_ahead)
  std::vector<GpuPageId> pages;
  pages.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    pages.push_back(*gpu_.pages.take(Holder::kRequest));
    requests_.page_owner.add(lock, pages.back());
  }
  return pages;
}

Result<GpuSlotId> PrefixCache::alloc_snapshot_slot(LockId lock) {
  if (auto rec = find_lock(lock); !rec) return rec.status();
  reap_transfers();
  if (Status s = make_gpu_slot_room(); !s) return s;
  const GpuSlotId slot = *gpu_.slots.take(Holder::kRequest);
  requests_.slot_owner.add(lock, slot);
  return slot;
}

Status PrefixCache::free_pages(LockId lock, std::span<const GpuPageId> pages) {
  if (auto rec = find_lock(lock); !rec) return rec.status();
  new_page_list();
  for (GpuPageId id : pages) {
    if (!gpu_.pages.in_range(id))
      return invalid_argument("free_pages: " + describe(id) + " out of range");
    if (Status s = requests_.page_owner.check_owner(lock, id, "free_pages"); !s) return s;
    if (seen_before(id)) return invalid_argument("free_pages: " + describe(id) + " listed twice");
  }
  for (GpuPageId id : pages) {
    requests_.page_owner.remove(id);
    gpu_.pages.give_back(id);
  }
  return Status::ok();
}

Status PrefixCache::free_snapshot_slot(LockId lock, GpuSlotId slot) {
  if (auto rec = find_lock(lock); !rec) return rec.status();
  if (!gpu_.slots.in_range(slot))
    return invalid_argument("free_snapshot_slot: " + describe(slot) + " out of range");
  if (Status s = requests_.slot_owner.check_owner(lock, slot, "free_snapshot_slot"); !s) return s;
  LockRecord& rec = requests_.at(lock);
  if (Status s = check_live_slot(rec, slot, "free_snapshot_slot"); !s) return s;
  give_back_slot(rec, slot);
  return Status::ok();
}

Status PrefixCache::check_live_slot(const LockRecord& rec, GpuSlotId slot, const char* call) const {
  // The live slot is the request's from admission, but its copy lands in poll()/wait(): until
  // then the request has not been told the slot (path_snapshot refuses) and may not hand it on.
  if (slot == rec.live && rec.holds_snapshot()) {
    return invalid_argument(std::string(call) + ": " + describe(slot) +
                            " is the live slot the resumed snapshot is being copied into; "
                            "call wait() first");
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// insert

Status PrefixCache::validate_insert(LockId lock, const LockRecord& rec,
                                    std::span<const Token> tokens, std::span<const GpuPageId> pages,
                                    std::optional<GpuSlotId> snapshot) const {
  const std::uint32_t ps = config_.page_size;
  if (tokens.size() % ps != 0) {
    return invalid_argument("insert: " + std::to_string(tokens.size()) +
                            " tokens is not a whole number of pages of " + std::to_string(ps));
  }
  if (pages.size() != tokens.size() / ps) {
    return invalid_argument("insert: " + std::to_string(pages.size()) + " pages for " +
                            std::to_string(tokens.size() / ps) + " pages of tokens");
  }
  if (tokens.size() < rec.node->boundary) {
    return invalid_argument("insert: the tokens end before the request's locked prefix");
  }
  // Nothing is computed on a prefix that has not arrived: wait() first (it also moves the
  // lock when a copy failed, and that move must not strand pages the tree took from it).
  if (lock_state(rec) != TransferState::kDone) {
    return invalid_argument(
        "insert: the reused prefix is still arriving or its copy failed; "
        "call wait() first");
  }
  if (snapshot) {
    if (tokens.empty()) return invalid_argument("insert: the root takes no snapshot");
    if (!gpu_.slots.in_range(*snapshot))
      return invalid_argument("insert: " + describe(*snapshot) + " out of range");
    if (Status s = requests_.slot_owner.check_owner(lock, *snapshot, "insert"); !s) return s;
    if (Status s = check_live_slot(rec, *snapshot, "insert"); !s) return s;
  }
  new_page_list();
  for (GpuPageId id : pages) {
    if (!gpu_.pages.in_range(id))
      return invalid_argument("insert: " + describe(id) + " out of range");
    if (seen_before(id)) return invalid_argument("insert: " + describe(id) + " listed twice");
  }
  // Walk what the tree already has: the locked path must be a prefix of `tokens`, and a page
  // the caller does not hold must be the tree's own page at that very position.
  const Node* n = rec.root;
  std::size_t pos = 0;
  bool on_lock_path = true;
  for (;;) {
    if (n == rec.node) {
      on_lock_path = false;
    } else if (on_lock_path && n->boundary >= rec.node->boundary) {
      return invalid_argument("insert: the tokens do not extend the request's locked prefix");
    }
    const Node* c = tree_.find_child(n, tokens, pos);
    const std::size_t k = c ? tree_.common_pages(c, tokens, pos) : 0;
    if (on_lock_path && (c == nullptr || k < c->page_count(ps))) {
      return invalid_argument("insert: the tokens do not extend the request's locked prefix");
    }
    if (c == nullptr) break;
    for (std::size_t i = 0; i < k; ++i) {
      const GpuPageId id = pages[pos / ps + i];
      const bool tree_page = c->gpu.has_kv() && !c->kv_to_gpu() && c->gpu.pages[i] == id;
      if (!tree_page && requests_.page_owner.owner(id) != lock) {
        return invalid_argument("insert: " + describe(id) + " at page " +
                                std::to_string(pos / ps + i) +
                                " is neither the caller's nor the tree's page there" +
                                owned_by(requests_.page_owner.owner(id)));
      }
    }
    if (k < c->page_count(ps)) {
      pos += k * ps;
      break;
    }
    pos += c->tokens.size();
    n = c;
  }
  for (std::size_t i = pos / ps; i < pages.size(); ++i) {
    if (Status s = requests_.page_owner.check_owner(lock, pages[i], "insert"); !s) {
      return invalid_argument(s.message() + " (page " + std::to_string(i) + ")");
    }
  }
  return Status::ok();
}

Result<InsertResult> PrefixCache::insert(LockId lock, std::span<const Token> tokens,
                                         std::span<const GpuPageId> pages,
                                         std::optional<GpuSlotId> snapshot) {
  auto found = find_lock(lock);
  if (!found) return found.status();
  LockRecord& rec = requests_.at(lock);
  // Rule 8: reject bad input before anything changes (settling below may run copies).
  if (Status s = validate_insert(lock, rec, tokens, pages, snapshot); !s) return s;
  StreamScope scope(this, rec.stream);
  poll();
  settle_insert(rec.root, 0, tokens);
  // Validate again after settling: a copy that finished may have changed which pages the
  // tree holds.
  if (Status s = validate_insert(lock, rec, tokens, pages, snapshot); !s) return s;
  return apply_insert(rec, rec.root, 0, tokens, pages, snapshot);
}

Result<InsertResult> PrefixCache::insert_every_page(LockId lock, std::size_t from,
                                                    std::span<const Token> tokens,
                                                    std::span<const GpuPageId> pages,
                                                    std::optional<GpuSlotId> snapshot,
                                                    std::size_t& reached) {
  auto found = find_lock(lock);
  if (!found) return found.status();
  const std::uint32_t ps = config_.page_size;
  reached = from;
  if (from % ps != 0 || from >= tokens.size()) {
    return invalid_argument("insert_every_page: the first boundary " + std::to_string(from) +
                            " is not a page boundary below the " + std::to_string(tokens.size()) +
                            " tokens");
  }
  // Rule 8: the whole insert is checked before its first step changes anything. Every step's
  // input is a prefix of it with a slot of ours, so what insert() would check per step holds.
  if (Status s = validate_insert(lock, requests_.at(lock), tokens, pages, snapshot); !s) return s;
  InsertResult out;
  auto merge = [&](const InsertResult& r) {
    for (GpuPageId p : r.not_taken) {
      if (std::find(out.not_taken.begin(), out.not_taken.end(), p) == out.not_taken.end()) {
        out.not_taken.push_back(p);
      }
    }
  };
  // One step: insert(tokens.first(b), pages.first(b / ps), slot). The first step walks from
  // the root as insert() does; each later one starts at the node the previous step locked
  // (its boundary is the previous b and the path above it is the locked, validated prefix of
  // these very tokens), where insert()'s walks from the root would find nothing to change.
  bool first = true;
  auto step = [&](std::size_t b, std::optional<GpuSlotId> slot) -> Result<InsertResult> {
    const auto t = tokens.first(b);
    const auto p = pages.first(b / ps);
    LockRecord& rec = requests_.at(lock);
    if (first || rec.node->boundary != reached || lock_state(rec) != TransferState::kDone) {
      first = false;
      return insert(lock, t, p, slot);
    }
    poll();
    Node* at = rec.node;
    settle_insert(at, at->boundary, t);
    return apply_insert(rec, at, at->boundary, t, p, slot);
  };
  auto own_slot = [&]() -> std::optional<GpuSlotId> {
    auto s = alloc_snapshot_slot(lock);
    return s ? std::optional<GpuSlotId>(*s) : std::nullopt;
  };
  for (std::size_t b = from + ps; b < tokens.size(); b += ps) {
    const std::optional<GpuSlotId> own = own_slot();
    auto r = step(b, own);
    if (!r) {
      if (own) (void)free_snapshot_slot(lock, *own);
      return r.status();
    }
    if (own && !r->snapshot_taken) (void)free_snapshot_slot(lock, *own);
    reached = b;
    merge(*r);
  }
  // The last boundary: the caller's snapshot if it has one, else one of ours.
  const std::optional<GpuSlotId> own = snapshot ? std::nullopt : own_slot();
  auto r = step(tokens.size(), snapshot ? snapshot : own);
  if (!r) {
    if (own) (void)free_snapshot_slot(lock, *own);
    return r.status();
  }
  if (own && !r->snapshot_taken) (void)free_snapshot_slot(lock, *own);
  reached = tokens.size();
  merge(*r);
  out.snapshot_taken = snapshot.has_value() && r->snapshot_taken;
  return out;
}

void PrefixCache::settle_insert(Node* from, std::size_t from_pos, std::span<const Token> tokens) {
  // The node this insert will split (if any) must not be mid-copy: let its copy finish
  // first. The walk goes through tombstones, as the insert below does.
  const std::uint32_t ps = config_.page_size;
  for (;;) {
    Node* busy = nullptr;
    Node* n = from;
    for (std::size_t pos = from_pos; Node* c = tree_.find_child(n, tokens, pos); n = c) {
      const std::size_t k = tree_.common_pages(c, tokens, pos);
      if (k < c->page_count(ps)) {
        if (c->kv_xfer != Xfer::kNone) busy = c;
        break;
      }
      pos += c->tokens.size();
    }
    if (busy == nullptr) break;
    wait_kv_copy(busy);
  }
}

Result<InsertResult> PrefixCache::apply_insert(LockRecord& rec, Node* from, std::size_t from_pos,
                                               std::span<const Token> tokens,
                                               std::span<const GpuPageId> pages,
                                               std::optional<GpuSlotId> snapshot) {
  const std::uint32_t ps = config_.page_size;
  InsertResult out;
  std::vector<Node*> adopted;
  Node* n = from;
  std::size_t pos = from_pos;
  while (pos < tokens.size()) {
    const auto mine = pages.subspan(pos / ps);
    Node* c = tree_.find_child(n, tokens, pos);
    if (c == nullptr) {
      c = tree_.new_node(n, tokens.subspan(pos));
    } else if (std::size_t k = tree_.common_pages(c, tokens, pos); k < c->page_count(ps)) {
      c = split(c, k);
    }
    const auto seg = mine.first(c->page_count(ps));
    if (c->gpu.has_kv()) {
      // Duplicate: the tree keeps its pages (or the ones a promotion is filling); the
      // caller keeps its own and frees them when done.
      for (std::size_t i = 0; i < seg.size(); ++i) {
        if (seg[i] != c->gpu.pages[i]) out.not_taken.push_back(seg[i]);
      }
    } else {
      // New node, tombstone or host-only node: adopt the caller's freshly computed pages.
      for (GpuPageId id : seg) {
        requests_.page_owner.remove(id);
        gpu_.pages.reassign(id, Holder::kNode);
      }
      set_pages<Tier::kGpu>(c, std::vector<GpuPageId>(seg.begin(), seg.end()));
      adopted.push_back(c);
    }
    pos += c->tokens.size();
    n = c;
  }
  // The lock follows the request down to its new boundary (first: making room for the
  // snapshot below must not take what was just adopted).
  if (n != rec.node) {
    lock_path(n);
    unlock_path(rec.node);
    rec.node = n;
  }
  if (snapshot && !n->gpu.has_snapshot()) {
    // The slot's bytes go to fresh pool pages by a device copy reaped by poll(): the slot is
    // the copy's from now on (the caller no longer owns it) and is freed when it lands.
    const GpuSlotId slot = *snapshot;
    gpu_.slots.reassign(slot, Holder::kTransfer);
    if (materialize(n, slot, rec.stream)) {
      requests_.slot_owner.remove(slot);
      if (rec.live == slot) rec.live = GpuSlotId();
      out.snapshot_taken = true;
    } else {  // no room, or refused: the caller keeps its slot
      gpu_.slots.reassign(slot, Holder::kRequest);
    }
  }
  if (out.snapshot_taken) {
    ++stats_.snapshots_inserted;
  }  // else a duplicate (the tree keeps its own) or no room: the caller keeps its slot
  for (Node* a : adopted) touch(a);
  touch(n);
  if (out.snapshot_taken) touch_snapshot(n);
  // Retention: the nodes the request computed and the boundary it reached (as touch above).
  for (Node* a : adopted) raise_priority(a, rec.priority, true, false);
  raise_priority(n, rec.priority, true, out.snapshot_taken);
  // After the priority is set: the cap may drop the one just attached, if it is the least
  // useful.
  if (out.snapshot_taken) cap_path_snapshots(n);
  if (config_.write_policy == WritePolicy::kWriteThrough) {
    write_through(adopted, out.snapshot_taken ? n : nullptr);
  }
  // The snapshot's pages came out of the free room: the watermark step tops it up now, so
  // the copies land while the next request computes (the poll() above ran before them).
  if (out.snapshot_taken) demote_ahead();
  return out;
}

Status PrefixCache::release(LockId lock) {
  auto found = find_lock(lock);
  if (!found) return found.status();
  const LockRecord rec = **found;
  requests_.erase(lock);
  if (rec.fill_xfer != 0) {
    // Its fill is in flight: the copy keeps the live slot (its destination) and the snapshot
    // lock (its source) until it lands (rule 5; finish_device_copy frees both).
    xfers_.device.at(rec.fill_xfer).lock = LockId();
    requests_.slot_owner.remove(rec.live);
    gpu_.slots.reassign(rec.live, Holder::kTransfer);
  }
  // What the request still owns goes back to the free lists (rule 9).
  for (GpuPageId id : requests_.page_owner.take_all(lock)) gpu_.pages.give_back(id);
  for (GpuSlotId id : requests_.slot_owner.take_all(lock)) gpu_.slots.give_back(id);
  if (rec.holds_snapshot() && rec.fill_xfer == 0) {
    --rec.snap_node->snapshot_lock;
    refresh(rec.snap_node);
  }
  unlock_path(rec.node);
  // A promotion that failed while locked left tombstones on this path; they can go now.
  // snap_node is rec.node or one of its ancestors (insert only moves the lock down), so the
  // walk up from rec.node covers it, and may free it: it must not be touched again.
  remove_if_empty(rec.node);
  demote_ahead();  // what the request held may now be evictable: keep the free room
  return Status::ok();
}

}  // namespace radixtier
