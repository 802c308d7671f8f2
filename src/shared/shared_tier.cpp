#include "radixtier/shared/shared_tier.hpp"

#include <algorithm>
#include <cstring>

#include "radixtier/shared/value_codec.hpp"
#include "shared/reply_pool.hpp"

namespace radixtier::shared {

namespace {

constexpr std::size_t kPooledReplyVectors = 4;              // concurrent fetches that reuse buffers
constexpr std::size_t kFetchWorkers = kPooledReplyVectors;  // fetches running at once
constexpr std::size_t kMaxQueuedFetches = 4 * kFetchWorkers;  // waiting for a worker

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// What the value of `kind` at the boundary after `pages` pages (`paths`: page_path_hashes)
/// says of itself: the header a reader expects and a writer encodes (value_codec.hpp).
ValueHeader value_id(const KeySpace& ks, ValueKind kind, const std::vector<PathHash>& paths,
                     std::size_t pages, std::uint32_t page_size, std::uint32_t index) {
  ValueHeader h;
  h.kind = kind;
  h.model = ks.model;
  h.ns = ks.ns;
  h.path = paths[pages];
  h.boundary = pages * page_size;
  h.tokens = kind == ValueKind::kKvPage ? page_size : 0;
  h.index = index;
  return h;
}

std::uint32_t chunk_count(std::size_t snapshot_bytes, std::size_t chunk_bytes) {
  return static_cast<std::uint32_t>((snapshot_bytes + chunk_bytes - 1) / chunk_bytes);
}

void put_u64(std::byte* at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
/// Bytes [off, off + len) of the concatenation of `parts`, as spans of them.
std::vector<std::span<const std::byte>> slice(std::span<const std::span<const std::byte>> parts,
                                              std::size_t off, std::size_t len) {
  std::vector<std::span<const std::byte>> out;
  for (std::span<const std::byte> p : parts) {
    if (len == 0) break;
    if (off >= p.size()) {
      off -= p.size();
      continue;
    }
    const std::size_t n = std::min(len, p.size() - off);
    out.push_back(p.subspan(off, n));
    off = 0;
    len -= n;
  }
  return out;
}

std::uint64_t get_u64(const std::byte* at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(at[i]) << (8 * i);
  return v;
}

}  // namespace

Status SharedTierConfig::validate() const {
  // Two deployments that leave these empty would share (and serve each other) KV bytes.
  if (model.model_id.empty() || model.weights_version.empty() || model.kv_dtype.empty())
    return invalid_argument(
        "SharedTierConfig.model: model_id, weights_version and kv_dtype must be set (they "
        "name what the bytes are: two deployments that left them empty would share KV)");
  if (model.page_size == 0 || model.page_bytes == 0 || model.snapshot_bytes == 0)
    return invalid_argument(
        "SharedTierConfig.model: page_size, page_bytes and snapshot_bytes "
        "must be set (the cache's geometry)");
  if (chunk_bytes == 0) return invalid_argument("SharedTierConfig.chunk_bytes must be > 0");
  if (probe_deadline.count() <= 0 || fetch_deadline.count() <= 0 || publish_deadline.count() <= 0)
    return invalid_argument("SharedTierConfig: every deadline must be > 0 ms");
  if (!(bandwidth > 0) || !(latency_s >= 0) || !(prefill_tokens_per_s > 0))
    return invalid_argument(
        "SharedTierConfig: bandwidth and prefill_tokens_per_s must be > 0, "
        "latency_s >= 0");
  if (max_probe_pages == 0) return invalid_argument("SharedTierConfig.max_probe_pages must be > 0");
  for (const auto& [id, key] : namespace_keys) {
    if (key.size() < kMinKeyBytes || key.size() > kMaxKeyBytes)
      return invalid_argument("SharedTierConfig.namespace_keys: namespace#" + std::to_string(id) +
                              "'s key must have " + std::to_string(kMinKeyBytes) + " to " +
                              std::to_string(kMaxKeyBytes) + " bytes");
    const bool shared =
        namespace_salts.count(id) > 0 || (share_default && id == kDefaultNamespace.value());
    if (!shared)
      return invalid_argument("SharedTierConfig.namespace_keys: namespace#" + std::to_string(id) +
                              " has a key but is not shared");
  }
  for (const auto& [id, salt] : namespace_salts) {
    if (salt.empty())
      return invalid_argument("SharedTierConfig.namespace_salts: namespace#" + std::to_string(id) +
                              " has an empty salt");
  }
  return Status::ok();
}

/// One fetch: its inputs (copied, so the worker shares nothing with the caller) and what
/// arrived whole.
struct SharedTier::Fetch {
  std::vector<Token> prompt;  ///< up to the deepest candidate
  NamespaceId ns;
  KeySpace space;
  std::vector<PathHash> paths;  ///< page_path_hashes of the prompt, to the deepest candidate
  std::vector<FetchCandidate> candidates;
  std::uint32_t page_size = 0;
  std::size_t snapshot_bytes = 0, chunk_bytes = 0;
  Deadline deadline;
  Clock::time_point started;
  bool done = false;  ///< guarded by SharedTier::fetch_mu_
  // results
  std::size_t boundary_page = 0;  ///< 0: nothing usable arrived
  std::size_t first_kv_page = 0;
  std::vector<std::byte> kv;  ///< pages [first_kv_page, boundary_page), page_bytes each
  std::vector<std::byte> snapshot;
  std::uint64_t bytes = 0, rejected = 0, missing = 0, fallbacks = 0;
};

/// One publish: values in write order (KV pages, snapshot chunks), then the manifests.
struct SharedTier::Job {
  std::vector<std::string> keys, values;
  /// keys[0, kv_pages) are the path's KV pages from the root; an empty value is a page
  /// published before whose host copy left: the tier must have it already.
  std::size_t kv_pages = 0;
  std::size_t first_manifest = 0;
  /// Per manifest (index >= first_manifest): its chunks' indices [first, first + count).
  std::vector<std::pair<std::size_t, std::size_t>> chunks_of;
  /// Per manifest: the KV pages below its snapshot.
  std::vector<std::size_t> pages_of;
  std::size_t bytes = 0;
};

Result<std::unique_ptr<SharedTier>> SharedTier::create(const SharedTierConfig& config,
                                                       PrefixCache& cache, HostPages& host,
                                                       SharedStore& store) {
  if (Status s = config.validate(); !s) return s;
  const CacheConfig& c = cache.config();
  if (config.model.page_size != c.page_size || config.model.page_bytes != c.page_bytes ||
      config.model.snapshot_bytes != c.snapshot_bytes || host.page_bytes() != c.page_bytes) {
    return invalid_argument("SharedTier: the model's geometry (page_size " +
                            std::to_string(config.model.page_size) + ", page_bytes " +
                            std::to_string(config.model.page_bytes) + ", snapshot_bytes " +
                            std::to_string(config.model.snapshot_bytes) + ") is not the cache's (" +
                            std::to_string(c.page_size) + ", " + std::to_string(c.page_bytes) +
                            ", " + std::to_string(c.snapshot_bytes) + ")");
  }
  return std::unique_ptr<SharedTier>(new SharedTier(config, cache, host, store));
}

SharedTier::SharedTier(const SharedTierConfig& config, PrefixCache& cache, HostPages& host,
                       SharedStore& store)
    : config_(config),
      cache_(cache),
      host_(host),
      store_(store),
      reply_pool_(
          std::make_unique<detail::ReplyPool>(kPooledReplyVectors, config.fetch_buffer_bytes)) {
  const std::uint64_t model = config.model.hash();
  auto space_of = [&](std::uint32_t id, const std::string& salt) {
    auto key = config.namespace_keys.find(id);
    if (key == config.namespace_keys.end()) return KeySpace{model, namespace_hash(salt), {}};
    return KeySpace{model, namespace_hash(salt, key->second), key->second};
  };
  if (config.share_default)
    spaces_[kDefaultNamespace.value()] = space_of(kDefaultNamespace.value(), "default");
  for (const auto& [id, salt] : config.namespace_salts) spaces_[id] = space_of(id, salt);
  publisher_ = std::thread([this] { publisher_loop(); });
  for (std::size_t i = 0; i < kFetchWorkers; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
  }
}

SharedTier::~SharedTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  publisher_.join();
  {
    std::lock_guard lock(fetch_mu_);
    fetch_stop_ = true;  // the workers run what is queued (each ends by its deadline), then stop
  }
  fetch_cv_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void SharedTier::worker_loop() {
  std::unique_lock lock(fetch_mu_);
  for (;;) {
    fetch_cv_.wait(lock, [this] { return fetch_stop_ || !fetch_queue_.empty(); });
    if (fetch_queue_.empty()) return;  // stopping, nothing left
    Fetch* f = fetch_queue_.front();
    fetch_queue_.pop_front();
    lock.unlock();
    run_fetch(*f, store_, *reply_pool_, cache_.config().page_bytes);
    lock.lock();
    f->done = true;
    done_cv_.notify_all();
  }
}

void SharedTier::reap_abandoned() {
  // A fetch whose finish() did not come within a fetch_deadline after its own deadline was
  // abandoned by its caller: its buffers go (finish() on it later finds nothing).
  const auto now = Clock::now();
  std::lock_guard lock(fetch_mu_);
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    if (it->second->done && now > it->second->deadline + config_.fetch_deadline) {
      it = fetches_.erase(it);
      std::lock_guard stats_lock(mu_);
      ++stats_.fetches_abandoned;
    } else {
      ++it;
    }
  }
}

const KeySpace* SharedTier::space(NamespaceId ns) const {
  auto it = spaces_.find(ns.value());
  return it == spaces_.end() ? nullptr : &it->second;
}

SharedTierStats SharedTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

// ---------------------------------------------------------------------------------------
// lookup and fetch

std::uint64_t SharedTier::lookup(std::span<const Token> prompt, NamespaceId ns) {
  const KeySpace* ks = space(ns);
  if (ks == nullptr || prompt.empty()) return 0;
  reap_abandoned();
  const auto match = cache_.peek(prompt, ns);
  if (!match) return 0;
  const CacheConfig& c = cache_.config();
  FetchPlanInput in;
  in.page_size = c.page_size;
  in.prompt_tokens = prompt.size();
  in.resume_tokens = match->usable_tokens;
  in.kv_tokens = std::max(match->kv_tokens, match->usable_tokens);
  in.page_bytes = c.page_bytes;
  in.snapshot_bytes = c.snapshot_bytes;
  in.bandwidth = config_.bandwidth;
  in.latency_s = config_.latency_s;
  const double tps = config_.prefill_tokens_per_s;
  in.recompute_s = [tps](std::size_t from, std::size_t to) { return double(to - from) / tps; };
  const ProbeRange range = probe_range(in, config_.min_tokens, config_.max_probe_pages);
  if (range.empty()) return 0;

  const Clock::time_point t0 = Clock::now();
  std::vector<PathHash> paths = page_path_hashes(prompt, c.page_size, range.end_page);
  std::vector<std::string> keys;
  for (std::size_t p = range.first_kv_page; p < range.end_page; ++p)
    keys.push_back(ks->kv_key(paths[p + 1]));
  const std::size_t n_kv = keys.size();
  for (std::size_t b = range.first_snapshot_page + 1; b <= range.end_page; ++b)
    keys.push_back(ks->manifest_key(paths[b]));
  std::vector<KeyState> states;
  try {
    states = store_.exists(keys, t0 + config_.probe_deadline);
  } catch (...) {
    states.clear();  // a store that threw: every key failed (nothing leaves lookup())
  }
  std::vector<bool> kv_shared(n_kv), snap_shared(keys.size() - n_kv);
  bool failed = false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const bool found = i < states.size() && states[i] == KeyState::kFound;
    failed = failed || i >= states.size() || states[i] == KeyState::kFailed;
    (i < n_kv ? kv_shared[i] : snap_shared[i - n_kv]) = found;
  }
  std::vector<FetchCandidate> candidates = plan_fetch(in, range, kv_shared, snap_shared);
  {
    std::lock_guard lock(mu_);
    ++stats_.lookups;
    stats_.probe_keys += keys.size();
    if (failed) ++stats_.probe_failures;
    if (!candidates.empty()) ++stats_.fetches;
  }
  if (candidates.empty()) return 0;
  {
    // Fetches waiting for a worker, at most kMaxQueuedFetches: past that, no fetch (a miss).
    std::lock_guard lock(fetch_mu_);
    if (fetch_queue_.size() >= kMaxQueuedFetches) {
      std::lock_guard stats_lock(mu_);
      --stats_.fetches;
      ++stats_.fetches_refused;
      return 0;
    }
  }

