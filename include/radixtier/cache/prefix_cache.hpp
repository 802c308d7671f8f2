// PrefixCache: the node-residency prefix cache for hybrid attention + GDN models.
//
// One radix tree over token ids at page granularity. Every node carries the residency of
// its own KV pages and of the snapshot at its boundary as one row per tier (node.hpp: the
// rows and the one table of transitions between adjacent tiers). Pools: one GPU pool and one
// host pool of pages that each hold KV and cached snapshots alike (a snapshot spans
// config.snapshot_pages() pages), and the store's slots below host, so the split between KV
// and snapshots on every tier is decided by eviction at every moment. GPU snapshot slots are
// live slots only, the running requests' state: a resume copies the cached pages into the
// request's slot and insert copies a slot into pages (device to device; docs/architecture.md,
// "The GPU pool"). Both device copies are transfers like promotions (issue 33): submitted
// without waiting (the fill at admission, ordered `after` the copy still bringing its snapshot
// onto the GPU; the materialization at insert, whose node's GPU snapshot is arriving,
// Xfer::kMaterialize), reaped by poll(); admit() and insert() wait for neither
// (CacheStats::host_waits). stream_wait() orders a caller's stream after them instead of a
// host wait; RequestOptions::stream is carried by every batch a request's call submits.
//
// The cache is composed of parts, each owning its state and stating its invariants:
//   RadixTree      (radix_tree.hpp)    the nodes, the namespace roots, walks and splits
//   TierPart<T>    (tier_part.hpp)     per tier: the KV and snapshot eviction orders (the
//                                      nodes evictable there now, lowest key first), the
//                                      pools' ages, the pools and the held counters; every
//                                      tier takes the lower of its two heads
//   RequestTable   (request_table.hpp) the locks and the ids requests hold (rule 9)
//   PinTable       (pin_table.hpp)     the host pins and the pages they hold
//   TransfersInFlight (transfers_in_flight.hpp) the copies in flight: GPU-host batches,
//                                      store batches, staged loads
//   EventSinks     (event_sinks.hpp)   the attached KV event sinks, a flush's quiet mode
// and the config and the stats, which stay members here (the engines are the tiers' links).
// What is written once over the rows is in prefix_cache_rows.cpp (set, free, drop of any
// tier) and in the keys (prefix_cache.cpp, one rule per kind for every tier).
// Victims cost O(log n). GPU free room is kept above a low watermark by demoting ahead of need
// without waiting (config.hpp; docs/architecture.md, "Watermarks"). Evicting from GPU demotes to
// host (write-back: a sliced async copy; write-through: the clean host copy already exists, so it
// is free) or drops when host has no room or the KV is dead (no snapshot at or below it). What
// refreshes a key: an admission refreshes the KV of its whole path and only the snapshot it resumes
// from; an insert refreshes what it adopted and the snapshot it attached.
//
// Rules kept (numbers as in the brief), checked by check_invariants():
//  1. usable match = deepest node on the path whose root path has KV everywhere and which
//     has a snapshot; never a shorter snapshot for a deeper node; admit() matches on all
//     but the last prompt token.
//  2. every id of the four spaces is held by exactly one of: free list, node, request,
//     in-flight transfer (IdPool records the holder; counts add up to capacity).
//  3. a lock pins the KV of every node on the request's path (lock_count, so a parent is
//     locked at least as often as a child) and the snapshot the request resumes from
//     (snapshot_lock) until its live slot holds the copy; pinned resources are never demoted
//     or dropped; release() restores the exact prior counts. Snapshots at other boundaries
//     of a locked path stay evictable: a running request no longer needs them.
//  4. order membership == the evictable predicates of node.hpp, refreshed at every change;
//     every linked key equals the key the node's state gives (check_invariants()).
//  5. sources and destinations of a copy stay held until it completes, so recycling an id
//     can never mix bytes: a fill's source snapshot stays locked (by its lock, or by the copy
//     once the lock is released, the live slot then held by the copy); a materialization holds
//     its slot and its pages (Holder::kTransfer) until it lands. The one exception is a fill
//     ordered after a promotion that failed: the promotion's pages are freed when it is
//     reaped, and the engine fails the fill without reading them (TransferBatch::after).
//  6. path_snapshot() hands out the request's own live slot, filled device to device from the
//     cached pages once the fill landed (or earlier to a caller that stream_wait()ed); the
//     cached copy is never computed in.
//  7. a failed demotion or promotion frees its destination and keeps the intact source (the
//     GPU copy / the host copy; eviction then takes the next victim); wait() resumes the
//     request at the deepest boundary of its path that is still usable on GPU (KV that
//     arrived is kept and used). A batch the engine refuses moved nothing: its nodes return
//     to their state before it and the refusal's message is the error of the call.
//  8. every entry point validates first and mutates after: bad input changes nothing.
//  9. a GPU page or snapshot slot allocated with a lock is that request's alone until insert
//     adopts it or the request frees it (RequestOwnership); release() frees what it still
//     owns. Every id is bounds-checked in every build.
//
// Key namespaces: each namespace has its own root (tree_.root() is the default namespace's; the
// others are made by their first admission or pin and leave when their tree is empty), so no
// node is reachable from two namespaces; the pools and the eviction orders are shared, so
// eviction stays global. A lock and a pin record their root.
// Priorities and pins: node.hpp, "Eviction orders"; the pinned host pages never exceed
// CacheConfig::host_pin_share of the host pool (pin() refuses beyond it).
//
// Threading: not thread-safe; one scheduler thread calls it. Copies run on the transfer
// engine's own threads or streams; the cache reaps them in poll() and at every entry point.
#pragma once

