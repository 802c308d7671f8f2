// SglangLikeCache: SGLang's hybrid radix cache (MambaRadixCache) with its device pools, as a
// CacheBackend the simulator's scheduler drives. The design it reproduces, with sources, is in
// docs/sglang-like.md; the snapshot placement (no_buffer / extra_buffer) stays in the
// scheduler's SnapshotPolicy, as for the sglang-like rows on PrefixCache.
//
// A radix tree of pages (one node per page, content-addressed by the chained block hash; a
// node without a state is SGLang's "tombstone"), with SGLang's rules:
//   - match: the deepest node on the path with a state (_match_prefix_helper); the matched
//     node and every node above it are refreshed, child more recent than parent
//     (_match_post_processor, LRUList.reset_node_and_parents_mru);
//   - insert: every node on the inserted path is refreshed from the root down, leaf most
//     recent (_insert_helper); a state lands on the end node unless it has one;
//   - two LRU orders: KV (full_lru_list: an unlocked leaf is evicted) and states
//     (mamba_lru_list: any unlocked state); evicting a leaf frees its KV and its state together
//     and deletes the tombstoned ancestors left childless (_evict_leaf_node,
//     _iteratively_delete_tombstone_leaf); evicting an inner node's state tombstones it
//     (evict_mamba);
//   - a request locks its path: KV from its node to the root, the state of its node
//     (inc_lock_ref);
//   - pools: kSplit = SGLang's default, a KV pool and a state pool of fixed sizes (the
//     --mamba-full-memory-ratio split), each evicting its own LRU; kUnified = the one-buffer
//     opt-in (--enable-unified-memory): one byte budget, a KV allocation evicts from the KV
//     LRU first and a state allocation from the state LRU first, the other kind's LRU when
//     its own has nothing left;
//   - live slots: every running request holds `live_per_request` state slots while it runs
//     (HybridReqToTokenPool.alloc: 1 active slot, + the ping-pong track buffers with
//     extra_buffer), reserved for max_running requests out of the state pool (split) or the
//     budget (unified); a state being cached takes a slot of its own (cache_unfinished_req
//     copies into a new slot).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/config.hpp"

namespace radixtier::sim {

class SglangLikeCache final : public CacheBackend {
 public:
  enum class Pools : std::uint8_t { kSplit, kUnified };
  struct Options {
    std::uint32_t page_size = 0;
    Pools pools = Pools::kSplit;
    std::uint32_t kv_pages = 0;     ///< the KV pool (split); with state_slots, the bytes (unified)
    std::uint32_t state_slots = 0;  ///< the state pool, live slots included (split)
    std::uint64_t page_bytes = 0, state_bytes = 0;
    std::uint32_t max_running = 1;
    std::uint32_t live_per_request = 1;  ///< 1 no_buffer; 1 + track buffers extra_buffer
  };
  /// kInvalidArgument when a size is 0 or the live slots leave no room to cache a state.
  static Result<std::unique_ptr<SglangLikeCache>> create(const Options& o);

  std::uint32_t page_size() const override { return o_.page_size; }
  Result<Admission> admit(std::span<const Token> prompt) override;
  Result<TransferState> poll(LockId lock) override;
  Result<std::size_t> wait(LockId lock) override;
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
  CacheStats stats() const override { return stats_; }
  std::string check_invariants() const override;

  std::size_t cached_pages() const { return nodes_in_tree_; }
  std::size_t cached_states() const { return states_in_tree_; }
  /// Pages / state slots free now (split); in the unified pool, what the free bytes hold.
  std::uint64_t free_pages() const;
  std::uint64_t free_state_slots() const;
  /// Whether the prefix `tokens` (whole pages) is a node of the tree / has a state there.
  bool has_kv(std::span<const Token> tokens) const;
  bool has_state(std::span<const Token> tokens) const;

 private:
  static constexpr std::uint32_t kNone = ~0u;
  struct Node {
    std::uint64_t hash = 0;
    std::uint32_t parent = kNone, children = 0;
    std::uint32_t page = kNone, state = kNone;  ///< its KV page, its state slot (kNone: tombstone)
    std::uint32_t full_lock = 0, mamba_lock = 0;
    std::uint64_t stamp = 0;  ///< last access (both LRU orders)
    bool in_leaves = false, in_states = false, live = false;
  };
  struct Request {
    std::vector<std::uint32_t> path;           ///< nodes of [0, inserted), the last one locked
    std::uint32_t locked = 0;                  ///< the node inc_lock_ref'd (root: none)
    bool state_locked = false;                 ///< its state was locked with it
    std::uint32_t resume = 0;                  ///< the node whose state the request resumed from
    std::vector<std::uint32_t> pages, states;  ///< allocated, not in the tree
    std::size_t cached = 0, kv = 0;
  };

  explicit SglangLikeCache(const Options& o);
  Result<Request*> find(LockId lock, const char* what);
  Result<const Request*> find(LockId lock, const char* what) const;
  std::optional<std::uint32_t> lookup(std::uint64_t hash) const;

  /// Files a node in the evictable sets its state says (after any change of stamp, children,
  /// locks or state).
  void refile(std::uint32_t n);
  void touch(std::uint32_t n);
  /// inc_lock_ref / dec_lock_ref: the KV from `n` to the root, and n's state when it has one
  /// (lock returns whether it locked one, unlock is told).
  bool lock_path(std::uint32_t n);
  void unlock_path(std::uint32_t n, bool state);
  /// Evicts the KV LRU's leaf (its page and state) and its tombstoned ancestors; false when
  /// no unlocked leaf is left.
  bool evict_full_one();
  /// Evicts the state LRU's state (a leaf whole, an inner node's state alone); false when no
  /// unlocked state is left.
  bool evict_mamba_one();
  void delete_leaf(std::uint32_t n);
  bool room_for_pages(std::size_t n);
  bool room_for_state();
  std::uint64_t used_bytes() const;

  std::uint32_t take_page();
  std::uint32_t take_slot();
  void put_page(std::uint32_t p);
  void put_slot(std::uint32_t s);

  Options o_;
  std::uint64_t budget_bytes_ = 0;  ///< unified: the one buffer, live reservation excluded
  std::uint32_t cache_slots_ = 0;   ///< split: the state pool less the live reservation
  std::uint32_t pages_used_ = 0, slots_used_ = 0;
  std::vector<std::uint32_t> free_page_ids_, free_slot_ids_;
  std::uint32_t next_page_id_ = 0, next_slot_id_ = 0;
  std::vector<Node> nodes_;  ///< nodes_[0]: the root
  std::vector<std::uint32_t> free_nodes_;
  std::unordered_map<std::uint64_t, std::uint32_t> index_;    ///< hash -> node
  std::set<std::pair<std::uint64_t, std::uint32_t>> leaves_;  ///< unlocked leaves by stamp
  std::set<std::pair<std::uint64_t, std::uint32_t>> states_;  ///< unlocked states by stamp
  std::uint64_t clock_ = 0;
  std::size_t nodes_in_tree_ = 0, states_in_tree_ = 0;
  std::unordered_map<std::uint32_t, Request> requests_;
  std::uint32_t next_lock_ = 0;
  CacheStats stats_;
};

}  // namespace radixtier::sim