  auto f = std::make_unique<Fetch>();
  const std::size_t deepest = candidates.front().boundary_page;
  f->prompt.assign(prompt.begin(), prompt.begin() + std::ptrdiff_t(deepest * c.page_size));
  f->ns = ns;
  f->space = *ks;
  paths.resize(deepest + 1);
  f->paths = std::move(paths);
  f->candidates = std::move(candidates);
  f->page_size = c.page_size;
  f->snapshot_bytes = c.snapshot_bytes;
  f->chunk_bytes = config_.chunk_bytes;
  f->started = t0;
  f->deadline = Clock::now() + config_.fetch_deadline;
  const std::uint64_t id = next_fetch_++;
  {
    std::lock_guard lock(fetch_mu_);
    fetch_queue_.push_back(f.get());
    fetches_.emplace(id, std::move(f));
  }
  fetch_cv_.notify_one();
  return id;
}

void SharedTier::run_fetch(Fetch& f, SharedStore& store, detail::ReplyPool& pool,
                           std::size_t page_bytes) {
  // Nothing thrown (by a store, or std::bad_alloc) leaves the worker: the fetch is a miss.
  try {
    run_fetch_unguarded(f, store, pool, page_bytes);
  } catch (...) {
    f.boundary_page = 0;
    f.kv.clear();
    f.snapshot.clear();
    ++f.rejected;
  }
}