#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/cache/event_sinks.hpp"
#include "radixtier/cache/events.hpp"
#include "radixtier/cache/id_pool.hpp"
#include "radixtier/cache/node.hpp"
#include "radixtier/cache/pin_table.hpp"
#include "radixtier/cache/prefix_cache_types.hpp"
#include "radixtier/cache/radix_tree.hpp"
#include "radixtier/cache/request_options.hpp"
#include "radixtier/cache/request_table.hpp"
#include "radixtier/cache/tier_part.hpp"
#include "radixtier/cache/timing_hooks.hpp"
#include "radixtier/cache/transfers_in_flight.hpp"
#include "radixtier/config.hpp"
#include "radixtier/transfer/store_engine.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier {

class PrefixCache final : public CacheBackend {
 public:
  /// Spent snapshots (node.hpp, "Eviction orders") are discounted while this many resumes in
  /// a row landed on none: the placement learner's window (PlacementLearnerOptions::
  /// finish_window), beyond which evidence no longer describes the traffic.
  static constexpr std::uint64_t kSpentWindow = 64;
  /// Validates the config and checks that it fits in the engine's pools (EngineCapacity: every
  /// pool at most the engine's, page and snapshot bytes equal); the error names both sizes.
  /// The engine must outlive the cache.
  static Result<std::unique_ptr<PrefixCache>> create(const CacheConfig& config,
                                                     TransferEngine& engine);
  /// As above, with the tier below host: `store` (not owned; it must outlive the cache) takes
  /// what host evicts and gives it back at admission (store -> host -> GPU). Its records are
  /// the tree after a restart: create() rebuilds the default namespace's tree from them (store
  /// residency only) and erases the records that cannot be placed. kInvalidArgument when the
  /// store's geometry (page tokens, page and snapshot bytes) differs from the config.
  static Result<std::unique_ptr<PrefixCache>> create(const CacheConfig& config,
                                                     TransferEngine& engine, StoreEngine* store);
  ~PrefixCache() override;
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // --- CacheBackend ----------------------------------------------------------------------
  std::uint32_t page_size() const override { return config_.page_size; }
  std::uint64_t host_bytes_free() const override;
  /// admit(prompt, {}): the default namespace at the default priority.
  Result<Admission> admit(std::span<const Token> prompt) override;
  /// In options.ns; the KV of the path and the snapshot resumed from, and later what the
  /// request inserts, are kept at least at options.priority (request_options.hpp).
  Result<Admission> admit(std::span<const Token> prompt, const RequestOptions& options) override;
  /// The same for a prompt held as int64 (what tokenizers return), read in place: the walk
  /// compares it with the tree's tokens (what it matched is thereby in int32's range) and the
  /// rest is checked before the admission changes anything (kInvalidArgument: a token
  /// outside int32), so no pass converts it first.
  Result<Admission> admit(std::span<const std::int64_t> prompt, const RequestOptions& options);
  Result<TransferState> poll(LockId lock) override;
  Result<std::size_t> wait(LockId lock) override;
  /// Makes `stream` wait, on the device, for what the lock's resumed prefix still has in
  /// flight: the KV promotions of the layers up to `layer`'s group (every layer without
  /// `layer`), and whole: the snapshot's promotion and the copy into the live slot (a GDN
  /// layer reads the whole state). Forwarded to TransferEngine::stream_wait; no host wait on
  /// an engine that waits_on_device(); an engine without streams (the host engine) waits on
  /// the host (counted in CacheStats::host_waits). A copy that goes through host first (a
  /// store read, a staged load) cannot be waited for on a stream: the cache waits on the host
  /// for the store read only, then the stream waits for the promotion that follows it.
  /// From the first call on, path_pages() and path_snapshot() hand out the prefix's ids
  /// before the copies land (they are fixed at admission): read them on `stream` only, and a
  /// layer's pages only after a stream_wait() covering that layer.
  /// Contract: a device wait cannot see a failure yet to come. Before committing anything
  /// computed from the prefix (insert, sampling), check poll(lock) == kDone; kFailed: discard
  /// it, and wait() says where the request resumes (recompute from there). Errors: kNotFound
  /// (unknown lock), kTransferFailed (a copy is known to have failed: wait()), changing
  /// nothing.
  Status stream_wait(LockId lock, StreamHandle stream,
                     std::optional<std::uint32_t> layer = {}) override;
  bool supports_stream_wait() const override { return true; }
  Result<std::vector<GpuPageId>> path_pages(LockId lock) const override;
  Result<GpuSlotId> path_snapshot(LockId lock) const override;
  Result<std::vector<GpuPageId>> alloc_pages(LockId lock, std::size_t n) override;
  Result<GpuSlotId> alloc_snapshot_slot(LockId lock) override;
  Status free_pages(LockId lock, std::span<const GpuPageId> pages) override;
  Status free_snapshot_slot(LockId lock, GpuSlotId slot) override;
  Result<InsertResult> insert(LockId lock, std::span<const Token> tokens,
                              std::span<const GpuPageId> pages,
                              std::optional<GpuSlotId> snapshot) override;
  Status release(LockId lock) override;
  /// What these calls do, in this order, for b = from + page, from + 2 pages, ... below
  /// tokens.size(): s = alloc_snapshot_slot(lock) (none if refused), insert(lock,
  /// tokens.first(b), pages.first(b / page), s), free_snapshot_slot(lock, s) unless taken;
  /// then insert(lock, tokens, pages, snapshot, or a slot of its own when none). A snapshot
  /// at every page boundary past `from`: the attention-only twin's insert (docs/simulator.md,
  /// "The attention-only twin"), in time linear in the pages where the calls one by one walk
  /// from the root each. Returns the pages not taken (each once, first seen first) and
  /// whether `snapshot` was taken; `reached` = the last boundary inserted (from when none).
  /// The whole input is validated first (kInvalidArgument, nothing changed).
  Result<InsertResult> insert_every_page(LockId lock, std::size_t from,
                                         std::span<const Token> tokens,
                                         std::span<const GpuPageId> pages,
                                         std::optional<GpuSlotId> snapshot, std::size_t& reached);
  CacheStats stats() const override { return stats_; }
  std::string check_invariants() const override;

