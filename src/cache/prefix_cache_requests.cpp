// The request lifecycle of PrefixCache, first half: admit, poll, wait and the path a
// request resumes from (prefix_cache_insert.cpp: allocation, insert, release).
#include <algorithm>
#include <limits>
#include <sstream>
#include <type_traits>

#include "describe_id.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier {

Result<const LockRecord*> PrefixCache::find_lock(LockId id) const {
  const LockRecord* rec = requests_.find(id);
  if (rec == nullptr) {
    return not_found(describe(id) + " is unknown (never admitted, or already released)");
  }
  return rec;
}

// ---------------------------------------------------------------------------------------
// admission

Result<Admission> PrefixCache::admit(std::span<const Token> prompt) {
  return admit(prompt, RequestOptions{});
}

Result<Admission> PrefixCache::admit(std::span<const Token> prompt, const RequestOptions& options) {
  return admit_tokens(prompt, options);
}

Result<Admission> PrefixCache::admit(std::span<const std::int64_t> prompt,
                                     const RequestOptions& options) {
  return admit_tokens(prompt, options);
}

template <class T>
Result<Admission> PrefixCache::admit_tokens(std::span<const T> prompt,
                                            const RequestOptions& options) {
  // Admission latency for TimingHooks: measured on every return path, only when attached.
  struct Timer {
    TimingHooks* hooks;
    std::chrono::steady_clock::time_point start =
        hooks ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    ~Timer() {
      if (hooks) hooks->on_admit(std::chrono::steady_clock::now() - start);
    }
  } timer{timing_};
  if (prompt.empty()) return invalid_argument("admit: the prompt is empty");
  if (Status s = options.validate(); !s) return Status(s.code(), "admit: " + s.message());
  StreamScope scope(this, options.stream);  // the batches this admission submits
  poll();
  // Rule 1: the last prompt token is always computed, so match on all but it.
  const auto query = prompt.first(prompt.size() - 1);
  std::size_t kv_tokens = 0;  // as match(): where the query leaves the cached KV path
  // Nodes with a snapshot on the KV-intact path, shallow first. Only the request's own
  // namespace is searched: no node is shared with another one.
  std::vector<Candidate> candidates = candidates_along(root_of(options.ns), query, &kv_tokens);
  if constexpr (!std::is_same_v<T, Token>) {
    // The walk matched query[0, kv_tokens) to tree tokens: those are in range. The rest is
    // checked here, before the admission changes anything (poll() above only reaped).
    for (std::size_t i = kv_tokens; i < prompt.size(); ++i) {
      if (prompt[i] < std::numeric_limits<Token>::min() ||
          prompt[i] > std::numeric_limits<Token>::max())
        return invalid_argument("admit: prompt[" + std::to_string(i) + "] = " +
                                std::to_string(prompt[i]) + " does not fit a 32-bit token id");
    }
  }
  ++stats_.admissions;
  stats_.requested_tokens += query.size();
  // Deepest first; a candidate whose promotion cannot get GPU room falls back to a
  // shallower one (less reuse, never a wrong one), and one whose load-back is below the
  // threshold is not tried.
  Node* target = nullptr;
  std::optional<Admission> got;
  Status refused;
  bool fell_back = false;
  // A resume needs a live slot to copy the cached snapshot into; without one free, the
  // request recomputes (no candidate is tried).
  GpuSlotId live;
  if (!candidates.empty()) {
    // With no slot free, making room lets the device copies that hold one land, and what
    // landing runs (a write-through making host room) may drop nodes of this very path: the
    // candidates are walked again then, never used stale.
    const bool settles = gpu_.slots.free_count() == 0;
    if (make_gpu_slot_room()) live = *gpu_.slots.take(Holder::kRequest);
    if (settles && live.valid())
      candidates = candidates_along(root_of(options.ns), query, &kv_tokens);
  }
  if (!live.valid()) candidates.clear();
  std::size_t gpu_usable = 0;
  for (const Candidate& c : candidates) {
    if (!c.needs_copy()) gpu_usable = c.node->boundary;
  }
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (!worth_loading(*it, gpu_usable)) continue;
    Result<Admission> a = try_admit_at(it->node);
    if (a) {
      target = it->node;
      got = std::move(a).value();
      break;
    }
    fell_back = true;
    if (a.status().code() == ErrorCode::kTransferFailed) {
      refused = Status(ErrorCode::kTransferFailed, "admit: " + a.status().message());
      break;
    }
  }
  // A candidate that failed may have become an empty leaf (a copy that failed while making
  // room for it left it without KV). Prune only now: inside the loop, freeing it could free
  // a shallower candidate the loop still holds by pointer.
  if (fell_back) prune_path(root_of(options.ns), query);
  if (live.valid() && target == nullptr) gpu_.slots.give_back(live);
  if (!refused.is_ok()) return refused;
  const LockId id = requests_.new_id();
  if (target == nullptr) {
    // Made (if new) only now: pruning above may have removed an empty namespace root.
    Node* root = tree_.ensure_root(options.ns);
    requests_.add(id, LockRecord{root, nullptr, root, options.priority}).stream = options.stream;
    lock_path(root);
    Admission a;
    a.lock = id;
    a.kv_tokens = kv_tokens;
    return a;
  }
  Node* const root = root_of(options.ns);  // target's: its tree is alive while it is
  LockRecord& rec = requests_.add(id, LockRecord{target, target, root, options.priority});
  rec.live = live;
  rec.stream = options.stream;
  requests_.slot_owner.add(id, live);
  // Retention: what the request uses is kept at least at its priority (as the recency
  // refresh of try_admit_at: the KV of the whole path, the snapshot resumed from).
  for (Node* n : RadixTree::path_of(target)) raise_priority(n, options.priority, true, false);
  raise_priority(target, options.priority, false, true);
  Admission& a = *got;
  a.lock = id;
  a.kv_tokens = kv_tokens;
  poll();
  // The copy into the live slot is submitted now, ordered after the snapshot's promotion when
  // that is still arriving: the admission never waits for it (a later poll() reaps it). After
  // the poll: its watermark step runs while the snapshot is still the lock's.
  submit_fill(id, rec);
  // A copy that already failed (a store record that failed its check, reaped by this poll)
  // needs wait() too: it resumes the request above the loss.
  a.promoting = lock_state(rec) != TransferState::kDone;
  stats_.hit_tokens_gpu += a.gpu_tokens;
  stats_.hit_tokens_host += a.host_tokens;
  return a;
}