void SharedTier::run_fetch_unguarded(Fetch& f, SharedStore& store, detail::ReplyPool& pool,
                                     std::size_t page_bytes) {
  const std::uint32_t ps = f.page_size;
  const FetchCandidate& top = f.candidates.front();
  f.first_kv_page = top.first_kv_page;
  const std::uint32_t n_chunks = chunk_count(f.snapshot_bytes, f.chunk_bytes);
  auto header = [&](ValueKind kind, std::size_t pages, std::uint32_t index) {
    return value_id(f.space, kind, f.paths, pages, ps, index);
  };
  auto snapshot_keys = [&](std::size_t b, std::vector<std::string>& keys) {
    keys.push_back(f.space.manifest_key(f.paths[b]));
    for (std::uint32_t i = 0; i < n_chunks; ++i) keys.push_back(f.space.chunk_key(f.paths[b], i));
  };
  auto count = [&](const GetReply& r) {
    if (r.state == KeyState::kFound) f.bytes += r.value.size();
    if (r.state == KeyState::kMissing) ++f.missing;
  };
  // The snapshot at boundary page b from its manifest and chunks (replies[at...]).
  auto assemble = [&](std::size_t b, std::span<GetReply> replies) {
    if (replies.size() < 1 + n_chunks || replies[0].state != KeyState::kFound) return false;
    const Decoded m =
        decode_value(replies[0].value, header(ValueKind::kManifest, b, n_chunks), f.space.key);
    if (m.error != DecodeError::kNone || m.payload.size() != 16 ||
        get_u64(m.payload.data()) != f.snapshot_bytes) {
      ++f.rejected;
      return false;
    }
    const std::uint64_t whole = get_u64(m.payload.data() + 8);
    std::vector<std::byte> snap;
    snap.reserve(f.snapshot_bytes);
    for (std::uint32_t i = 0; i < n_chunks; ++i) {
      const GetReply& r = replies[1 + i];
      if (r.state != KeyState::kFound) return false;
      const Decoded d = decode_value(r.value, header(ValueKind::kChunk, b, i), f.space.key);
      const std::size_t want = std::min(f.chunk_bytes, f.snapshot_bytes - i * f.chunk_bytes);
      if (d.error != DecodeError::kNone || d.payload.size() != want) {
        ++f.rejected;
        return false;
      }
      snap.insert(snap.end(), d.payload.begin(), d.payload.end());
    }
    if (checksum(snap) != whole) {
      ++f.rejected;
      return false;
    }
    f.snapshot = std::move(snap);
    return true;
  };

  // One round: the KV pages of the deepest candidate and its snapshot.
  std::vector<std::string> keys;
  for (std::size_t p = top.first_kv_page; p < top.boundary_page; ++p)
    keys.push_back(f.space.kv_key(f.paths[p + 1]));
  const std::size_t n_kv = keys.size();
  snapshot_keys(top.boundary_page, keys);
  // Values land in pooled buffers; everything kept is copied out (f.kv, f.snapshot) before
  // the lease gives them back, and a fallback's GET reuses the same vector.
  detail::ReplyPool::Lease lease(pool);
  std::vector<GetReply>& replies = *lease;
  // Every value's exact length is known: the store refuses a longer one from its length alone.
  const bool keyed = !f.space.key.empty();
  const std::size_t chunk_value = value_bytes(std::min(f.chunk_bytes, f.snapshot_bytes), keyed);
  const std::size_t snapshot_value = std::max(chunk_value, value_bytes(16, keyed));
  const std::size_t kv_value = value_bytes(kv_payload_bytes(ps, page_bytes, keyed), keyed);
  store.get_into(keys, f.deadline, replies,
                 GetBounds{n_kv > 0 ? std::max(kv_value, snapshot_value) : snapshot_value, 0});
  replies.resize(keys.size());
  for (const GetReply& r : replies) count(r);
  std::size_t kv_end = top.first_kv_page;  // pages that arrived whole, contiguously
  f.kv.reserve(n_kv * page_bytes);
  for (std::size_t i = 0; i < n_kv; ++i) {
    const std::size_t p = top.first_kv_page + i;
    if (replies[i].state != KeyState::kFound) break;
    const Decoded d = decode_kv_page(replies[i].value, header(ValueKind::kKvPage, p + 1, 0),
                                     std::span<const Token>(f.prompt).subspan(p * ps, ps),
                                     page_bytes, f.space.key);
    if (d.error != DecodeError::kNone) {
      ++f.rejected;
      break;
    }
    f.kv.insert(f.kv.end(), d.payload.begin(), d.payload.end());
    kv_end = p + 1;
  }
  for (std::size_t ci = 0; ci < f.candidates.size(); ++ci) {
    const std::size_t b = f.candidates[ci].boundary_page;
    if (b > kv_end) continue;
    bool whole = false;
    if (ci == 0) {
      whole = assemble(b, std::span(replies).subspan(n_kv));
    } else if (Clock::now() < f.deadline) {
      std::vector<std::string> more;
      snapshot_keys(b, more);
      // The first round's values are all decoded or copied by now: reuse its buffers.
      store.get_into(more, f.deadline, replies, GetBounds{snapshot_value, 0});
      replies.resize(more.size());
      for (const GetReply& r : replies) count(r);
      whole = assemble(b, replies);
    }
    if (whole) {
      // A boundary inside the local KV takes only its snapshot (fetch_plan.hpp).
      f.first_kv_page = std::min(f.first_kv_page, b);
      f.boundary_page = b;
      f.fallbacks = ci;
      f.kv.resize((b - f.first_kv_page) * page_bytes);
      return;
    }
  }
  f.kv.clear();
}