  // --- queries and maintenance -----------------------------------------------------------
  /// Read-only lookup of `tokens` (all of them; admit() is the one that drops the last).
  MatchResult match(std::span<const Token> tokens, NamespaceId ns = kDefaultNamespace) const;
  /// What admit(prompt) would find, read-only: match() of all but the last token, so a
  /// scheduler can decide on GPU room before it commits any (load-back threshold included).
  Result<MatchResult> peek(std::span<const Token> prompt, NamespaceId ns = kDefaultNamespace) const;
  /// Frees at least `request.tokens` of KV and `request.snapshots` snapshots on one tier, as
  /// far as unlocked data allows (less when there is less: not an error), lowest key first:
  /// on GPU by demotion or drop, exactly as making room does; on host by drop; on the store
  /// by erasing records (kInvalidArgument without a store). Fails only
  /// when the engine refuses a demotion (kTransferFailed, what was freed before stays freed).
  Result<EvictResult> evict(const EvictRequest& request);
  /// Evictable and locked sizes per tier (O(locked nodes); with a store, O(nodes)).
  CacheSizes sizes() const;
  /// Reaps finished transfers (applies their state changes). Cheap when none finished.
  void poll();
  /// Waits for every in-flight transfer and reaps it.
  void drain();
  /// Drops every unpinned host copy (host memory reclaimed); GPU and store copies stay.
  void drop_host();
  /// Gives every KV node and snapshot of the default namespace that the store has room for a
  /// store copy (parents first; GPU-only data goes through host), then syncs the store: what a
  /// graceful shutdown calls, so that the next create() on the same store serves all of it.
  /// kFailedPrecondition without a store; a store error is returned, and kTransferFailed
  /// when a copy failed on the way (what was written stays);
  /// kOutOfMemory when some of it has no store copy at the end (a copy failed, or there was
  /// no room to stage it on host or to keep it on the store): the rest is durable.
  Status persist();
  /// Drops every unpinned copy on every tier (SGLang's flush_cache): waits for the copies in
  /// flight, then every KV page and snapshot no running request pins is freed and every node
  /// left empty leaves the tree. With no request running, the cache is as created.
  void flush();
  /// flush() of one namespace (an adapter unloaded, a tenant gone): every copy of its tree
  /// that no running request and no pin holds is dropped; the other namespaces keep theirs.
  void flush(NamespaceId ns);
  /// Read-only: every node along `tokens` (all of them, tombstones included), root excluded,
  /// down to the last one the tokens reach (a partial match included), shallow first.
  std::vector<NodeInfo> inspect(std::span<const Token> tokens,
                                NamespaceId ns = kDefaultNamespace) const;
  /// Host-only pin of a cached prefix (an operator's system prompt): `tokens` (whole pages)
  /// must be a usable match of `ns` whole (KV on every node, a snapshot at its end). Waits
  /// for the copies in flight, then gives every node of the prefix and the end snapshot a
  /// host copy (copying what is GPU-only, making host room as eviction does) and keeps those
  /// host copies until unpin(): never dropped for room, by drop_host() or flush(). Errors,
  /// each changing nothing: kInvalidArgument (not whole pages, no such namespace or prefix),
  /// kOutOfMemory (the pinned host pages would exceed CacheConfig::host_pin_share of the host
  /// pool, or no host room can be made), kTransferFailed (the copy to host failed).
  Result<PinId> pin(std::span<const Token> tokens, NamespaceId ns = kDefaultNamespace);
  /// Ends a pin: its host copies become evictable again (kNotFound: unknown pin).
  Status unpin(PinId pin);
  /// Host pool pages held by pinned KV and pinned snapshots (each node counted once).
  std::size_t pinned_host_pages() const { return pins_.pinned_pages; }
  /// The most pages pins may hold: host_pin_share of the host pool.
  std::size_t pin_budget_pages() const;
  /// Namespaces with a tree now (the default one always).
  std::size_t namespace_count() const { return 1 + tree_.namespace_roots().size(); }
  Occupancy occupancy() const;
  const CacheConfig& config() const { return config_; }
  /// GPU-host transfers, store transfers, chunks of staged loads and device copies in flight.
  std::size_t in_flight() const {
    return xfers_.copies.size() + xfers_.store.size() + staged_chunks() + xfers_.device.size();
  }
  /// Device copies in flight: fills of live slots and materializations (issue 33).
  std::size_t device_copies_in_flight() const { return xfers_.device.size(); }
  /// The store tier (nullptr: none).
  StoreEngine* store() const { return host_.link; }

