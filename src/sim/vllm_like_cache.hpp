// VllmLikeCache: vLLM's hybrid prefix caching for GDN/Mamba models (v1 hybrid KV cache
// manager, mamba_cache_mode "align"), as a CacheBackend the simulator's scheduler drives. The
// design it reproduces, with sources, is in docs/vllm-like.md.
//
// One pool of block ids on the GPU, shared by attention KV and recurrent states:
//   - a KV page (block_size tokens of every attention layer) costs kv_ids block ids, a cached
//     state costs state_ids block ids (vLLM: one id per layer group, groups of equal page
//     bytes; Qwen3-Next: 1 attention group, 3 GDN groups);
//   - blocks are content-addressed by the chained hash of the tokens up to their end; a state
//     is addressed by the hash of the block it ends (a state at every chunk end the scheduler
//     offers, page == vLLM block);
//   - a match: attention blocks left to right while cached, then the deepest block boundary
//     among them that has a state (MambaManager.find_longest_cache_hit, right to left);
//   - one free queue, LRU: a freed block goes to the back when it is cached (hashed), to the
//     front when not; a request frees its path tail first; a state is freed at insertion
//     (the running request moves on to a new block); allocation takes from the front and
//     evicts what it takes (a state dies with the first of its blocks taken).
//
// States of a block (the state machine):
//   free (front, no hash) -> owned by a request (ref 1, no hash) -> cached (hash, ref >= 1)
//   -> cached and free (hash, ref 0, in the queue) -> taken: evicted, owned again.
// CPU offloading (vLLM's OffloadingConnector with its native CPU backend, optional): every
// block cached on the GPU is also stored to a CPU LRU of `cpu_ids` block ids (a page or a
// state whole, kept together); an admission extends its GPU match with what the CPU holds,
// the deepest state on either side wins, and what it needs from the CPU is loaded into newly
// taken GPU blocks before the request runs (charged as host -> device bytes).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "radixtier/cache/cache_backend.hpp"
#include "radixtier/config.hpp"
#include "sim/peer_cache_base.hpp"

namespace radixtier::sim {

/// vLLM's block geometry for a hybrid model (HybridAttentionMambaModelConfig
/// .verify_and_update_config, _get_kv_cache_groups_uniform_page_size).
struct VllmBlockGeometry {
  std::uint32_t block_size = 0;  ///< tokens per attention block (16 x cdiv(state, 16 x attn))
  std::uint32_t group_size = 0;  ///< layers per KV cache group
  std::uint32_t kv_ids = 0;      ///< block ids per KV page (attention groups)
  std::uint32_t state_ids = 0;   ///< block ids per cached state (GDN groups)
  std::uint64_t id_bytes = 0;    ///< bytes of one block id (group_size layers' page)
};

/// From per-model numbers: attention layers and KV bytes per token (all of them), GDN layers
/// and the state bytes (all of them). kInvalidArgument when a count is 0.
Result<VllmBlockGeometry> vllm_block_geometry(std::uint32_t full_layers,
                                              std::uint64_t kv_bytes_per_token,
                                              std::uint32_t gdn_layers, std::uint64_t state_bytes);

/// A request VllmLikeCache admitted (internal; PeerCacheBase's `Request`).
struct VllmLikeRequest {
  std::vector<std::uint32_t> path;           ///< cached pages of [0, inserted), pinned
  std::optional<std::uint32_t> path_state;   ///< the state resumed from, pinned
  std::vector<std::uint32_t> pages, states;  ///< allocated, not inserted
  std::size_t cached = 0, inserted = 0;
};

class VllmLikeCache final : public PeerCacheBase<VllmLikeRequest> {
 public:
  /// `blocks` block ids in the pool; pages of `page_size` (= the block size) tokens.
  /// `cpu_ids` > 0: the CPU offloading tier, in block ids of `id_bytes` each.
  static Result<std::unique_ptr<VllmLikeCache>> create(
      std::uint32_t blocks, std::uint32_t page_size, std::uint32_t kv_ids, std::uint32_t state_ids,
      std::uint64_t cpu_ids = 0, std::uint64_t id_bytes = 0);