bool SharedTier::ready(std::uint64_t id) const {
  std::lock_guard lock(fetch_mu_);
  auto it = fetches_.find(id);
  return it == fetches_.end() || it->second->done;
}

sched::SharedFetch SharedTier::finish(std::uint64_t id) {
  sched::SharedFetch out;
  std::unique_ptr<Fetch> f;
  {
    std::unique_lock lock(fetch_mu_);
    auto it = fetches_.find(id);
    if (it == fetches_.end()) return out;
    Fetch* raw = it->second.get();
    done_cv_.wait(lock, [raw] { return raw->done; });
    f = std::move(it->second);
    fetches_.erase(it);
  }
  out.bytes = f->bytes;
  {
    std::lock_guard lock(mu_);
    stats_.bytes_fetched += f->bytes;
    stats_.values_rejected += f->rejected;
    stats_.values_missing += f->missing;
    if (f->boundary_page == 0) ++stats_.fetch_failures;
    if (f->boundary_page != 0 && f->fallbacks > 0) ++stats_.fallbacks;
  }
  if (f->boundary_page == 0) {
    out.seconds = seconds_since(f->started);
    return out;
  }
  const CacheConfig& c = cache_.config();
  const std::size_t ps = c.page_size, pb = c.page_bytes;
  const Fetch& fr = *f;
  auto fill = [&](std::size_t first_page, std::span<const HostPageId> kv,
                  std::span<const HostPageId> snapshot) {
    // The tree lost KV below the fetched pages since the probe: this path cannot be entered.
    if (first_page < fr.first_kv_page || first_page + kv.size() != fr.boundary_page) return false;
    for (std::size_t i = 0; i < kv.size(); ++i) {
      const std::size_t at = (first_page + i - fr.first_kv_page) * pb;
      std::memcpy(host_.host_page(kv[i]).data(), fr.kv.data() + at, pb);
    }
    for (std::size_t i = 0; i < snapshot.size(); ++i) {
      const std::size_t off = i * pb;
      const std::size_t n = std::min(pb, fr.snapshot.size() - std::min(off, fr.snapshot.size()));
      auto page = host_.host_page(snapshot[i]);
      std::memcpy(page.data(), fr.snapshot.data() + off, n);
      std::memset(page.data() + n, 0, pb - n);
    }
    return true;
  };
  const std::span<const Token> tokens =
      std::span<const Token>(f->prompt).first(f->boundary_page * ps);
  auto r = cache_.import_host(tokens, f->ns, fill);
  std::lock_guard lock(mu_);
  if (!r) {
    ++stats_.import_refused;
  } else {
    ++stats_.imports;
    stats_.imported_pages += r->kv_pages;
    stats_.imported_snapshots += r->snapshot ? 1 : 0;
    stats_.imported_tokens += tokens.size();
    out.tokens = tokens.size();
  }
  out.seconds = seconds_since(f->started);
  return out;
}