  // --- the shared tier (radixtier::shared; prefix_cache_import.cpp) -----------------------
  /// The usable host copies along `tokens` (whole pages of `ns`): the KV pages from the root
  /// while each has one or its node was published (then an invalid id: HostCopies::kv), and
  /// the host snapshots at node ends among them. Read-only; the ids are valid until the next
  /// call into the cache.
  HostCopies host_copies(std::span<const Token> tokens, NamespaceId ns = kDefaultNamespace) const;
  /// The host copies along `tokens` (as host_copies() returned them) are in a shared tier
  /// now: under write-through too, a host copy of what the GPU holds leaves host first from
  /// here on (node.hpp, KeyClass::kCopy). Changes no residency; tokens the tree lacks are
  /// ignored.
  void mark_published(std::span<const Token> tokens, NamespaceId ns = kDefaultNamespace);
  /// Enters bytes fetched from elsewhere (another instance) as host-resident data: the KV of
  /// every page of `tokens` (whole pages from the root of `ns`) that the tree has no KV for,
  /// and the snapshot at the end of `tokens` unless the tree has one there. Takes the host
  /// pages (making room as eviction does, the tree's KV before them kept), calls fill() to
  /// write them, then enters them as host-only nodes, as a finished demotion would leave them;
  /// the next admission promotes them. Errors enter nothing: kInvalidArgument (not whole
  /// pages; nothing changed), kFailedPrecondition (fill() returned false, or the tree lost
  /// KV below the fetched pages while room was made), kOutOfMemory (no host room: what
  /// making room evicted on the way stays evicted, as when room is made for a demotion).
  Result<ImportResult> import_host(std::span<const Token> tokens, NamespaceId ns,
                                   const ImportFill& fill);

  // --- observation (events.hpp, timing_hooks.hpp; prefix_cache_events.cpp) --------------
  /// Attaches a sink (not owned; it must outlive its attachment). It first receives
  /// AllBlocksCleared and then what the cache holds now, as stored events, so its copy of the
  /// contents is exact from here on. Attaching one already attached restarts its stream.
  void add_event_sink(EventSink* sink);
  void remove_event_sink(EventSink* sink);
  /// Attaches latency hooks (not owned; nullptr detaches).
  void set_timing_hooks(TimingHooks* hooks) { timing_ = hooks; }

 private:
  PrefixCache(const CacheConfig& config, TransferEngine& engine);

  // the store tier (prefix_cache_store.cpp)
  /// What making host room does with one victim when a store is attached.
  enum class StoreVerdict { kPlanned, kNotStored };
  /// Rebuilds the default namespace's tree from the store's records (create()).
  Status restore_from_store();
  /// The store path hash at n's end (Node::end_path), computing what is not known yet.
  PathHash end_path(Node* n);
  bool in_default_namespace(const Node* n) const;
  /// Plans the host -> store write of a host victim's resource (KV or snapshot), making
  /// store room; kNotStored when there is no store, the data is dead or of another namespace,
  /// or the store has no room (the caller drops it, as without a store).
  StoreVerdict plan_store_write(Node* n, bool snapshot, bool drop_host, StoreBatch& batch);
  /// Erases store victims (lowest key, leaf-first) until `slots` are free; false: no victim.
  bool make_store_room(std::uint64_t slots);
  /// Plans the store -> host read of n's KV / snapshot into host pages taken now (room made
  /// by the caller) with `gpu` as the final destinations; kLoad.
  void plan_kv_load(Node* n, StoreBatch& batch);
  void plan_snapshot_load(Node* n, std::vector<HostPageId> host, StoreBatch& batch);
  /// Submits a store batch; a refusal cancels its ops (their nodes as before) and returns it.
  Status submit_store_batch(StoreBatch&& batch, std::optional<std::uint32_t>* id = nullptr);
  void cancel_store_ops(std::span<const StoreOp> ops);
  void finish_store_transfer(std::uint32_t id);
  void finish_store_write(const StoreOp& op, const RecordId* ids, std::size_t count, bool ok);
  /// Returns true when the read arrived (the op then joins `promote`).
  bool finish_store_read(const StoreOp& op, std::span<const Status> items, PendingBatch& promote);
  void wait_store_transfer(std::uint32_t id);
  /// Waits for whichever copy moves n's KV / snapshot now (GPU-host or store).
  void wait_kv_copy(Node* n);
  void wait_snapshot_copy(Node* n);
  void reap_store_transfers();
  /// Store writes in flight that free host pages when they land (the host watermark).
  std::size_t host_pages_storing() const;
  /// The host watermark step: with a store, keeps free host pages above the low watermark by
  /// writing the host order's next victims to the store, never waiting.
  void store_ahead();