template <class T>
void PrefixCache::prune_path(Node* root, std::span<const T> tokens) {
  if (root == nullptr) return;
  Node* n = root;
  for (std::size_t pos = 0;;) {
    Node* c = tree_.find_child(n, tokens, pos);
    if (c == nullptr || tree_.common_pages(c, tokens, pos) < c->page_count(config_.page_size))
      break;
    pos += c->tokens.size();
    n = c;
  }
  remove_if_empty(n);
}

Result<Admission> PrefixCache::try_admit_at(Node* target) {
  lock_path(target);
  ++target->snapshot_lock;
  refresh(target);
  auto undo = [&](Status why) -> Result<Admission> {
    --target->snapshot_lock;
    refresh(target);
    unlock_path(target);
    return why;
  };
  const std::vector<Node*> path = RadixTree::path_of(target);
  // A node has one copy in flight at a time: a store write reading the path's host pages
  // lands first (locked now, the node keeps its host copy when it does).
  for (Node* n : path) {
    if (n->kv_xfer == Xfer::kStore) wait_kv_copy(n);
  }
  if (target->snap_xfer == Xfer::kStore) wait_snapshot_copy(target);
  auto pages_needed = [&] {
    std::size_t pages = 0;
    for (Node* n : path) {
      if (!n->gpu.has_kv()) pages += n->page_count(config_.page_size);
    }
    return pages;
  };
  // The KV pages missing on GPU and, when the snapshot is not there, its pages: one pool.
  auto all_needed = [&] {
    return pages_needed() + (target->gpu.has_snapshot() ? 0 : config_.snapshot_pages());
  };
  std::size_t need_pages = all_needed();
  // A hopeless admission evicts nothing: decide for all of it first.
  if (need_pages > 0) {
    if (Status s = check_gpu_page_room(need_pages); !s) return undo(s);
  }
  // Making room waits on transfers. A promotion of another admission this path rides on may
  // fail meanwhile: its nodes are host-only again (the host copy stays) and need pages of
  // this admission, so count again. Each repeat needs such a failure on this path, and a
  // node cannot fail twice in this call (nothing else starts a promotion meanwhile).
  for (std::size_t round = 0;; ++round) {
    if (need_pages > 0) {
      if (Status s = make_gpu_page_room(need_pages); !s) return undo(s);
    }
    need_pages = all_needed();
    if (gpu_.pages.free_count() >= need_pages) break;
    if (round > path.size()) {
      return undo(Status(ErrorCode::kFailedPrecondition,
                         "admit: promotions this path relied on kept failing while making room"));
    }
  }
  // Making room waits on transfers: re-check the path before planning.
  for (Node* n : path) {
    if (!n->has_kv()) {
      return undo(Status(ErrorCode::kFailedPrecondition,
                         "admit: a copy that failed while making room took part of the path"));
    }
  }
  if (!target->has_snapshot()) {
    return undo(Status(ErrorCode::kFailedPrecondition,
                       "admit: a copy that failed while making room took the snapshot"));
  }
  // Store-only data travels store -> host -> GPU (whole, or staged a chunk at a time when
  // host has no room for all of it); its GPU destinations are the pages made room for above.
  // Refused or no host room: the path is store-only again and a shallower candidate is tried.
  std::size_t store_tokens = 0;
  if (Status s = load_from_store(target, path, &store_tokens); !s) return undo(s);
  stats_.hit_tokens_store += store_tokens;
  PendingBatch promote = up_batch<Tier::kGpu>();
  Admission a;
  for (Node* n : path) {
    if (n->gpu.has_kv()) {
      (n->kv_to_gpu() ? a.host_tokens : a.gpu_tokens) += n->tokens.size();
      continue;
    }
    (void)plan_up<Tier::kGpu>(n, Held::kKv, promote);
    a.host_tokens += n->tokens.size();
  }
  if (target->snap_xfer == Xfer::kLoad || target->snap_xfer == Xfer::kStage) {
    a.snapshot_from_host = true;
  } else if (!target->gpu.has_snapshot()) {
    (void)plan_up<Tier::kGpu>(target, Held::kSnapshot, promote);
    a.snapshot_from_host = true;
  }
  // Refused: cancel_ops() put the path back as it was; the refusal goes to the caller.
  if (Status s = submit_link<Tier::kGpu>(std::move(promote)); !s) return undo(s);
  // Recency and frequency: the KV of the whole path, but only the snapshot resumed from (the
  // intermediate ones on the path then leave first).
  for (Node* n : path) touch(n);
  note_resume(target);
  touch_snapshot(target);
  a.cached_tokens = target->boundary;
  return a;
}

