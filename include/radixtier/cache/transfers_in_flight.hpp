// TransfersInFlight: the copies part of PrefixCache. It owns every copy in flight and what
// each will do to its nodes when it lands: the GPU-host batches on the TransferEngine
// (demote, write-through, promote), the store batches on the StoreEngine (store, load) and
// the staged loads (store -> a window of host staging pages -> GPU, chunk by chunk), with
// their ids and the host pages the staging windows hold.
//
// The device copies between live snapshot slots and GPU pool pages (DeviceCopy) are here too.
//
// Invariants (PrefixCache::check_invariants() checks them with the nodes and pools): every
// op names a node whose kv_xfer / snap_xfer is the op's kind and whose *_xfer_id is the
// batch's id; the ids a copy moves between stay held by it until it completes (rule 5); the
// staging pages held equal the staged loads' windows.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "radixtier/cache/node.hpp"
#include "radixtier/cache/timing_hooks.hpp"
#include "radixtier/transfer/store_engine.hpp"
#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier {

// --- GPU <-> host (TransferEngine) ----------------------------------------------------------
/// One resource's copy in a GPU-host batch.
struct CopyOp {
  Node* node;
  bool snapshot;  ///< false: the node's KV pages
  Xfer kind;
};
struct InFlight {
  Ticket ticket;
  std::vector<CopyOp> ops;
  std::uint64_t bytes = 0;   ///< what the batch moves (CacheStats::alloc_wait_bytes)
  std::uint64_t copies = 0;  ///< its slices
  CopyTiming timing{};       ///< filled while timing hooks are attached
  std::chrono::steady_clock::time_point started{};
};
/// A batch under construction, submitted at once by submit_batch().
/// A demoted victim's key in its tier's order when it was taken (its row is off the order
/// while its copy is planned).
struct PlannedVictim {
  Node* node;
  Held held;
  OrderKey key;
};
struct PendingBatch {
  TransferBatch batch;
  std::vector<CopyOp> ops;
  /// The demotions evict<kGpu>() planned, with their keys: a later victim that finds no host
  /// room takes the room of a lower one (PrefixCache::displace_planned), so one batch never
  /// keeps a lower priority on host and drops a higher one.
  std::vector<PlannedVictim> victims;
};

// --- host <-> store (StoreEngine) -----------------------------------------------------------
/// One resource's copy to or from the store: kStore (host -> store; drop_host: free the
/// host copy once written, the write was for room) or kLoad (store -> host, then GPU).
struct StoreOp {
  Node* node;
  bool snapshot;
  Xfer kind;
  bool drop_host = false;
};
struct StoreInFlight {
  std::uint64_t ticket = 0;
  bool writes = false;
  std::vector<StoreOp> ops;
  std::uint64_t bytes = 0;
};
struct StoreBatch {
  std::vector<StoreWrite> writes;
  std::vector<StoreRead> reads;
  std::vector<StoreOp> ops;
  std::uint64_t slots = 0;  ///< store slots the writes take
  bool empty() const { return ops.empty(); }
};

/// The batch of copies over the link between tier T and the one below, either way: GPU <->
/// host on the TransferEngine, host <-> store on the StoreEngine (prefix_cache_links.cpp
/// plans, submits and waits for them).
template <Tier T>
using LinkBatch = std::conditional_t<T == Tier::kGpu, PendingBatch, StoreBatch>;

// --- store -> GPU through host staging pages ------------------------------------------------
/// One chunk of a staged load: records read into its staging pages, then copied to GPU.
struct StagedChunk {
  std::size_t first = 0;            ///< the load's flat KV page it starts at
  std::size_t count = 0;            ///< its KV pages; 0: the target's snapshot
  std::size_t copied = 0;           ///< KV pages copied on to GPU (those that arrived)
  std::vector<HostPageId> staging;  ///< one per page (the snapshot: snapshot_pages())
  std::vector<RecordId> records;    ///< what it reads: one per page, or the snapshot
  bool reading = true;              ///< the store read is in flight, else the copy
  std::uint64_t read = 0;           ///< the store ticket
  Ticket copy;                      ///< the staging -> GPU copy
  std::uint64_t copy_bytes = 0, copy_slices = 0;
  std::chrono::steady_clock::time_point started{};
};
/// A store match loaded store -> a window of host staging pages -> GPU, chunk by chunk.
struct StagedLoad {
  std::vector<Node*> nodes;             ///< the staged KV nodes, root first; nullptr: landed
  std::vector<std::size_t> first_page;  ///< per node its first flat page, then the total
  std::vector<std::size_t> landed;      ///< per node, its pages on GPU
  Node* target = nullptr;         ///< the node whose snapshot is staged, until it lands or fails
  bool snapshot_read = false;     ///< the snapshot's chunk was submitted
  std::size_t next = 0;           ///< the next flat KV page to read
  std::size_t cut = 0;            ///< the first page of the first node that failed (or total)
  std::size_t chunk_pages = 1;    ///< KV pages per chunk
  std::size_t window = 0;         ///< staging pages held
  std::vector<HostPageId> idle;   ///< staging pages no chunk uses now
  std::list<StagedChunk> chunks;  ///< in flight, oldest first
  /// Records of nodes whose read failed its check, erased when no chunk reads them.
  std::vector<RecordId> to_erase;
};

// --- live slot <-> GPU pool pages (TransferEngine, kDeviceToDevice) -------------------------
/// A device copy between a request's snapshot slot and GPU pool pages (issue 33), tracked and
/// reaped like the GPU-host batches so that admit() and insert() never wait for one:
///   kFill         node's cached GPU snapshot pages -> a request's live slot (rule 6). The
///                 request's lock keeps the node's snapshot_lock until it lands; the slot is
///                 the request's (RequestOwnership), or the copy's (Holder::kTransfer) once the
///                 request released its lock meanwhile (`lock` invalid: the landing frees the
///                 slot and the snapshot lock).
///   kMaterialize  a request's slot -> fresh GPU pool pages, the node's GPU snapshot
///                 (Xfer::kMaterialize on the node; the pages and the slot are the copy's until
///                 it lands: then the pages are the node's and the slot is freed; rule 5).
struct DeviceCopy {
  enum class Kind : std::uint8_t { kFill, kMaterialize };
  Kind kind = Kind::kFill;
  Ticket ticket;
  Node* node = nullptr;
  GpuSlotId slot;
  LockId lock;  ///< kFill: the request filled (invalid: released while in flight)
  std::uint64_t bytes = 0;
};

struct TransfersInFlight {
  std::unordered_map<std::uint32_t, DeviceCopy> device;  ///< device copies by id
  std::uint32_t next_device = 1;
  std::unordered_map<std::uint32_t, InFlight> copies;  ///< GPU-host batches by id
  std::uint32_t next_copy = 1;
  std::unordered_map<std::uint32_t, StoreInFlight> store;  ///< store batches by id
  std::uint32_t next_store = 1;
  std::map<std::uint32_t, StagedLoad> staged;  ///< staged loads by id (ordered: oldest first)
  std::uint32_t next_staged = 1;
  std::size_t staging_pages = 0;  ///< host pages the staged loads hold (the KV share's)
};

}  // namespace radixtier