  // staged loads (prefix_cache_staging.cpp; docs/architecture.md, "Staged loads")
  /// The store-only KV of `path` and target's store-only snapshot on their way to GPU (the GPU
  /// room is made): whole through host when host has room for all of it (kLoad, then
  /// kPromote; the host copy stays), else staged (start_staged_load). *store_tokens: the KV
  /// tokens loaded. An error started nothing: the path is as before (a shallower candidate).
  Status load_from_store(Node* target, std::span<Node* const> path, std::size_t* store_tokens);
  /// Takes the staging window (kOutOfMemory: not even one chunk, or the snapshot, fits) and
  /// the GPU destinations, marks the nodes kStage and starts the first chunks.
  Status start_staged_load(Node* target, std::span<Node* const> path);
  /// Starts the chunks the idle staging pages allow, the snapshot first (its read refused:
  /// nothing else); returns the last refusal.
  Status pump_staged(StagedLoad& load);
  Status submit_staged_read(StagedLoad& load, StagedChunk chunk);
  /// The chunk's read finished: true when its copy to GPU is in flight.
  bool finish_staged_read(StagedLoad& load, StagedChunk& chunk);
  bool submit_staged_copy(StagedLoad& load, StagedChunk& chunk, TransferBatch batch);
  void finish_staged_copy(StagedLoad& load, StagedChunk& chunk, bool ok);
  /// True when the chunk is done (block: waits for its read and its copy).
  bool advance_staged_chunk(StagedLoad& load, StagedChunk& chunk, bool block);
  /// Reaps what finished of load id (block: waits for its oldest chunk first), starts the next
  /// chunks and ends the load when none is left.
  void step_staged(std::uint32_t id, bool block);
  void end_staged_load(std::uint32_t id);
  void reap_staged();
  /// Waits until load id has ended (every chunk of it landed or failed).
  void wait_staged(std::uint32_t id);
  std::size_t staged_chunks() const;
  /// Host pages the staging window may take now without evicting (the KV share when split).
  std::size_t staging_room() const;

  // tree
  Node* split(Node* n, std::size_t pages);
  /// Removes n and then its ancestors while they are empty leaves; appends what it removed.
  void remove_if_empty(Node* n, std::vector<const Node*>* removed = nullptr);
  /// remove_if_empty() on the deepest node under `root` that `tokens` match whole.
  template <class T>
  void prune_path(Node* root, std::span<const T> tokens);
  Node* root_of(NamespaceId ns) const { return tree_.root_of(ns); }
  /// Removes the root of a namespace other than the default one once nothing is left of its
  /// tree (no child, no lock, no pin).
  void remove_root_if_empty(Node* root);
  /// Keeps n's KV and/or snapshot at least at priority p (its retention level).
  void raise_priority(Node* n, RetentionPriority p, bool kv, bool snapshot);
  /// admit() of Token or int64 prompts (prefix_cache_requests.cpp).
  template <class T>
  Result<Admission> admit_tokens(std::span<const T> prompt, const RequestOptions& options);

  // residency setters keep the parent's child counters, the snapshot counts of the
  // ancestors and the eviction orders exact
  // (prefix_cache_rows.cpp, written once for every tier)
  template <Tier T>
  void set_pages(Node* n, std::vector<typename Row<T>::Page> pages);
  template <Tier T>
  void set_snapshot(Node* n, typename Row<T>::Snapshot snapshot);
  /// Gives n's KV / snapshot on tier T back to the tier (its pool, or the store's records)
  /// and empties the row: the copy is freed (a drop, or a demotion whose copy landed).
  template <Tier T>
  void free_kv(Node* n);
  /// The data leaves tier T for good: counted as dropped there (KV), or as a lost snapshot
  /// when no memory tier keeps a copy; drop_kv also removes n once it is empty.
  template <Tier T>
  void drop_kv(Node* n);
  template <Tier T>
  void drop_snapshot(Node* n);
  template <Tier T>
  std::uint64_t& dropped_pages();  ///< CacheStats::kv_pages_dropped_<tier>
  void release(GpuPageId id);
  void release(HostPageId id);
  void release(RecordId id);
  void release(const std::vector<GpuPageId>& ids);
  /// n free GPU pages taken as a copy's destination (Holder::kTransfer; room made by the
  /// caller).
  std::vector<GpuPageId> take_gpu_pages(std::size_t n);
  void release(const std::vector<HostPageId>& ids);
  /// After n gained or lost its last snapshot: the counts of its ancestors (O(depth)).
  void note_snapshot_change(Node* n, bool had);
  void refresh(Node* n);
  /// A use of n's KV (admission path, insert): uses + 1, ages and clock of now.
  void touch(Node* n);
  /// A use of n's snapshot (resumed from, inserted).
  void touch_snapshot(Node* n);
  // the keys the orders sort by (node.hpp, "Eviction orders"), one rule for every tier
  template <Tier T>
  OrderKey kv_key(const Node& n) const;
  template <Tier T>
  OrderKey snap_key(const Node& n) const;
  /// uses x value per byte of n's KV on tier T; with the snapshot its drop would lose (.cpp).
  template <Tier T>
  double kv_value(const Node& n) const;
  /// The uses n's snapshot key counts: without a spent snapshot's spent ones (node.hpp).
  std::uint32_t snapshot_uses(const Node& n) const;
  /// A resume from `target`: counts a frontier resume and moves the spent-snapshot window.
  void note_resume(Node* target);
  /// Turns the discount of spent snapshots on or off; re-keys every linked snapshot.
  void set_spent_discount(bool on);
  /// Tokens back to the nearest snapshot above n (or the root).
  std::size_t gap_above(const Node& n) const;
  /// n gained or lost its snapshot: the gaps of the nearest snapshots below it (re-keyed).
  void refresh_gaps_below(Node* n);
  void lock_path(Node* n);
  void unlock_path(Node* n);