TransferState PrefixCache::lock_state(const LockRecord& r) const {
  // Only the reused prefix (root to the resume snapshot) is waited for. What the request
  // inserted below it is its own: a tombstone there (a promotion another admission started
  // that failed, under pages this request kept) must not move its lock (rule 9).
  if (r.snap_node == nullptr) return TransferState::kDone;
  // The snapshot: done once the live slot holds it (the fill landed); until then the fill is
  // in flight (ordered after the snapshot's own arrival) or waits for its promotion to start.
  bool pending = false, lost = r.fill_failed;
  if (r.filled != r.snap_node) {
    pending = true;
    lost |= !r.snap_node->gpu.has_snapshot();
  }
  for (const Node* n = r.snap_node; n != nullptr && !n->is_root(); n = n->parent) {
    pending |= n->kv_to_gpu();
    lost |= !n->gpu.has_kv();
  }
  if (lost) return TransferState::kFailed;
  return pending ? TransferState::kPending : TransferState::kDone;
}

bool PrefixCache::prefix_lost(const LockRecord& r) const {
  if (r.snap_node == nullptr) return false;
  if (r.filled != r.snap_node && !r.snap_node->gpu.has_snapshot()) return true;
  for (const Node* n = r.snap_node; !n->is_root(); n = n->parent) {
    if (!n->gpu.has_kv()) return true;
  }
  return false;
}

Result<TransferState> PrefixCache::poll(LockId lock) {
  auto found = find_lock(lock);
  if (!found) return found.status();
  LockRecord& rec = requests_.at(lock);
  StreamScope scope(this, rec.stream);
  poll();
  return lock_state(rec);
}

void PrefixCache::give_back_slot(LockRecord& rec, GpuSlotId slot) {
  if (rec.live == slot) rec.live = GpuSlotId();  // nothing refers to it any more
  requests_.slot_owner.remove(slot);
  gpu_.slots.give_back(slot);
}

void PrefixCache::wait_promotions(const LockRecord& r) {
  // The reused prefix only (see lock_state). Locked nodes never leave the tree, so the walk
  // survives what the copies change.
  if (r.snap_node == nullptr) return;
  // Store reads first: each that arrives goes on to GPU as a promotion, waited for below. A
  // staged load is waited for whole (its chunks land on GPU themselves).
  for (Node* n = r.snap_node; n != nullptr && !n->is_root(); n = n->parent) {
    if (n->kv_xfer == Xfer::kLoad || n->kv_xfer == Xfer::kStage) wait_kv_copy(n);
  }
  const Xfer snap = r.snap_node->snap_xfer;
  if (snap == Xfer::kLoad || snap == Xfer::kStage) wait_snapshot_copy(r.snap_node);
  for (Node* n = r.snap_node; n != nullptr && !n->is_root(); n = n->parent) {
    if (n->kv_xfer == Xfer::kPromote) wait_transfer(n->kv_xfer_id);
  }
  if (r.snap_node->snap_xfer == Xfer::kPromote) wait_transfer(r.snap_node->snap_xfer_id);
}