  std::uint32_t page_size() const override { return page_size_; }
  Result<Admission> admit(std::span<const Token> prompt) override;
  Result<std::vector<GpuPageId>> path_pages(LockId lock) const override;
  Result<GpuSlotId> path_snapshot(LockId lock) const override;
  Result<std::vector<GpuPageId>> alloc_pages(LockId lock, std::size_t n) override;
  Result<GpuSlotId> alloc_snapshot_slot(LockId lock) override;
  Result<InsertResult> insert(LockId lock, std::span<const Token> tokens,
                              std::span<const GpuPageId> pages,
                              std::optional<GpuSlotId> snapshot) override;
  std::string check_invariants() const override;

  std::uint32_t free_ids() const { return static_cast<std::uint32_t>(queue_.size()); }
  std::size_t cached_pages() const { return kv_.size(); }
  std::size_t cached_states() const { return states_.size(); }
  std::size_t cpu_entries() const { return cpu_.size(); }

 private:
  enum class Owner : std::uint8_t { kNone, kPage, kState };
  struct Block {
    Owner owner = Owner::kNone;
    std::uint32_t unit = 0;  ///< the page or state it belongs to
    bool queued = false;     ///< in queue_ (ref 0)
    std::list<std::uint32_t>::iterator at;
  };
  /// A KV page or a state: its block ids, its hash when cached, who holds it.
  struct Unit {
    std::vector<std::uint32_t> ids;
    std::optional<std::uint64_t> hash;
    std::uint32_t ref = 0;
    bool live = false;
  };
  using Request = VllmLikeRequest;

  VllmLikeCache(std::uint32_t blocks, std::uint32_t page_size, std::uint32_t kv_ids,
                std::uint32_t state_ids, std::uint64_t cpu_ids, std::uint64_t id_bytes);
  /// CPU tier key: a page's or a state's hash (a state's tagged so the two never collide).
  static std::uint64_t cpu_key(std::uint64_t hash, bool state) { return state ? ~hash : hash; }
  bool on_cpu(std::uint64_t hash, bool state) const { return cpu_.count(cpu_key(hash, state)); }
  /// Stores a cached unit to the CPU tier (or refreshes it there), evicting LRU entries.
  void offload(std::uint64_t hash, bool state);
  /// Loads a unit from the CPU tier into new GPU blocks, cached and pinned; nullopt when the
  /// GPU has no free block ids for it.
  std::optional<std::uint32_t> load(std::uint64_t hash, bool state);

  /// Takes n ids from the front of the queue, evicting what they held; kOutOfMemory and no
  /// change when fewer are free.
  Result<std::vector<std::uint32_t>> take(std::size_t n);
  void evict(std::uint32_t unit_index);
  std::uint32_t new_unit(Owner kind, std::vector<std::uint32_t> ids);
  void pin(std::uint32_t unit_index);
  /// Drops one reference; at 0 the unit's ids go to the back (cached) or the front (not).
  void unpin(std::uint32_t unit_index);
  /// A page or a snapshot slot a request did not insert: its reference dropped.
  void put_page(std::uint32_t unit_index) override { unpin(unit_index); }
  void put_slot(std::uint32_t unit_index) override { unpin(unit_index); }
  /// single_type_kv_cache_manager.py free(): the path's tail first, so it is evicted first.
  void drop(Request& r) override;

  std::uint32_t page_size_, kv_ids_, state_ids_;
  std::vector<Block> blocks_;
  std::list<std::uint32_t> queue_;  ///< free ids, front evicted first
  std::vector<Unit> units_;
  std::vector<std::uint32_t> free_units_;
  std::unordered_map<std::uint64_t, std::uint32_t> kv_;           ///< hash -> page unit
  std::unordered_map<std::uint64_t, std::uint32_t> states_;       ///< hash -> state unit
  std::uint64_t cpu_capacity_ = 0, cpu_used_ = 0, id_bytes_ = 0;  ///< in block ids, bytes
  struct CpuEntry {
    std::uint64_t key = 0, ids = 0;  ///< cpu_key() and the block ids it holds
  };
  std::list<CpuEntry> cpu_lru_;  ///< front: evicted first
  std::unordered_map<std::uint64_t, std::list<CpuEntry>::iterator> cpu_;
};

}  // namespace radixtier::sim