  // eviction; check_* decide, without evicting anything, whether make_* can succeed
  Status check_gpu_page_room(std::size_t n) const;
  Status make_gpu_page_room(std::size_t n);
  /// A free live slot; kOutOfMemory when every slot holds a running request's state (live
  /// slots are never cached data: nothing is evicted or waited for).
  Status make_gpu_slot_room();
  /// Evicts until n GPU pages are free, without the hopeless-request check (one room-making
  /// round; see node.hpp on demotions that fail). kOutOfMemory: nothing is left.
  Status reclaim_gpu_pages(std::size_t n);
  /// The GPU pool's next victim (KV or snapshot, lowest key) not marked failed in `round`.
  Node* gpu_victim_not_failed(std::uint64_t round, Held& h) const;
  /// The watermark step (config.hpp, docs/architecture.md): when free GPU pages plus those
  /// demotions in flight will free are below the low watermark, evicts the pool's next
  /// victims, submitting their demotions without waiting, up to the high watermark.
  /// Run by poll(), so by every entry point that reaps (admit, insert, poll, wait, evict) and
  /// at the end of release(); never inside alloc_pages / alloc_snapshot_slot, whose refusal
  /// must change nothing.
  /// Refuses `slot` for `call` while it is the request's live slot still being filled.
  Status check_live_slot(const LockRecord& rec, GpuSlotId slot, const char* call) const;
  void demote_ahead();
  /// GPU pages that the demotions in flight free when they land.
  std::size_t gpu_pages_demoting() const;
  /// Reaps finished transfers without the watermark step (poll() = reap + demote_ahead()).
  void reap_transfers();
  /// The GPU-host part of reap_transfers().
  void reap_gpu_host();
  /// Frees host pool pages until n can be taken for KV (for_snapshot: for a snapshot): the
  /// lowest key of either kind when the pool is shared, else of that kind within its share.
  bool make_host_page_room(std::size_t n, bool for_snapshot = false);
  /// Host pages for a snapshot copy of n: made room for and taken (empty: no room). n is
  /// pinned while room is made, so it cannot leave the tree meanwhile.
  std::vector<HostPageId> take_host_snapshot_pages(Node* n);
  /// Plans the copy of n's GPU KV into newly taken host pages (the room must be made) as
  /// `kind` (a demotion or a write-through) in `batch`.
  void plan_kv_to_host(Node* n, Xfer kind, PendingBatch& batch);
  /// Plans the copy of n's GPU snapshot into `dst` (take_host_snapshot_pages) in `batch`.
  void plan_snapshot_to_host(Node* n, std::vector<HostPageId> dst, Xfer kind, PendingBatch& batch);
  /// The page copies between n's GPU and host snapshot pages (either direction).
  void add_snapshot_pages(TransferBatch& batch, const Node* n) const;

  // the transitions between a tier and the one below, written once (prefix_cache_links.cpp)
  /// What evict() did with its victim: freed it now, planned its copy down (the room comes
  /// when the copy lands), or left it (ahead of need, no room below now).
  enum class Evicted { kFreed, kCopying, kLeft };
  /// One victim's KV (h = kKv) or snapshot leaves tier T for room: dropped when dead, freed
  /// when a copy is kept below, else demoted (its copy planned in `batch`), else dropped;
  /// `ahead` (the watermark step): when room below cannot be made now, left where it is.
  template <Tier T>
  Evicted evict(Node* n, Held h, LinkBatch<T>& batch, bool ahead);
  /// A tier below T keeps n's KV / snapshot (so leaving T loses nothing).
  template <Tier T>
  bool kept_below(const Node& n, Held h) const;
  /// A GPU victim (key `key`) found no host room because the copies planned earlier in the
  /// same batch hold it: the lowest of those below `key` is unplanned and dropped from the
  /// GPU instead (what making room would do if its copy had landed), until n's copy is
  /// planned (true) or no lower one is left (false).
  bool displace_planned(Node* n, Held h, const OrderKey& key, PendingBatch& batch);
  /// Takes n's planned copy (KV or snapshot) out of an unsubmitted batch: its host
  /// destinations back to the free list, the node as before the plan.
  void unplan(PendingBatch& batch, Node* n, bool snapshot);
  /// Frees n's copy on T when kept_below(): a demotion on GPU, a drop from memory on host.
  template <Tier T>
  void free_kept(Node* n, Held h);
  /// Drops a victim's KV or snapshot from T for room (counted; a node left empty leaves).
  template <Tier T>
  void drop_victim(Node* n, Held h);
  /// Plans the copy of n's KV / snapshot from T to the tier below as `kind` (kDemote: the
  /// copy on T goes when it lands; kWriteThrough: it stays), making room below; false: not
  /// planned (no room, dead data, another namespace, or no store).
  template <Tier T>
  bool plan_down(Node* n, Held h, Xfer kind, LinkBatch<T>& batch);
  /// Plans the copy of n's KV / snapshot from the tier below T up into T (the room on T, and
  /// for a load the GPU room it continues to, made by the caller); false: no room (a load's
  /// snapshot pages on host).
  template <Tier T>
  bool plan_up(Node* n, Held h, LinkBatch<T>& batch);
  template <Tier T>
  LinkBatch<T> up_batch();
  template <Tier T>
  Status submit_link(LinkBatch<T>&& batch, std::optional<std::uint32_t>* id = nullptr);
  template <Tier T>
  void wait_link(std::uint32_t id);
  template <Tier T>
  LinkBatch<T> down_batch();
  void write_through(std::span<Node* const> nodes, Node* snapshot_node);
  /// CacheConfig::max_snapshots_per_path, after a snapshot was attached at n: while a
  /// root-to-leaf path through n holds more than the cap, drops the least useful unpinned
  /// snapshot on the fullest such path (above or below n).
  void cap_path_snapshots(Node* n);

