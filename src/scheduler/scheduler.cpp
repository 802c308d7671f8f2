// The reference scheduler (see scheduler.hpp for the request state machine).
#include "radixtier/scheduler/scheduler.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace radixtier::sched {

struct Scheduler::Running {
  Request req;
  RequestResult res;
  LockId lock;
  std::vector<GpuPageId> table;   ///< page i holds positions [i*ps, (i+1)*ps)
  std::vector<bool> owned;        ///< table[i] is this request's (not the tree's): free at stop
  std::vector<Token> seq;         ///< prompt + output so far
  std::size_t done = 0;           ///< positions whose K/V are computed (the live state's position)
  std::size_t inserted = 0;       ///< boundary the lock has moved down to
  std::size_t checkpoint_at = 0;  ///< boundary of the executor's checkpoint (0: none)
  std::uint64_t host_free_bytes = 0;  ///< at admission: the placement budget's (fixed per run)
  bool prefilled = false;
  /// Started with stream_wait: the reused prefix's copies may still fail; poll(lock) is
  /// checked after the first forward, before anything computed from it is committed.
  bool unconfirmed = false;
};

Status SchedulerConfig::validate(std::uint32_t page_size) const {
  if (page_size == 0) return invalid_argument("SchedulerConfig: the cache's page_size is 0");
  if (chunk_tokens == 0 || chunk_tokens % page_size != 0) {
    return invalid_argument("SchedulerConfig.chunk_tokens = " + std::to_string(chunk_tokens) +
                            ": must be a positive multiple of the page size (" +
                            std::to_string(page_size) + " tokens)");
  }
  if (forward_tokens % chunk_tokens != 0) {
    return invalid_argument("SchedulerConfig.forward_tokens = " + std::to_string(forward_tokens) +
                            ": must be a multiple of chunk_tokens (" +
                            std::to_string(chunk_tokens) + "), or 0 for chunk_tokens");
  }
  if (max_running == 0) return invalid_argument("SchedulerConfig.max_running must be >= 1");
  if (max_admissions == 0) return invalid_argument("SchedulerConfig.max_admissions must be >= 1");
  if (decode_checkpoint_interval % page_size != 0) {
    return invalid_argument("SchedulerConfig.decode_checkpoint_interval = " +
                            std::to_string(decode_checkpoint_interval) +
                            ": must be a multiple of the page size (" + std::to_string(page_size) +
                            " tokens), or 0 for every page");
  }
  if (Status s = policy.validate(page_size); !s) {
    return invalid_argument("SchedulerConfig.policy: " + s.message());
  }
  return Status::ok();
}