sched::SharedFetch SharedTier::before_admit(sched::RequestId, std::span<const Token> prompt,
                                            NamespaceId ns) {
  pump();
  const Clock::time_point t0 = Clock::now();
  const std::uint64_t id = lookup(prompt, ns);
  sched::SharedFetch out = id == 0 ? sched::SharedFetch{} : finish(id);
  out.seconds = seconds_since(t0);
  return out;
}

void SharedTier::after_finish(sched::RequestId, std::span<const Token> tokens, NamespaceId ns) {
  publish(tokens, ns);
  pump();
}

// ---------------------------------------------------------------------------------------
// publishing

void SharedTier::publish(std::span<const Token> tokens, NamespaceId ns) {
  const std::size_t ps = cache_.config().page_size;
  if (space(ns) == nullptr || tokens.size() < ps) return;
  Pending p{
      std::vector<Token>(tokens.begin(), tokens.begin() + std::ptrdiff_t(tokens.size() / ps * ps)),
      ns, 0};
  if (try_publish(p, false)) return;
  if (pending_.size() >= config_.max_pending) {
    (void)try_publish(pending_.front(), true);  // the oldest goes with what it has
    pending_.pop_front();
  }
  pending_.push_back(std::move(p));
}

void SharedTier::pump() {
  for (std::size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    ++p.tries;
    if (try_publish(p, p.tries >= config_.pending_tries)) {
      pending_.erase(pending_.begin() + std::ptrdiff_t(i));
    } else {
      ++i;
    }
  }
}