  // transfers
  /// Submits a batch (nothing when empty; `*id` is its transfer, nullopt if none). A batch
  /// the engine refuses moved nothing: cancel_ops() returns its nodes to their state before
  /// it and the refusal comes back, with the engine's message.
  Status submit_batch(PendingBatch&& pending, std::optional<std::uint32_t>* id = nullptr);
  void cancel_ops(std::span<const CopyOp> ops);
  void wait_transfer(std::uint32_t id);
  void finish_transfer(std::uint32_t id, bool ok);
  void finish_ops(std::span<const CopyOp> ops, bool ok);
  void finish_op(const CopyOp& op, bool ok);
  /// After copies finished: removes those of `nodes` they left empty, deepest first.
  void prune_copied(std::vector<Node*> nodes);
  /// Waits for the oldest GPU-host transfer, else the oldest store transfer; false: none.
  bool wait_any_transfer();

  // admission helpers
  /// A node with a snapshot on the KV-intact path of a query: an admission candidate.
  struct Candidate {
    Node* node;
    std::size_t host_tokens;  ///< tokens from the root to it whose KV is not on GPU yet
    bool snapshot_on_gpu;
    bool needs_copy() const { return host_tokens > 0 || !snapshot_on_gpu; }
  };
  /// The candidates along `tokens` from `from` (a namespace's root, or nullptr: none),
  /// shallow first; *kv_tokens as MatchResult::kv_tokens.
  template <class T>  // Token or int64 (instantiated in prefix_cache.cpp)
  std::vector<Candidate> candidates_along(const Node* from, std::span<const T> tokens,
                                          std::size_t* kv_tokens) const;
  /// The load-back threshold: a candidate that needs a copy is taken only when it resumes
  /// load_back_min_tokens deeper than `gpu_usable` (the deepest one that needs none).
  bool worth_loading(const Candidate& c, std::size_t gpu_usable) const;
  /// Locks and pins target's path, makes GPU room and starts its promotion. On an error the
  /// path is unlocked again: kTransferFailed (the engine refused) is reported to the caller,
  /// any other error means "fall back to a shallower candidate".
  Result<Admission> try_admit_at(Node* target);
  /// Pin helpers: the host pages a new pin of the path ending at `end` adds to the budget,
  /// and the counts of a pin added (+1) or removed (-1).
  std::size_t pin_cost(const Node* end) const;
  void add_pin_counts(Node* end, int delta);
  /// Submits the copy of the lock's snapshot into its live slot (device to device), ordered
  /// `after` the snapshot's promotion or materialization when that is still in flight; a
  /// snapshot still coming from the store is deferred to the poll() that starts its
  /// promotion. Never waits. A refusal counts as a failed fill (wait() resumes from the root).
  void submit_fill(LockId id, LockRecord& rec);
  /// Submits the fills deferred by submit_fill (run by reap_transfers()).
  void submit_deferred_fills();
  /// A fill that failed on its own (the prefix is intact): the lock moves to its root, the
  /// live slot is freed (the request recomputes).
  void fill_failed_to_root(LockRecord& rec);
  /// A slot the request owns goes back to the free list (its live slot: rec.live is cleared).
  void give_back_slot(LockRecord& rec, GpuSlotId slot);
  /// Submits a device copy (kDeviceToDevice) as `copy` (its ticket set here) and reaps it at
  /// once if it already landed; the id, or kTransferFailed when the engine refused it.
  Result<std::uint32_t> submit_device(TransferBatch batch, DeviceCopy copy);
  /// write_through_now: a materialization that landed starts its snapshot's write-through
  /// (false inside insert, whose own write-through takes it).
  void finish_device_copy(std::uint32_t id, bool ok, bool write_through_now = true);
  void wait_device_copy(std::uint32_t id, bool write_through_now = true);
  void reap_device_copies();
  /// A fill whose snapshot's arrival (DeviceCopy::arrival) is not reaped yet.
  bool arrival_pending(const DeviceCopy& c) const;
  /// The arrival of n's snapshot (`arrival`, transfer `arrival_id`) failed: the fills ordered
  /// after it read nothing usable and fail when reaped, whatever their engine says.
  void fail_fills_after(const Node* n, Xfer arrival, std::uint32_t arrival_id);
  /// Waits for the materializations in flight (slot_holders: and the fills of released
  /// requests, which hold a slot too): making room, which must see their pages and slots.
  void settle_device_copies(bool slot_holders);
  /// The engine ticket of the copy that brings n's snapshot onto the GPU (kPromote,
  /// kMaterialize); nullopt when none is in flight or it is not a TransferEngine copy.
  std::optional<TicketId> snapshot_arrival(const Node* n) const;
  /// Submits the copy of the request's state in `slot` into fresh pages of the GPU pool (room
  /// made) as n's arriving GPU snapshot; the slot is the copy's from now on. false: no room or
  /// the engine refused it (nothing changed, the caller keeps its slot).
  bool materialize(Node* n, GpuSlotId slot, StreamHandle stream);
  /// kPending / kDone / kFailed of a lock's path and snapshot, as poll(lock) without reaping.
  TransferState lock_state(const LockRecord& rec) const;
  void wait_promotions(const LockRecord& rec);
  /// The lock's prefix (its KV path and its snapshot on GPU) was lost by a failed copy.
  bool prefix_lost(const LockRecord& rec) const;
  /// After a failed promotion: moves the lock to the deepest usable boundary above the
  /// failure (promoting its snapshot if it is on host), or to the root.
  Status resume_earlier(LockId lock, LockRecord& rec);
  Status validate_insert(LockId lock, const LockRecord& rec, std::span<const Token> tokens,
                         std::span<const GpuPageId> pages, std::optional<GpuSlotId> snapshot) const;
  /// insert(): waits for the copy of the node the insert will split, walking from `from`
  /// (at token `from_pos`) along `tokens`.
  void settle_insert(Node* from, std::size_t from_pos, std::span<const Token> tokens);
  /// insert() once validated and settled: adopts the caller's pages below `from`, moves the
  /// lock, attaches the snapshot.
  Result<InsertResult> apply_insert(LockRecord& rec, Node* from, std::size_t from_pos,
                                    std::span<const Token> tokens, std::span<const GpuPageId> pages,
                                    std::optional<GpuSlotId> snapshot);
  Result<const LockRecord*> find_lock(LockId id) const;
  template <class Id>
  std::string check_ownership(const IdPool<Id>& pool, const RequestOwnership<Id>& owners,
                              const char* name) const;
  void note_host_usage();