Scheduler::Scheduler(CacheBackend& cache, Executor& executor, SchedulerConfig config)
    : cache_(cache),
      executor_(executor),
      config_(std::move(config)),
      page_size_(cache.page_size()),
      learner_(page_size_) {
  if (Status s = config_.validate(page_size_); !s) throw std::invalid_argument(s.message());
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(CacheBackend& cache, Executor& executor,
                                                     SchedulerConfig config) {
  if (Status s = config.validate(cache.page_size()); !s) return s;
  return std::make_unique<Scheduler>(cache, executor, std::move(config));
}

Scheduler::~Scheduler() {
  // Hand everything back so the cache's counts add up even when a caller stops early.
  for (auto& r : running_) stop(*r);
}

Status Scheduler::submit(Request request) {
  if (request.prompt.empty()) {
    return invalid_argument("submit: request " + std::to_string(request.id) +
                            " has an empty prompt");
  }
  if (!known_ids_.insert(request.id).second) {
    return invalid_argument("submit: request id " + std::to_string(request.id) + " already used");
  }
  RequestResult res;
  res.id = request.id;
  res.prompt_tokens = request.prompt.size();
  res.arrival_s = request.arrival_s;
  // Stable by arrival: after every queued request that arrives no later.
  auto it = std::upper_bound(queue_.begin(), queue_.end(), request.arrival_s,
                             [](double t, const auto& q) { return t < q.first.arrival_s; });
  queue_.emplace(it, std::move(request), std::move(res));
  return Status::ok();
}

double Scheduler::next_step_s() const {
  if (running_.empty() && !queue_.empty()) return std::max(now_, queue_.front().first.arrival_s);
  return now_;
}

const RequestResult* Scheduler::result(RequestId id) const {
  auto it = results_.find(id);
  return it == results_.end() ? nullptr : &it->second;
}

void Scheduler::note_stats(RequestResult& result, const CacheStats& before) {
  const CacheStats after = cache_.stats();
  result.bytes_h2d += after.bytes_h2d - before.bytes_h2d;
  result.bytes_d2h += after.bytes_d2h - before.bytes_d2h;
  // Where the cache waited for a copy on this thread, the step could not go on meanwhile.
  const double wait_s =
      executor_.copy_wait_seconds(after.alloc_wait_copies - before.alloc_wait_copies,
                                  after.alloc_wait_bytes - before.alloc_wait_bytes);
  now_ += wait_s;
  stats_.copy_wait_s += wait_s;
  const double store_wait_s =
      executor_.store_wait_seconds(after.store_copy_waits - before.store_copy_waits,
                                   after.store_wait_bytes - before.store_wait_bytes);
  now_ += store_wait_s;
  stats_.store_wait_s += store_wait_s;
}

Progress Scheduler::progress() const {
  return Progress{known_ids_.size(),
                  static_cast<std::size_t>(stats_.finished),
                  static_cast<std::size_t>(stats_.failed),
                  running_.size(),
                  queue_.size(),
                  stats_.forwarded_tokens,
                  now_};
}

// ---------------------------------------------------------------------------------------
// admission

void Scheduler::admit_arrived() {
  while (!hold_admission_ && running_.size() < config_.max_running && !queue_.empty() &&
         queue_.front().first.arrival_s <= now_) {
    auto [req, res] = std::move(queue_.front());
    queue_.pop_front();
    (void)admit(std::move(req), std::move(res));
  }
}

Status Scheduler::admit(Request request, RequestResult res) {
  auto give_up = [&](Status why) {
    res.status = std::move(why);
    res.finished_s = now_;
    ++stats_.failed;
    results_[request.id] = std::move(res);
    return Status::ok();
  };
  for (;;) {
    if (res.admissions >= config_.max_admissions) {
      return give_up(Status(ErrorCode::kFailedPrecondition,
                            "request " + std::to_string(request.id) + " gave up after " +
                                std::to_string(res.admissions) + " admissions (" +
                                std::to_string(res.transfer_failures) + " failed promotions, " +
                                std::to_string(res.preemptions) + " preemptions)"));
    }
    if (shared_ != nullptr) {
      const SharedFetch f = shared_->before_admit(request.id, request.prompt, request.ns);
      res.shared_tokens = f.tokens;
      res.shared_bytes = f.bytes;
      res.shared_s = f.seconds;
    }
    const CacheStats before = cache_.stats();
    auto a =
        cache_.admit(request.prompt, RequestOptions{request.ns, request.priority, config_.stream});
    if (!a) return give_up(a.status());
    ++res.admissions;
    ++stats_.admissions;
    // A resumed prefix still arriving: the forward starts now, its stream ordered after the
    // copies on the device (layer L's KV before the forward reads layer L; the snapshot and
    // its copy into the live slot with the first wait). A copy already known to have failed
    // goes through wait() below, as without streams.
    bool streamed = false;
    if (config_.use_stream_wait && cache_.supports_stream_wait() && a->promoting &&
        a->cached_tokens > 0) {
      Status sw = Status::ok();
      if (config_.forward_layers == 0) {
        sw = cache_.stream_wait(a->lock, config_.stream, std::nullopt);
      } else {
        for (std::uint32_t layer = 0; layer < config_.forward_layers && sw; ++layer)
          sw = cache_.stream_wait(a->lock, config_.stream, layer);
      }
      streamed = sw.is_ok();
      if (!sw && sw.code() != ErrorCode::kTransferFailed) {
        (void)cache_.release(a->lock);
        return give_up(sw);
      }
    }
    // wait() also reports a promotion that already failed, so call it even when not promoting.
    auto w = streamed ? Result<std::size_t>(a->cached_tokens) : cache_.wait(a->lock);
    if (!w && w.status().code() == ErrorCode::kTransferFailed) {
      // A backend that cannot resume: the failed prefix degraded to recompute; a new
      // admission matches less.
      (void)cache_.release(a->lock);
      note_stats(res, before);
      ++res.transfer_failures;
      ++stats_.transfer_failures;
      continue;
    }
    if (w && *w < a->cached_tokens) {
      // Rule 7: part of the match failed to arrive and the cache resumed the request at the
      // deepest boundary of its path still usable. GPU KV comes first along a path (eviction
      // is leaf-first), so the GPU part of the shorter match is what was on GPU of it.
      a->gpu_tokens = std::min(a->gpu_tokens, *w);
      a->host_tokens = *w - a->gpu_tokens;
      a->cached_tokens = *w;
      ++res.transfer_failures;
      ++stats_.transfer_failures;
    }
    auto running = std::make_unique<Running>();
    Running& r = *running;
    r.lock = a->lock;
    std::optional<GpuSlotId> restore;
    Status ok = w.status();
    if (ok && a->cached_tokens > 0) {
      auto pages = cache_.path_pages(a->lock);
      auto slot = cache_.path_snapshot(a->lock);
      if (!pages)
        ok = pages.status();
      else if (!slot)
        ok = slot.status();
      else {
        r.table = std::move(*pages);
        restore = *slot;
      }
    }
    if (ok) ok = executor_.begin(request.id, restore);
    const CacheStats after = cache_.stats();
    note_stats(res, before);
    if (!ok) {
      executor_.end(request.id);
      (void)cache_.release(a->lock);
      return give_up(std::move(ok));
    }
    res.admit_bytes_h2d = after.bytes_h2d - before.bytes_h2d;
    res.admit_copies_h2d = after.copies_h2d - before.copies_h2d;
    res.admit_bytes_d2h = after.bytes_d2h - before.bytes_d2h;
    res.admit_store_reads = after.store_reads - before.store_reads;
    res.admit_bytes_from_store = after.bytes_from_store - before.bytes_from_store;
    res.store_cached_tokens =
        static_cast<std::size_t>(after.hit_tokens_store - before.hit_tokens_store);
    res.cached_tokens = a->cached_tokens;
    res.kv_tokens = std::max(a->kv_tokens, a->cached_tokens);
    learner_.observe_admission(request.prompt, res.cached_tokens, res.kv_tokens);
    learner_.observe_prompt(request.prompt, config_.chunk_tokens, res.kv_tokens);
    res.gpu_cached_tokens = a->gpu_tokens;
    res.host_cached_tokens = a->host_tokens;
    res.snapshot_from_host = a->snapshot_from_host;
    res.recomputed_tokens = request.prompt.size() - a->cached_tokens;
    res.admitted_s = now_;
    res.prefill_s = res.decode_s = 0;
    res.output.clear();
    res.first_logits.clear();
    res.final_logits.clear();
    r.owned.assign(r.table.size(), false);
    r.seq = request.prompt;
    r.done = r.inserted = a->cached_tokens;
    r.host_free_bytes = cache_.host_bytes_free();
    r.unconfirmed = streamed;
    r.req = std::move(request);
    r.res = std::move(res);
    running_.push_back(std::move(running));
    return Status::ok();
  }
}

// ---------------------------------------------------------------------------------------
// running

Result<std::vector<GpuPageId>> Scheduler::alloc_pages(Running& r, std::size_t n) {
  const CacheStats before = cache_.stats();
  auto pages = cache_.alloc_pages(r.lock, n);
  note_stats(r.res, before);
  if (pages) {
    for (GpuPageId p : *pages) {
      r.table.push_back(p);
      r.owned.push_back(true);
    }
  }
  return pages;
}

Status Scheduler::insert_boundary(Running& r, std::size_t boundary, StateSource source) {
  std::optional<GpuSlotId> slot;
  if (source != StateSource::kNone) {
    const CacheStats before = cache_.stats();
    ++stats_.snapshots_offered;
    auto s = cache_.alloc_snapshot_slot(r.lock);
    if (s) {
      Status saved = source == StateSource::kLive ? executor_.save_snapshot(r.req.id, *s)
                                                  : executor_.save_checkpoint(r.req.id, *s);
      if (saved) {
        slot = *s;
      } else {
        (void)cache_.free_snapshot_slot(r.lock, *s);
      }
    } else {
      ++stats_.snapshot_slot_misses;  // a snapshot is optional: keep going without one
    }
    note_stats(r.res, before);
  }
  return insert_boundary(r, boundary, slot);
}

Status Scheduler::insert_boundary(Running& r, std::size_t boundary, std::optional<GpuSlotId> slot) {
  const CacheStats before = cache_.stats();
  const std::size_t pages = boundary / page_size_;
  auto ins = cache_.insert(r.lock, std::span<const Token>(r.seq).first(boundary),
                           std::span<const GpuPageId>(r.table).first(pages), slot);
  if (!ins) {
    if (slot) (void)cache_.free_snapshot_slot(r.lock, *slot);
    note_stats(r.res, before);
    return ins.status();
  }
  // Pages the tree adopted are the tree's now; the ones it did not take are still ours. When
  // the cache has a tree, the lock now pins its pages for [0, boundary): where it kept its
  // own copy of the same prefix, switch the page table to it (same tokens at the same
  // positions, same bytes) and free ours instead of holding the prefix twice.
  auto tree = cache_.path_pages(r.lock);
  const bool use_tree = tree && tree->size() == pages;
  std::vector<GpuPageId> kept = ins->not_taken;
  std::sort(kept.begin(), kept.end());
  std::vector<GpuPageId> duplicates;
  for (std::size_t i = 0; i < pages; ++i) {
    if (!r.owned[i]) continue;
    if (!std::binary_search(kept.begin(), kept.end(), r.table[i])) {
      r.owned[i] = false;  // adopted
    } else if (use_tree && (*tree)[i] != r.table[i]) {
      duplicates.push_back(r.table[i]);
      r.table[i] = (*tree)[i];
      r.owned[i] = false;
    }
  }
  if (Status s = cache_.free_pages(r.lock, duplicates); !s) {
    note_stats(r.res, before);
    return s;
  }
  if (slot) {
    if (ins->snapshot_taken) {
      ++r.res.snapshots_kept;
      ++stats_.snapshots_kept;
      r.res.snapshot_boundaries.push_back(boundary);
    } else {
      (void)cache_.free_snapshot_slot(r.lock, *slot);  // the tree already had one there
    }
  }
  r.inserted = boundary;
  note_stats(r.res, before);
  return Status::ok();
}

std::size_t Scheduler::plan_forward(const Running& r, const SnapshotQuery& query,
                                    std::vector<std::size_t>& captures) const {
  captures.clear();
  const std::size_t len = r.req.prompt.size();
  const std::size_t last_boundary = len / page_size_ * page_size_;
  const std::size_t start = r.done;
  if (start >= last_boundary) return len;  // the short chunk after the last page boundary
  const std::size_t chunk = config_.chunk_tokens;
  const std::size_t origin = config_.chunk_origin == ChunkOrigin::kResume ? r.res.cached_tokens : 0;
  auto next_grid = [&](std::size_t b) { return origin + ((b - origin) / chunk + 1) * chunk; };
  const std::size_t chunks = std::max<std::size_t>(1, config_.forward_tokens / chunk);
  const std::size_t first = next_grid(start), span = (chunks - 1) * chunk;  // span <= forward
  std::size_t end =
      first >= last_boundary || last_boundary - first <= span ? last_boundary : first + span;
  const std::size_t granularity = executor_.capture_granularity();
  SnapshotQuery q = query;
  for (std::size_t b = start;;) {
    std::size_t next = std::min(next_grid(b), end);
    if (auto cut = config_.policy.next_cut(q, b); cut && *cut < next) next = *cut;
    if (next >= end) return end;
    b = next;
    q.boundary = b;
    q.last_prompt_chunk = false;
    if (!config_.policy.keep(q)) continue;  // its KV goes in with the forward's end
    if (granularity == 0 || (b - start) % granularity != 0) return b;
    captures.push_back(b);
  }
}

Scheduler::Outcome Scheduler::prefill_chunk(Running& r) {
  const std::size_t len = r.req.prompt.size();
  const std::size_t last_boundary = len / page_size_ * page_size_;
  const std::size_t start = r.done;
  SnapshotQuery q = query(r);
  std::vector<std::size_t> kept;
  std::size_t end = plan_forward(r, q, kept);
  const std::size_t need = (end + page_size_ - 1) / page_size_;
  if (need > r.table.size()) {
    auto pages = alloc_pages(r, need - r.table.size());
    if (!pages) {
      if (pages.status().code() == ErrorCode::kOutOfMemory) return Outcome::kStalled;
      fail(r, pages.status());
      return Outcome::kFailed;
    }
  }
  // A slot for each state the forward captures. Where the pool has none free (the slots
  // this forward took are not the tree's yet, so nothing can be demoted to make room), the
  // forward ends there instead: after it, the tree's snapshots can make room for the live
  // state, as between chunk-sized forwards.
  std::vector<StateCapture> captures;
  if (!kept.empty()) {
    const CacheStats before = cache_.stats();
    for (std::size_t b : kept) {
      auto slot = cache_.alloc_snapshot_slot(r.lock);
      if (!slot) {
        if (slot.status().code() != ErrorCode::kOutOfMemory) {
          note_stats(r.res, before);
          fail(r, slot.status());  // releasing the lock frees the slots taken so far
          return Outcome::kFailed;
        }
        end = b;
        break;
      }
      ++stats_.snapshots_offered;
      captures.push_back({b, *slot});
    }
    note_stats(r.res, before);
  }
  auto forward = [&] {
    return executor_.forward_capturing(
        r.req.id, std::span<const Token>(r.req.prompt).subspan(start, end - start), start, r.table,
        captures);
  };
  auto secs = forward();
  if (!secs && !captures.empty()) {
    // The executor refused the captures (nothing ran): a snapshot is optional, so end the
    // forward at the first of them instead and keep the live state there.
    for (const StateCapture& c : captures) (void)cache_.free_snapshot_slot(r.lock, c.slot);
    stats_.snapshots_offered -= captures.size();
    end = captures.front().position;
    captures.clear();
    secs = forward();
  }
  if (!secs) {
    fail(r, secs.status());
    return Outcome::kFailed;
  }
  if (r.unconfirmed) {
    // Before anything computed from the reused prefix is committed (insert, sampling).
    if (Outcome o = confirm_prefix(r); o != Outcome::kProgress) return o;
  }
  now_ += *secs;
  r.res.prefill_s += *secs;
  r.res.computed_tokens += end - start;
  stats_.forwarded_tokens += end - start;
  r.done = end;
  for (const StateCapture& c : captures) {
    const std::uint64_t kept_before = stats_.snapshots_kept;
    if (Status s = insert_boundary(r, c.position, c.slot); !s) {
      fail(r, s);  // releasing the lock frees the slots not inserted yet
      return Outcome::kFailed;
    }
    stats_.snapshots_captured += stats_.snapshots_kept - kept_before;
  }
  if (end % page_size_ == 0 && end > r.inserted) {
    q.boundary = end;
    q.last_prompt_chunk = end == last_boundary;
    const bool keep = config_.policy.keep(q);
    if (Status s = insert_boundary(r, end, keep ? StateSource::kLive : StateSource::kNone); !s) {
      fail(r, s);
      return Outcome::kFailed;
    }
  }
  if (end < len) return Outcome::kProgress;
  r.prefilled = true;
  const auto logits = executor_.last_logits(r.req.id);
  r.res.first_logits.assign(logits.begin(), logits.end());
  r.res.first_token_s = now_;
  return r.req.max_new_tokens > 0 ? emit_token(r) : Outcome::kProgress;
}

SnapshotQuery Scheduler::query(const Running& r) const {
  SnapshotQuery q;
  q.prompt_tokens = r.req.prompt.size();
  q.cached_tokens = r.res.cached_tokens;
  q.branch_tokens = r.res.kv_tokens;
  q.snapshot_bytes = executor_.state_bytes();
  q.kv_bytes_per_token = config_.kv_bytes_per_token;
  q.page_size = page_size_;
  q.chunk_tokens = config_.chunk_tokens;
  q.alignment = learner_.alignment();
  q.keep_finish = learner_.keep_finish();
  q.keep_prompt_end = learner_.keep(BoundaryKind::kPromptEnd);
  q.keep_tail = learner_.keep(BoundaryKind::kTail);
  q.keep_chunks = learner_.keep(BoundaryKind::kChunk);
  q.output_tokens = r.req.max_new_tokens;
  q.host_free_bytes = r.host_free_bytes;
  return q;
}

Scheduler::Outcome Scheduler::emit_token(Running& r) {
  auto tok = executor_.next_token(r.req.id);
  if (!tok) {
    fail(r, tok.status());
    return Outcome::kFailed;
  }
  r.res.output.push_back(*tok);
  r.seq.push_back(*tok);
  return Outcome::kProgress;
}

Scheduler::Outcome Scheduler::decode_token(Running& r) {
  const std::size_t pos = r.done;
  if (pos / page_size_ + 1 > r.table.size()) {
    auto pages = alloc_pages(r, 1);
    if (!pages) {
      if (pages.status().code() == ErrorCode::kOutOfMemory) return Outcome::kStalled;
      fail(r, pages.status());
      return Outcome::kFailed;
    }
  }
  const Token token = r.seq[pos];
  auto secs = executor_.forward(r.req.id, std::span<const Token>(&token, 1), pos, r.table);
  if (!secs) {
    fail(r, secs.status());
    return Outcome::kFailed;
  }
  now_ += *secs;
  r.res.decode_s += *secs;
  ++r.res.computed_tokens;
  ++stats_.forwarded_tokens;
  r.done = pos + 1;
  const std::size_t every =
      config_.decode_checkpoint_interval > 0 ? config_.decode_checkpoint_interval : page_size_;
  if (config_.snapshot_at_finish && r.done % every == 0) {
    if (Status s = executor_.checkpoint(r.req.id); !s) {
      fail(r, s);
      return Outcome::kFailed;
    }
    r.checkpoint_at = r.done;
    if (config_.insert_decode_checkpoints && r.done > r.inserted) {
      if (Status st = insert_boundary(r, r.done, StateSource::kCheckpoint); !st) {
        fail(r, st);
        return Outcome::kFailed;
      }
    }
  }
  return emit_token(r);
}

Scheduler::Outcome Scheduler::finish(Running& r) {
  const auto logits = executor_.last_logits(r.req.id);
  r.res.final_logits.assign(logits.begin(), logits.end());
  // The finish boundary: the last checkpoint boundary (every page, or every
  // decode_checkpoint_interval tokens) of what was forwarded (prompt + output but the last
  // output token). Decode checkpointed the state there.
  const std::size_t every =
      config_.decode_checkpoint_interval > 0 ? config_.decode_checkpoint_interval : page_size_;
  const std::size_t boundary = r.done / every * every;
  // Only a finish boundary beyond the prompt's own pages is a finish snapshot's place.
  if (config_.snapshot_at_finish && boundary > r.req.prompt.size() / page_size_ * page_size_) {
    learner_.observe_finish(std::span<const Token>(r.seq).first(boundary));
  }
  if (config_.snapshot_at_finish && boundary > r.inserted && r.checkpoint_at == boundary) {
    SnapshotQuery q = query(r);
    q.boundary = boundary;
    q.at_finish = true;
    if (config_.policy.keep(q)) {
      if (Status s = insert_boundary(r, boundary, StateSource::kCheckpoint); !s) {
        fail(r, s);
        return Outcome::kFailed;
      }
    }
  }
  r.res.finished_s = now_;
  stop(r);
  if (shared_ != nullptr) {
    shared_->after_finish(r.req.id, std::span<const Token>(r.seq).first(r.inserted), r.req.ns);
  }
  ++stats_.finished;
  results_[r.req.id] = std::move(r.res);
  hold_admission_ = false;
  return Outcome::kFinished;
}

Scheduler::Outcome Scheduler::advance(Running& r) {
  if (!r.prefilled) {
    Outcome o = prefill_chunk(r);
    if (o != Outcome::kProgress || !r.prefilled || !r.res.output.empty() ||
        r.req.max_new_tokens > 0) {
      return o;
    }
    return finish(r);  // prefill only
  }
  if (r.res.output.size() < r.req.max_new_tokens) return decode_token(r);
  return finish(r);
}

void Scheduler::stop(Running& r) {
  std::vector<GpuPageId> mine;
  for (std::size_t i = 0; i < r.table.size(); ++i) {
    if (r.owned[i]) mine.push_back(r.table[i]);
  }
  const CacheStats before = cache_.stats();
  (void)cache_.free_pages(r.lock, mine);
  (void)cache_.release(r.lock);
  note_stats(r.res, before);
  executor_.end(r.req.id);
  r.table.clear();
  r.owned.clear();
}

void Scheduler::fail(Running& r, Status why) {
  stop(r);
  r.res.status = std::move(why);
  r.res.finished_s = now_;
  ++stats_.failed;
  results_[r.req.id] = std::move(r.res);
  hold_admission_ = false;
}

Scheduler::Outcome Scheduler::confirm_prefix(Running& r) {
  auto state = cache_.poll(r.lock);
  if (state && *state == TransferState::kPending) {
    // The forward ran on the stream after the copies; a host engine reports them late.
    auto w = cache_.wait(r.lock);
    if (w && *w == r.res.cached_tokens)
      state = TransferState::kDone;
    else
      state = TransferState::kFailed;
  }
  if (!state) {
    fail(r, state.status());
    return Outcome::kFailed;
  }
  if (*state == TransferState::kDone) {
    r.unconfirmed = false;
    return Outcome::kProgress;
  }
  // A copy of the prefix failed after the forward started: what it computed is discarded and
  // the request is admitted again (it matches less and recomputes the rest; rule 7).
  ++r.res.transfer_failures;
  ++stats_.transfer_failures;
  stop(r);
  queue_.emplace_front(std::move(r.req), std::move(r.res));
  return Outcome::kFailed;  // leaves running_ (its result is not recorded: it runs again)
}

void Scheduler::preempt(Running& r) {
  stop(r);
  ++r.res.preemptions;
  ++stats_.preemptions;
  queue_.emplace_front(std::move(r.req), std::move(r.res));
  hold_admission_ = true;
}

// ---------------------------------------------------------------------------------------
// the loop

Status Scheduler::step() {
  ++stats_.steps;
  if (running_.empty() && !queue_.empty() && queue_.front().first.arrival_s > now_) {
    now_ = queue_.front().first.arrival_s;  // idle: jump to the next arrival
  }
  admit_arrived();
  bool progressed = false, stalled = false;
  for (std::size_t i = 0; i < running_.size();) {
    Outcome o = advance(*running_[i]);
    if (o == Outcome::kFinished || o == Outcome::kFailed) {
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      progressed = true;
      continue;
    }
    if (o == Outcome::kStalled) {
      stalled = true;
      ++stats_.stalls;
    } else {
      progressed = true;
    }
    ++i;
  }
  if (stalled && !progressed) {
    // Nobody can move: the GPU holds only what running requests pin. Free the youngest
    // request's pages (it is re-admitted and resumes from what it inserted); if it is the
    // only one, it cannot fit at all.
    Running& victim = *running_.back();
    if (running_.size() > 1) {
      preempt(victim);
    } else {
      fail(victim, out_of_memory("request " + std::to_string(victim.req.id) + " (" +
                                 std::to_string(victim.req.prompt.size()) + " prompt tokens + " +
                                 std::to_string(victim.req.max_new_tokens) +
                                 " output) does not fit in the GPU KV pool even running alone"));
    }
    running_.pop_back();
  }
  if (config_.check_invariants) {
    if (std::string err = cache_.check_invariants(); !err.empty()) {
      return Status(ErrorCode::kFailedPrecondition, "cache invariant broken: " + err);
    }
  }
  return Status::ok();
}

Status Scheduler::run_until_idle(const std::function<void(const Progress&)>& on_progress) {
  while (!idle()) {
    if (Status s = step(); !s) return s;
    if (on_progress) on_progress(progress());
  }
  return Status::ok();
}

}  // namespace radixtier::sched