bool SharedTier::try_publish(const Pending& p, bool last_try) {
  const CacheConfig& c = cache_.config();
  const std::size_t ps = c.page_size, pb = c.page_bytes;
  const HostCopies copies = cache_.host_copies(p.tokens, p.ns);
  const std::size_t deepest = copies.snapshots.empty() ? 0 : copies.snapshots.back().boundary;
  const bool complete = deepest == p.tokens.size();
  if (!complete && !last_try) return false;
  if (deepest == 0) return true;  // nothing resumable on host: nothing worth publishing
  const KeySpace& ks = *space(p.ns);
  const bool keyed = !ks.key.empty();
  {
    // The job's exact bytes are known before anything is copied or encoded: a job that does
    // not fit the queue is dropped here, for free.
    const std::uint32_t chunks = chunk_count(c.snapshot_bytes, config_.chunk_bytes);
    const std::size_t sent = static_cast<std::size_t>(
        std::count_if(copies.kv.begin(), copies.kv.begin() + std::ptrdiff_t(deepest / ps),
                      [](HostPageId id) { return id.valid(); }));
    const std::size_t bytes = sent * value_bytes(kv_payload_bytes(ps, pb, keyed), keyed) +
                              copies.snapshots.size() * (chunks * value_bytes(0, keyed) +
                                                         c.snapshot_bytes + value_bytes(16, keyed));
    std::lock_guard lock(mu_);
    if (queued_bytes_ + bytes > config_.publish_queue_bytes) {
      ++stats_.publish_dropped;
      return true;
    }
  }

  const std::vector<PathHash> paths = page_path_hashes(p.tokens, c.page_size, deepest / ps);
  auto job = std::make_unique<Job>();
  auto id = [&](ValueKind kind, std::size_t pages, std::uint32_t index) {
    return value_id(ks, kind, paths, pages, c.page_size, index);
  };
  // KV with a snapshot at or below it: every page up to the deepest host snapshot (a page
  // published before whose host copy left goes without its bytes: the tier has it).
  for (std::size_t i = 0; i < deepest / ps; ++i) {
    job->keys.push_back(ks.kv_key(paths[i + 1]));
    job->values.push_back(!copies.kv[i].valid()
                              ? std::string()
                              : encode_kv_page(id(ValueKind::kKvPage, i + 1, 0),
                                               std::span(p.tokens).subspan(i * ps, ps),
                                               host_.host_page(copies.kv[i]), ks.key));
  }
  job->kv_pages = deepest / ps;
  const std::uint32_t n_chunks = chunk_count(c.snapshot_bytes, config_.chunk_bytes);
  std::vector<std::pair<std::string, std::string>> manifests;
  for (const HostSnapshotCopy& s : copies.snapshots) {
    const std::size_t b = s.boundary / ps;
    // The snapshot as spans of its host pages (zeros past them): each chunk is encoded
    // straight from the pages, one copy into its value (no whole-snapshot copy first).
    std::vector<std::span<const std::byte>> snap;
    std::vector<std::byte> zeros;
    std::size_t covered = 0;
    for (std::size_t i = 0; i < s.pages.size() && covered < c.snapshot_bytes; ++i) {
      const std::size_t n = std::min(pb, c.snapshot_bytes - covered);
      snap.push_back(host_.host_page(s.pages[i]).first(n));
      covered += n;
    }
    if (covered < c.snapshot_bytes) {
      zeros.assign(c.snapshot_bytes - covered, std::byte{0});
      snap.push_back(zeros);
    }
    const std::size_t first_chunk = job->values.size();
    for (std::uint32_t i = 0; i < n_chunks; ++i) {
      const std::size_t off = std::size_t(i) * config_.chunk_bytes;
      const std::vector<std::span<const std::byte>> part =
          slice(snap, off, std::min(config_.chunk_bytes, c.snapshot_bytes - off));
      job->keys.push_back(ks.chunk_key(paths[b], i));
      job->values.push_back(encode_value(id(ValueKind::kChunk, b, i), part, ks.key));
    }
    std::byte body[16];
    put_u64(body, c.snapshot_bytes);
    put_u64(body + 8, checksum(std::span<const std::span<const std::byte>>(snap)));
    const std::span<const std::byte> part[] = {std::span<const std::byte>(body, 16)};
    manifests.emplace_back(ks.manifest_key(paths[b]),
                           encode_value(id(ValueKind::kManifest, b, n_chunks), part, ks.key));
    job->chunks_of.emplace_back(first_chunk, n_chunks);
    job->pages_of.push_back(b);
  }
  job->first_manifest = job->values.size();
  for (auto& [k, v] : manifests) {
    job->keys.push_back(std::move(k));
    job->values.push_back(std::move(v));
  }
  for (const std::string& v : job->values) job->bytes += v.size();
  {
    std::lock_guard lock(mu_);
    if (queued_bytes_ + job->bytes > config_.publish_queue_bytes) {
      ++stats_.publish_dropped;
      return true;
    }
    ++stats_.publish_jobs;
    queued_bytes_ += job->bytes;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  // The job holds the encoded bytes: the host copies are no longer needed for it.
  cache_.mark_published(std::span(p.tokens).first(deepest), p.ns);
  return true;
}

void SharedTier::publisher_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::unique_ptr<Job> job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    bool thrown = false;
    try {
      run_job(*job);  // nothing thrown (a store's, std::bad_alloc) may end the process
    } catch (...) {
      thrown = true;
    }
    lock.lock();
    if (thrown) ++stats_.publish_failures;
    queued_bytes_ -= job->bytes;
    busy_ = false;
    idle_cv_.notify_all();
  }
}