  // KV events (prefix_cache_events.cpp)
  /// Reports what changed in n's usable residency since its last report (called by refresh).
  void emit_changes(Node* n);
  void emit(const CacheEvent& event);
  /// AllBlocksCleared, then every node's usable residency as stored events (parents first).
  void emit_contents();
  /// Restarts the stream of every sink that lost events (EventSink::lost_events: a full
  /// queue), so a router's copy is never stale past the next entry point (poll()).
  void restart_lossy_sinks();
  std::uint64_t tail_hash(Node* n);
  /// The namespace whose tree holds n (O(depth + namespaces); only while a sink is attached).
  std::uint32_t namespace_of(const Node* n) const;
  std::vector<std::uint64_t> page_hashes(Node* n);
  /// The attached sinks and the quiet mode of a flush (event_sinks.hpp).
  EventSinks sinks_;
  TimingHooks* timing_ = nullptr;

  CacheConfig config_;
  /// The copies in flight: GPU-host batches, store batches, staged loads (transfers_in_flight.hpp).
  TransfersInFlight xfers_;
  /// The nodes and the namespace roots (radix_tree.hpp).
  RadixTree tree_;
  std::uint64_t clock_ = 0;
  /// Counts reclaim_gpu_*() calls: the round a failed demotion is marked with (node.hpp).
  std::uint64_t room_round_ = 0;
  /// While set (persist()), every node remove_if_empty() frees is appended to it.
  std::vector<const Node*>* removal_log_ = nullptr;
  /// True while make_gpu_*_room() makes room for an allocation: its waits are counted
  /// (CacheStats::alloc_copy_waits).
  bool alloc_room_ = false;
  /// The stream of the request whose call is running (RequestOptions::stream): every
  /// GPU-host batch and device copy submitted meanwhile carries it; nullptr (the engine's
  /// default) outside a request's call and in the watermark step.
  StreamHandle call_stream_ = nullptr;
  /// Sets call_stream_ for one call (restores the previous one at scope exit).
  struct StreamScope {
    PrefixCache* cache;
    StreamHandle saved;
    StreamScope(PrefixCache* c, StreamHandle s) : cache(c), saved(c->call_stream_) {
      c->call_stream_ = s;
    }
    ~StreamScope() { cache->call_stream_ = saved; }
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;
  };
  /// Locks whose fill waits for their snapshot's promotion to start (submit_fill).
  std::vector<LockId> deferred_fills_;

  /// The tiers as parts: each one's eviction orders, ages, pools and held counters
  /// (tier_part.hpp).
  TierPart<Tier::kGpu> gpu_;
  TierPart<Tier::kHost> host_;
  TierPart<Tier::kStore> store_tier_;
  template <Tier T>
  TierPart<T>& tier() {
    if constexpr (T == Tier::kGpu) {
      return gpu_;
    } else if constexpr (T == Tier::kHost) {
      return host_;
    } else {
      return store_tier_;
    }
  }
  template <Tier T>
  const TierPart<T>& tier() const {
    return const_cast<PrefixCache*>(this)->tier<T>();
  }
  /// kCostAware: GreedyDual keys, dead KV first, one shared host pool (config.hpp).
  bool cost_aware_ = true;
  bool shared_host_ = true;
  /// Tokens of recompute a byte of KV saves (a snapshot's: TierOrders::snap_value).
  double kv_value_ = 0;
  /// Spent snapshots (node.hpp, "Eviction orders"): resumes so far, the one that last landed
  /// on a spent snapshot, and whether their spent uses are discounted now (kSpentWindow).
  std::uint64_t resumes_ = 0, last_spent_resume_ = 0;
  bool discount_spent_ = false;

  /// The running requests: locks, request-held ids, the allocation unit (request_table.hpp).
  RequestTable requests_;
  /// The host pins and the pages they hold (pin_table.hpp).
  PinTable pins_;

  CacheStats stats_;

  // Duplicate detection for page lists in O(n) without allocating: an id was seen in the
  // current list iff its stamp equals the current epoch.
  void new_page_list() const;
  bool seen_before(GpuPageId id) const;
  mutable std::vector<std::uint32_t> page_stamp_;
  mutable std::uint32_t page_epoch_ = 0;
};

}  // namespace radixtier