Result<std::size_t> PrefixCache::wait(LockId lock) {
  auto found = find_lock(lock);
  if (!found) return found.status();
  LockRecord& rec = requests_.at(lock);
  StreamScope scope(this, rec.stream);
  // Each resume moves the lock to a strictly shallower boundary, so this ends.
  for (;;) {
    wait_promotions(rec);
    poll();  // reaps them; a fill deferred for a store read is submitted now
    if (rec.fill_xfer != 0) wait_device_copy(rec.fill_xfer);
    const TransferState state = lock_state(rec);
    if (state == TransferState::kDone) {
      return rec.snap_node ? rec.snap_node->boundary : std::size_t{0};
    }
    if (state == TransferState::kPending) continue;  // a store read started a promotion
    if (!prefix_lost(rec)) {
      // Only the fill failed (its source is intact): the request resumes from the root.
      fill_failed_to_root(rec);
      return std::size_t{0};
    }
    if (Status s = resume_earlier(lock, rec); !s) return s;
  }
}

Status PrefixCache::resume_earlier(LockId lock, LockRecord& rec) {
  assert(rec.fill_xfer == 0);  // wait() reaped it: one fill into the live slot at a time
  Node* const old_node = rec.node;
  Node* const old_snap = rec.snap_node;
  // Rule 1 on the locked path: the boundaries above the failure whose KV all arrived (no
  // promotion is pending on the path any more) and which still have a snapshot.
  std::vector<Node*> candidates;
  for (Node* n : RadixTree::path_of(old_snap ? old_snap : old_node)) {
    if (!n->gpu.has_kv()) break;
    if (n != old_snap && n->has_snapshot()) candidates.push_back(n);
  }
  Node* target = nullptr;
  for (auto it = candidates.rbegin(); it != candidates.rend() && target == nullptr; ++it) {
    Result<Admission> a = try_admit_at(*it);
    if (a) {
      target = *it;
    } else if (a.status().code() == ErrorCode::kTransferFailed) {
      // The engine refused the snapshot's promotion: the lock stays where it is.
      return Status(ErrorCode::kTransferFailed, "wait: " + a.status().message());
    }
  }
  // try_admit_at locked and pinned the new target; now leave the old position.
  if (target == nullptr) {
    lock_path(rec.root);
    if (rec.live.valid()) give_back_slot(rec, rec.live);  // resumes from nothing
  }
  if (old_snap && rec.filled != old_snap) {
    --old_snap->snapshot_lock;
    refresh(old_snap);
  }
  unlock_path(old_node);
  rec.node = target ? target : rec.root;
  rec.snap_node = target;
  rec.fill_failed = false;
  if (target) raise_priority(target, rec.priority, false, true);
  // The failed nodes below the new position leave the tree (it stops at the new lock);
  // old_node and old_snap may be freed here.
  remove_if_empty(old_node);
  if (target) submit_fill(lock, rec);  // the new snapshot into the live slot
  return Status::ok();
}

Result<std::vector<GpuPageId>> PrefixCache::path_pages(LockId lock) const {
  auto rec = find_lock(lock);
  if (!rec) return rec.status();
  std::vector<GpuPageId> pages;
  // Before the copies land, only to a caller whose stream waits for them (stream_wait()):
  // the ids are fixed at admission, the bytes are not there yet.
  const bool early = (*rec)->stream_waited && lock_state(**rec) != TransferState::kFailed;
  for (Node* n : RadixTree::path_of((*rec)->node)) {
    if (!n->gpu.has_kv() || (n->kv_to_gpu() && !early)) {
      return Status(ErrorCode::kFailedPrecondition,
                    "path_pages: the prefix is not on GPU yet (wait() for the promotion, or "
                    "stream_wait() to read it on a stream)");
    }
    pages.insert(pages.end(), n->gpu.pages.begin(), n->gpu.pages.end());
  }
  return pages;
}

Result<GpuSlotId> PrefixCache::path_snapshot(LockId lock) const {
  auto rec = find_lock(lock);
  if (!rec) return rec.status();
  const Node* n = (*rec)->snap_node;
  if (n == nullptr) return not_found("path_snapshot: the admission matched nothing");
  // Before the fill lands, only to a caller whose stream waits for it (stream_wait()).
  const bool early = (*rec)->stream_waited && (*rec)->fill_xfer != 0;
  if ((*rec)->filled != n && !early) {
    return Status(ErrorCode::kFailedPrecondition,
                  "path_snapshot: the snapshot is not in the live slot yet (wait() for the copy, "
                  "or stream_wait() to read it on a stream)");
  }
  if (!(*rec)->live.valid()) {
    return Status(ErrorCode::kFailedPrecondition,
                  "path_snapshot: the request gave its live slot back (free_snapshot_slot or "
                  "insert)");
  }
  return (*rec)->live;
}

}  // namespace radixtier