void SharedTier::run_job(Job& job) {
  const Deadline deadline = Clock::now() + config_.publish_deadline;
  const std::vector<KeyState> there = store_.exists_before_write(job.keys, deadline);
  std::uint64_t written = 0, skipped = 0, failed = 0, bytes = 0;
  std::vector<bool> ok(job.keys.size(), false);
  auto write = [&](const std::vector<std::size_t>& which) {
    std::vector<SetItem> items;
    for (std::size_t i : which) items.push_back({job.keys[i], job.values[i]});
    const std::vector<KeyState> done = store_.set(items, deadline);
    for (std::size_t k = 0; k < which.size(); ++k) {
      const bool w = k < done.size() && done[k] == KeyState::kFound;
      ok[which[k]] = w;
      w ? (++written, bytes += job.values[which[k]].size()) : ++failed;
    }
  };
  auto found = [&](std::size_t i) { return i < there.size() && there[i] == KeyState::kFound; };
  // A page sent without its bytes must be there already; past the first that is not, a
  // reader cannot reach anything, so nothing deeper is written.
  std::size_t reach = job.kv_pages;
  for (std::size_t i = 0; i < job.kv_pages && reach == job.kv_pages; ++i) {
    if (job.values[i].empty() && !found(i)) reach = i;
  }
  if (reach < job.kv_pages) ++failed;
  std::vector<bool> unreachable(job.keys.size(), false);
  for (std::size_t i = reach; i < job.kv_pages; ++i) unreachable[i] = true;
  for (std::size_t m = 0; m < job.chunks_of.size(); ++m) {
    if (job.pages_of[m] <= reach) continue;
    const auto [from, n] = job.chunks_of[m];
    for (std::size_t k = from; k < from + n; ++k) unreachable[k] = true;
    unreachable[job.first_manifest + m] = true;
  }
  std::vector<std::size_t> first, last;
  for (std::size_t i = 0; i < job.keys.size(); ++i) {
    if (found(i)) {
      ok[i] = true;
      ++skipped;
    } else if (!unreachable[i]) {
      (i < job.first_manifest ? first : last).push_back(i);
    }
  }
  write(first);
  // A manifest goes only after all its chunks are there: a reader that finds it finds them.
  std::vector<std::size_t> manifests;
  for (std::size_t i : last) {
    const auto [from, n] = job.chunks_of[i - job.first_manifest];
    bool chunks = true;
    for (std::size_t k = from; k < from + n; ++k) chunks = chunks && ok[k];
    if (chunks) {
      manifests.push_back(i);
    } else {
      ++failed;
    }
  }
  write(manifests);
  std::lock_guard lock(mu_);
  stats_.published_keys += written;
  stats_.publish_skipped += skipped;
  stats_.bytes_published += bytes;
  if (failed > 0) ++stats_.publish_failures;
}

void SharedTier::flush_publishes() {
  while (!pending_.empty()) {
    (void)try_publish(pending_.front(), true);
    pending_.pop_front();
  }
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

}  // namespace radixtier::shared
