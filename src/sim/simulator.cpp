// The simulator (see simulator.hpp): simulate(), one run: the presets, budgets and cache
// config, the instances' processes and their restart, the request loop that routes and steps
// them in time order, and the result gathered from them. Its parts: cache_kind.cpp,
// cluster_metrics.cpp, request_accounting.cpp, result_totals.cpp, ideal_run.cpp,
// oracle_run.cpp, result_json.cpp (the helpers they share: simulator_internal.hpp).
#include "sim/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>

#include "baseline/index_tier_cache.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "sim/attention_only_cache.hpp"
#include "sim/cost_executor.hpp"
#include "sim/counting_store_engine.hpp"
#include "sim/counting_transfer_engine.hpp"
#include "sim/sglang_like_cache.hpp"
#include "sim/simulator_internal.hpp"
#include "sim/vllm_like_cache.hpp"

namespace radixtier::sim {

namespace {

/// The token-weighted hit ratio of rows `which` (failed rows hit nothing).
double hit_ratio_of(const std::vector<RequestRow>& rows, const std::vector<std::size_t>& which) {
  std::uint64_t in = 0, hit = 0;
  for (std::size_t i : which) {
    in += rows[i].prompt_tokens;
    hit += rows[i].ok ? rows[i].cached_tokens : 0;
  }
  return in == 0 ? 0.0 : static_cast<double>(hit) / static_cast<double>(in);
}

/// One modeled GPU: its transfer engine, cache, executor and scheduler.
struct Instance {
  std::unique_ptr<CountingTransferEngine> engine;
  std::unique_ptr<CacheBackend> cache;
  PrefixCache* prefix = nullptr;  ///< `cache` when it is a PrefixCache (node, sglang-like)
  const AttentionOnlyCache* twin = nullptr;  ///< `cache` when it is the attention-only twin
  std::unique_ptr<CostExecutor> executor;
  std::unique_ptr<sched::Scheduler> sched;
  // What the processes before a restart did (a restart ends them):
  std::unordered_map<sched::RequestId, sched::RequestResult> kept;
  CacheStats kept_stats;
  sched::SchedulerStats kept_sched;
  double kept_clock_s = 0;
  std::vector<sched::RequestId> submitted;
  // Samples of the GPU pool's content (SimResult::gpu_kv_share, gpu_snapshot_share).
  std::uint64_t steps = 0, pool_samples = 0;
  double kv_share_sum = 0, snapshot_share_sum = 0;

  void sample_pool() {
    if ((prefix == nullptr && twin == nullptr) || ++steps % 64 != 0) return;
    const CacheConfig& c = prefix != nullptr ? prefix->config() : twin->config();
    if (c.gpu_pages == 0) return;
    const TierSizes gpu = prefix != nullptr ? prefix->sizes().gpu : twin->sizes().gpu;
    const std::uint64_t snapshot_pages = (c.snapshot_bytes + c.page_bytes - 1) / c.page_bytes;
    kv_share_sum += double(gpu.kv_pages_evictable + gpu.kv_pages_locked) / c.gpu_pages;
    snapshot_share_sum +=
        double((gpu.snapshots_evictable + gpu.snapshots_locked) * snapshot_pages) / c.gpu_pages;
    ++pool_samples;
  }
};

}  // namespace

Result<SimResult> simulate(const Scenario& s, const SimOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  auto model = resolve_model(o.model, o.dtypes);
  if (!model) return model.status();
  auto hw = find_hardware(o.hardware);
  if (!hw) return hw.status();
  if (!(o.decode_step_s >= 0 && std::isfinite(o.decode_step_s))) {
    return invalid_argument("--decode-step-s must be a finite number of seconds >= 0");
  }
  const std::size_t n_inst = o.instances > 0
                                 ? o.instances
                                 : (s.is_trace() ? default_instances(s, *hw, o.decode_step_s) : 1);
  if (n_inst > kMaxInstances) {
    return invalid_argument("--instances " + std::to_string(n_inst) + ": at most " +
                            std::to_string(kMaxInstances));
  }
  if (n_inst > 1 && !s.is_trace()) {
    return invalid_argument("--instances > 1 needs a trace scenario: '" + s.name +
                            "' is one conversation");
  }

  SimResult out;
  out.scenario = s.name;
  out.cache = to_string(o.cache);
  out.model = model->name;
  out.hardware = std::string(hw->name);
  out.instances = n_inst;
  out.router = n_inst > 1 ? to_string(o.router) : "-";
  Budget budget = s.budget;
  const bool sglang = o.cache == CacheKind::kSglangLike || o.cache == CacheKind::kSglangUnified;
  if (budget.gpu_kv_tokens == 0 && sglang) {
    // SGLang sizes its state pool from the memory ratio (model_runner_kv_cache_mixin.py,
    // handle_max_mamba_cache): rest x r / (1 + r) in whole slots, the rest KV.
    auto bytes = gpu_cache_bytes(*hw, *model);
    if (!bytes) return bytes.status();
    const double r = o.sglang.mamba_full_memory_ratio;
    if (!(r > 0)) return invalid_argument("--sglang-memory-ratio must be > 0");
    const auto slots = static_cast<std::uint32_t>(static_cast<double>(*bytes) * r / (1 + r) /
                                                  static_cast<double>(model->snapshot_bytes()));
    budget.gpu_snapshot_slots = std::max(slots, 1u);
    const std::uint64_t state = std::uint64_t{budget.gpu_snapshot_slots} * model->snapshot_bytes();
    if (*bytes <= state) return invalid_argument("--sglang-memory-ratio leaves no GPU room for KV");
    budget.gpu_kv_tokens = static_cast<std::size_t>((*bytes - state) / model->kv_bytes_per_token() /
                                                    s.page_size * s.page_size);
  }
  if (budget.gpu_kv_tokens == 0) {
    // Derived from the presets: what HBM holds beside the weights, the runtime and the GPU
    // snapshot slots (docs/simulator.md, "GPU KV budget").
    auto bytes = gpu_cache_bytes(*hw, *model);
    if (!bytes) return bytes.status();
    const std::uint64_t slots = std::uint64_t{budget.gpu_snapshot_slots} * model->snapshot_bytes();
    if (*bytes <= slots) {
      return Status(ErrorCode::kFailedPrecondition, "no GPU room for KV beside " +
                                                        std::to_string(budget.gpu_snapshot_slots) +
                                                        " snapshot slots on " + out.hardware);
    }
    budget.gpu_kv_tokens = static_cast<std::size_t>((*bytes - slots) / model->kv_bytes_per_token() /
                                                    s.page_size * s.page_size);
  }
  // Far above any GPU's pool (an H200 holds about 5M tokens of this project's models): a pool
  // this large is a model whose KV is a few bytes per token, or a typo, and its page
  // bookkeeping would not fit this machine's memory.
  if (budget.gpu_kv_tokens > kMaxGpuKvTokens) {
    return invalid_argument("the GPU KV pool is " + std::to_string(budget.gpu_kv_tokens) +
                            " tokens per instance (" + std::to_string(model->kv_bytes_per_token()) +
                            " bytes of KV per token), more than 2^31: give --gpu-kv-tokens");
  }
  if (budget.gpu_kv_tokens * n_inst > kMaxClusterGpuKvTokens) {
    return invalid_argument(std::to_string(n_inst) + " instances of " +
                            std::to_string(budget.gpu_kv_tokens) +
                            " GPU KV tokens each: more than 2^34 tokens in all, beyond what "
                            "this simulator keeps track of in memory (fewer --instances or a "
                            "smaller --gpu-kv-tokens)");
  }
  out.config = cache_config(budget, *model, s.page_size);
  out.config.snapshot_eviction = o.eviction;
  out.config.write_policy = o.write_policy;
  // The shared tier publishes from host copies: with it the node cache writes through.
  const bool with_shared = o.shared_bytes > 0 && o.cache == CacheKind::kNode;
  if (with_shared) out.config.write_policy = WritePolicy::kWriteThrough;
  out.config.load_back_min_tokens = o.load_back_min_tokens;
  out.config.max_snapshots_per_path = o.max_snapshots_per_path;
  out.config.gpu_free_low_watermark = o.gpu_free_low_watermark;
  out.config.gpu_free_high_watermark = o.gpu_free_high_watermark;
  out.total_budget_bytes = detail::total_bytes(out.config);
  if (s.is_trace()) {
    out.ceiling_ratio = trace_token_ceiling(s).ratio();
    out.ceiling_blocks_ratio = infinite_cache_ceiling(s.trace).ratio();
    out.trace_construction = s.trace_parents ? "faithful" : "hash-only";
    out.trace_with_parent = s.trace_parents ? s.trace_parents->with_parent : 0;
  }
  if (o.cache == CacheKind::kIdeal || o.cache == CacheKind::kOracle) {
    auto r = o.cache == CacheKind::kIdeal ? detail::simulate_ideal(s, *model, *hw, std::move(out))
                                          : detail::simulate_oracle(s, *model, *hw, std::move(out));
    if (r) {
      detail::finish_cluster(*r, s, *hw, o.decode_step_s, 0);
      r->wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return r;
  }

  const std::uint64_t host_budget =  // what the scenario gives every cache's host tier
      std::uint64_t{out.config.host_pages} * out.config.page_bytes +
      std::uint64_t{out.config.host_snapshot_slots} * out.config.snapshot_bytes;
  CacheConfig base_config = out.config;
  if (sglang && !o.sglang.hicache) {
    base_config.host_pages = 0;
    base_config.host_snapshot_slots = 0;
  }
  CacheConfig config = config_for(o.cache, base_config);
  if (budget.host_snapshot_bytes > 0 &&
      (o.cache == CacheKind::kNode || o.cache == CacheKind::kSglangLike ||
       o.cache == CacheKind::kGpuOnly)) {
    // PrefixCache keeps a host snapshot in whole pages of its one host pool
    // (CacheConfig::snapshot_pages(), rounded up): host snapshots given in bytes (the trace,
    // --host-gib, --host-snapshot-gib) count at that rounded size, and what is left of their
    // bytes goes to KV pages, so the pool stays within the budget. Snapshots given in slots
    // (the seed scenarios' 32) keep their slots.
    const std::uint64_t slot_bytes = std::uint64_t{config.snapshot_pages()} * config.page_bytes;
    // node: the budget's snapshot bytes; sglang-like: its own split (config_for), in slots
    const std::uint64_t snap_bytes =
        o.cache == CacheKind::kNode
            ? budget.host_snapshot_bytes
            : std::uint64_t{config.host_snapshot_slots} * config.snapshot_bytes;
    if (slot_bytes > config.snapshot_bytes && snap_bytes > 0) {
      config.host_snapshot_slots = static_cast<std::uint32_t>(snap_bytes / slot_bytes);
      config.host_pages += static_cast<std::uint32_t>(
          (snap_bytes - std::uint64_t{config.host_snapshot_slots} * slot_bytes) /
          config.page_bytes);
    }
  }
  // SGLang without HiCache (its default) runs on SglangLikeCache, its own device pools; with
  // HiCache on PrefixCache configured as SGLang (docs/sglang-like.md).
  const bool sglang_pools = o.cache == CacheKind::kSglangUnified ||
                            (o.cache == CacheKind::kSglangLike && config.host_pages == 0 &&
                             config.host_snapshot_slots == 0);
  if (o.cache == CacheKind::kNode || (o.cache == CacheKind::kSglangLike && !sglang_pools)) {
    // PrefixCache keeps cached snapshots in pages of its GPU pool (issue 21): of the GPU
    // snapshot bytes the budget gives, the live slots running requests compute in stay slots
    // (a resumed state and one being materialized each, live_slots_for), the rest joins the
    // pool. sglang-like runs on PrefixCache too, so its cached states share that pool with KV
    // under its LRU where SGLang keeps a separate state pool (MambaPool) of its memory ratio:
    // measured stronger than the split on this trace (docs/sglang-like.md), so the comparison
    // does not flatter node.
    const std::uint32_t live = std::min(config.gpu_snapshot_slots, live_slots_for(s.max_running));
    const std::uint64_t freed =
        std::uint64_t{config.gpu_snapshot_slots - live} * config.snapshot_bytes;
    config.gpu_pages += static_cast<std::uint32_t>(freed / config.page_bytes);
    config.gpu_snapshot_slots = live;
  }
  if (o.cache == CacheKind::kAttentionOnly || sglang || o.cache == CacheKind::kVllmLike ||
      o.cache == CacheKind::kNode) {
    out.config = config;
  }
  const bool vllm = o.cache == CacheKind::kVllmLike;
  VllmBlockGeometry vg;
  std::uint32_t vllm_blocks = 0;
  std::uint64_t vllm_cpu_ids = 0;  // the CPU offloading tier, in block ids
  if (vllm) {
    auto g = vllm_block_geometry(model->full_layers, model->kv_bytes_per_token(), model->gdn_layers,
                                 model->snapshot_bytes());
    if (!g) return g.status();
    vg = *g;
    // The same GPU bytes as every other cache, in block ids of one pool.
    const std::uint64_t gpu = std::uint64_t{config.gpu_pages} * config.page_bytes +
                              std::uint64_t{config.gpu_snapshot_slots} * config.snapshot_bytes;
    vllm_blocks = static_cast<std::uint32_t>(gpu / vg.id_bytes);
    if (o.vllm_offload) vllm_cpu_ids = host_budget / vg.id_bytes;
    // What the JSON's config says: pages are vLLM blocks; states are blocks of the same pool.
    out.config.page_size = vg.block_size;
    out.config.page_bytes = vg.id_bytes * vg.kv_ids;
    out.config.gpu_pages = vllm_blocks / vg.kv_ids;
    out.config.gpu_snapshot_slots = 0;
  }
  const bool node_like = o.cache == CacheKind::kNode || o.cache == CacheKind::kAttentionOnly;
  const char* default_policy =
      node_like ? kDefaultPolicy
      : sglang  ? (o.sglang.extra_buffer ? "sglang-extra-buffer" : "sglang-no-buffer")
      : vllm    ? "every-chunk"
                : "end-only";
  auto policy = sched::SnapshotPolicy::parse(!o.policy.empty() ? o.policy : default_policy);
  if (!policy) return policy.status();

  sched::SchedulerConfig sc;
  sc.chunk_tokens = s.chunk_tokens;
  if (!sglang && !vllm) {
    // The engine's own chunked prefill (the peers set theirs below); the placement grid
    // stays s.chunk_tokens, states inside a forward are captured.
    if (o.forward_tokens % s.chunk_tokens != 0) {
      return invalid_argument("--forward-tokens " + std::to_string(o.forward_tokens) +
                              ": must be a multiple of the scenario's chunk, " +
                              std::to_string(s.chunk_tokens) + " tokens");
    }
    const std::size_t engine =
        o.forward_tokens > 0 ? o.forward_tokens : sglang_chunk_tokens(hw->hbm_bytes);
    sc.forward_tokens = std::max<std::size_t>(1, engine / s.chunk_tokens) * s.chunk_tokens;
  }
  if (sglang) {
    // SGLang's chunked prefill: its own size, counted from where the request resumed.
    sc.chunk_tokens =
        o.sglang.chunk_tokens > 0 ? o.sglang.chunk_tokens : sglang_chunk_tokens(hw->hbm_bytes);
    sc.chunk_origin = sched::ChunkOrigin::kResume;
  }
  if (vllm) {
    // arg_utils.py: max_num_batched_tokens 8192 for `vllm serve` on >= 70 GiB GPUs, else
    // 2048; align mode cuts each chunk down to whole blocks (_mamba_block_aligned_split).
    const std::size_t budget = o.vllm_chunk_tokens > 0 ? o.vllm_chunk_tokens
                               : hw->hbm_bytes >= 70.0 * static_cast<double>(kGiB) ? 8192
                                                                                   : 2048;
    sc.chunk_tokens = std::max<std::size_t>(1, budget / vg.block_size) * vg.block_size;
    sc.chunk_origin = sched::ChunkOrigin::kResume;
    // Align mode in decode: each block filled gets its state cached (MambaManager's running
    // block becomes a cached block when full), so every block boundary decode crosses.
    sc.insert_decode_checkpoints = true;
  }
  sc.max_running = s.max_running;
  sc.policy = *policy;
  sc.max_admissions = 64;
  sc.check_invariants = o.check_invariants;
  sc.kv_bytes_per_token = model->kv_bytes_per_token();
  // extra_buffer tracks decode states every mamba_track_interval tokens; no_buffer inserts the
  // whole sequence at the finish (every page here).
  if (sglang && policy->kind() == sched::SnapshotPolicy::Kind::kSglangExtraBuffer) {
    sc.decode_checkpoint_interval = sched::SnapshotPolicy::kSglangTrackInterval;
  }
  out.policy = policy->name();
  out.eviction = node_like ? radixtier::to_string(config.snapshot_eviction)
                 : sglang  ? std::string(radixtier::to_string(config.snapshot_eviction)) +
                                (o.cache == CacheKind::kSglangUnified ? "+unified"
                                 : config.host_pages > 0              ? "+hicache"
                                                                      : "")
                 : vllm && vllm_cpu_ids > 0 ? "lru+cpu-offload"
                                            : "lru";

  CostExecutorOptions eo;
  eo.decode_step_s = o.decode_step_s;
  eo.decode_batch = s.max_running;
  // vllm-like: states are blocks; SglangLikeCache: slot ids of its own pool
  eo.gpu_slots = vllm || sglang_pools ? 0 : config.gpu_snapshot_slots;
  // The stores outlive the caches (declared first, destroyed last): a restart keeps them.
  const bool with_store = o.disk_bytes > 0 && o.cache == CacheKind::kNode;
  if (s.restart_before && s.is_trace()) {
    return invalid_argument("scenario '" + s.name + "': a restart needs a non-trace scenario");
  }
  std::vector<std::unique_ptr<CountingStoreEngine>> stores(n_inst);
  if (with_store) {
    out.disk_bytes = o.disk_bytes;
    for (auto& st : stores) {
      auto made = CountingStoreEngine::create(
          CountingStoreEngine::geometry_for(config, o.disk_bytes), config.host_pool_pages());
      if (!made) return made.status();
      st = std::move(*made);
    }
  }
  // The shared tier: one content model every instance reads and publishes to.
  std::unique_ptr<SharedTierModel> shared;
  if (with_shared) {
    SharedTierOptions so;
    so.capacity_bytes = o.shared_bytes;
    so.page_size = config.page_size;
    so.page_bytes = config.page_bytes;
    so.snapshot_bytes = config.snapshot_bytes;
    out.shared.capacity_bytes = o.shared_bytes;
    out.shared.shards = o.shared_shards > 0 ? o.shared_shards : n_inst;
    so.bandwidth = out.shared.bandwidth = shared_bandwidth(*hw, out.shared.shards);
    so.latency_s = out.shared.latency_s = hw->shared.latency_s;
    so.recompute_s = [hw = *hw](std::size_t from, std::size_t to) {
      return prefill_seconds(hw, static_cast<double>(from), static_cast<double>(to));
    };
    shared = std::make_unique<SharedTierModel>(std::move(so));
  }
  // One process of instance k: a transfer engine, a cache (on the store), a scheduler.
  auto start_process = [&](Instance& in, std::size_t k) -> Status {
    in.engine = std::make_unique<CountingTransferEngine>(config);
    in.prefix = nullptr;
    in.twin = nullptr;
    if (sglang_pools) {
      SglangLikeCache::Options sg;
      sg.page_size = config.page_size;
      sg.pools = o.cache == CacheKind::kSglangUnified ? SglangLikeCache::Pools::kUnified
                                                      : SglangLikeCache::Pools::kSplit;
      sg.kv_pages = config.gpu_pages;
      sg.state_slots = config.gpu_snapshot_slots;
      sg.page_bytes = config.page_bytes;
      sg.state_bytes = config.snapshot_bytes;
      sg.max_running = static_cast<std::uint32_t>(s.max_running);
      sg.live_per_request = sglang_live_slots_per_request(
          policy->kind() == sched::SnapshotPolicy::Kind::kSglangExtraBuffer);
      auto c = SglangLikeCache::create(sg);
      if (!c) return c.status();
      in.cache = std::move(*c);
    } else if (o.cache == CacheKind::kNode || o.cache == CacheKind::kSglangLike) {
      auto c = stores[k] ? PrefixCache::create(config, *in.engine, stores[k].get())
                         : PrefixCache::create(config, *in.engine);
      if (!c) return c.status();
      if (o.on_cache) o.on_cache(**c, k);
      in.prefix = c->get();
      in.cache = std::move(*c);
    } else if (o.cache == CacheKind::kAttentionOnly) {
      auto c = AttentionOnlyCache::create(config, *in.engine);
      if (!c) return c.status();
      in.twin = c->get();
      in.cache = std::move(*c);
    } else if (vllm) {
      auto c = VllmLikeCache::create(vllm_blocks, vg.block_size, vg.kv_ids, vg.state_ids,
                                     vllm_cpu_ids, vg.id_bytes);
      if (!c) return c.status();
      in.cache = std::move(*c);
    } else {
      auto c = index_tier::IndexTierCache::create(config, *in.engine);
      if (!c) return c.status();
      in.cache = std::move(*c);
    }
    auto made = sched::Scheduler::create(*in.cache, *in.executor, sc);
    if (!made) return made.status();
    in.sched = std::move(*made);
    if (shared) in.sched->set_shared_hook(&shared->attach(k, *in.prefix));
    return Status::ok();
  };
  std::vector<std::unique_ptr<Instance>> inst;
  for (std::size_t k = 0; k < n_inst; ++k) {
    auto in = std::make_unique<Instance>();
    in->executor = std::make_unique<CostExecutor>(*hw, model->snapshot_bytes(), eo);
    if (Status st = start_process(*in, k); !st) return st;
    inst.push_back(std::move(in));
  }
  // The restart: each process shuts down gracefully (persist() where the cache has a store:
  // what a server's shutdown calls), keeps its results, and a new one starts on the same store
  // with empty GPU and host. Caches without a store lose everything.
  auto restart_all = [&]() -> Status {
    for (std::size_t k = 0; k < n_inst; ++k) {
      Instance& in = *inst[k];
      if (stores[k]) {
        const CacheStats before = in.cache->stats();
        // kOutOfMemory: the store could not keep all of it (a small --disk-gib): the rest is
        // on it, and the restart serves that.
        if (Status st = in.prefix->persist(); !st && st.code() != ErrorCode::kOutOfMemory)
          return st;
        const CacheStats after = in.cache->stats();
        out.restart.persist_bytes += after.bytes_to_store - before.bytes_to_store;
        out.restart.persist_writes += after.store_writes - before.store_writes;
      }
      for (sched::RequestId id : in.submitted) {
        if (const sched::RequestResult* r = in.sched->result(id)) in.kept[id] = *r;
      }
      detail::add_stats(in.kept_stats, in.cache->stats());
      detail::add_sched_stats(in.kept_sched, in.sched->stats());
      in.kept_clock_s += in.sched->now();
      in.sched.reset();  // it refers to the cache
      in.cache.reset();
      in.prefix = nullptr;
      in.twin = nullptr;
      in.engine.reset();
      if (Status st = start_process(in, k); !st) return st;
    }
    out.restart.persist_s =
        disk_write_seconds(*hw, out.restart.persist_writes, out.restart.persist_bytes);
    return Status::ok();
  };
  // The prefix router's index of an instance is as large as that instance's cache: its GPU
  // bytes, and the host budget only when the cache has a host tier (vllm-like without its
  // offloading tier, sglang-like without HiCache and gpu-only have none).
  const bool host_tier = vllm ? vllm_cpu_ids > 0 : config.host_pool_pages() > 0;
  const std::uint64_t cache_bytes =
      out.total_budget_bytes - (host_tier ? 0 : std::min(host_budget, out.total_budget_bytes));
  Router router(o.router, n_inst,
                cache_bytes / (std::uint64_t{kTraceBlockTokens} * model->kv_bytes_per_token()),
                s.page_size);

  // Submit lazily (a trace's prompts are synthesized when they are about to arrive) and route
  // each request when it arrives: first every instance steps until its next step would run at
  // or after the arrival, so the router sees the loads of that moment and each scheduler sees
  // exactly what it would with all of its requests queued.
  const std::size_t n = s.size();
  // A trace's prompts, built in order (a parent's prompt is kept while its turns are to come);
  // both passes below go in order, each with its own builder.
  std::optional<TracePrompts> prompts_of;
  auto request = [&](std::size_t i) {
    if (!s.is_trace()) return s.requests[i].request;
    if (!prompts_of) prompts_of.emplace(s.trace, s.trace_parents.get());
    return trace_request(s, i, prompts_of->prompt(i));
  };
  auto request_id = [&](std::size_t i) -> sched::RequestId {
    return s.is_trace() ? i + 1 : s.requests[i].request.id;
  };
  std::vector<std::size_t> where(n, 0);
  std::uint64_t steps = 0;
  Status run_status;
  auto advance_until = [&](double t) {
    for (auto& in : inst) {
      sched::Scheduler& sched = *in->sched;
      while (!sched.idle() && sched.next_step_s() < t) {
        if (Status st = sched.step(); !st) return st;
        in->sample_pool();
        if (o.on_step) o.on_step();
        if (o.progress && ++steps % 4096 == 0) {
          sched::Progress p;
          p.submitted = n;
          for (const auto& i2 : inst) {
            p.finished += i2->sched->stats().finished;
            p.failed += i2->sched->stats().failed;
            p.running += i2->sched->running();
            p.queued += i2->sched->queued();
            p.forwarded_tokens += i2->sched->stats().forwarded_tokens;
            p.now_s = std::max(p.now_s, i2->sched->now());
          }
          o.progress(p);
        }
      }
    }
    return Status::ok();
  };
  std::vector<std::size_t> load(n_inst, 0);
  const bool restarts = s.restart_before.has_value() && o.restart;
  // The fresh instance: instance 0 restarts empty at its first idle moment at or after the
  // midpoint (an orderly restart, nothing in flight is lost; the store and the shared tier
  // keep theirs, the router forgets what it sent there, as a KV event AllBlocksCleared tells
  // a real one).
  const bool fresh = o.fresh_instance;
  if (fresh && (!s.is_trace() || n_inst < 2)) {
    return invalid_argument("--fresh-instance needs a trace and at least 2 instances");
  }
  auto restart_fresh = [&](std::size_t i) -> Status {
    Instance& in = *inst[0];
    for (sched::RequestId id : in.submitted) {
      if (const sched::RequestResult* r = in.sched->result(id)) in.kept[id] = *r;
    }
    detail::add_stats(in.kept_stats, in.cache->stats());
    detail::add_sched_stats(in.kept_sched, in.sched->stats());
    // The trace's clock is absolute: the new scheduler jumps to its first arrival.
    in.sched.reset();
    in.cache.reset();
    in.prefix = nullptr;
    in.twin = nullptr;
    in.engine.reset();
    if (Status st = start_process(in, 0); !st) return st;
    router.forget(0);
    out.fresh.ran = true;
    out.fresh.restart_request = i + 1;
    out.fresh.restart_s = detail::arrival_s(s, i);
    return Status::ok();
  };
  for (std::size_t i = 0; i < n && run_status; ++i) {
    if (restarts && i == *s.restart_before) {
      run_status = advance_until(std::numeric_limits<double>::infinity());
      if (run_status) run_status = restart_all();
      if (!run_status) break;
      out.restart.ran = true;
    }
    run_status = advance_until(detail::arrival_s(s, i));
    if (!run_status) break;
    if (fresh && !out.fresh.ran && i >= n / 2 && inst[0]->sched->idle()) {
      run_status = restart_fresh(i);
      if (!run_status) break;
    }
    if (n_inst > 1) {
      for (std::size_t k = 0; k < n_inst; ++k) {
        load[k] = inst[k]->sched->running() + inst[k]->sched->queued();
      }
      where[i] = router.route(s.trace[i], load);
    }
    (void)inst[where[i]]->sched->submit(request(i));
    if (restarts || fresh) inst[where[i]]->submitted.push_back(request_id(i));
  }
  if (run_status) run_status = advance_until(std::numeric_limits<double>::infinity());
  if (!run_status) out.status = run_status.to_string();
  if (o.on_step) o.on_step();

  // A request's result: from the process that ran it (one before a restart or the last).
  auto result_of = [&](std::size_t i, sched::RequestId id) -> const sched::RequestResult* {
    const Instance& in = *inst[where[i]];
    auto it = in.kept.find(id);
    return it != in.kept.end() ? &it->second : in.sched->result(id);
  };
  out.rows.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    RequestRow row;
    row.id = s.is_trace() ? i + 1 : s.requests[i].request.id;
    row.label = s.is_trace() ? "request " + std::to_string(i + 1) : s.requests[i].label;
    row.prompt_tokens =
        s.is_trace() ? s.trace[i].input_length : s.requests[i].request.prompt.size();
    row.reusable_tokens = s.is_trace() ? (i < s.trace_reusable.size() ? s.trace_reusable[i] : 0) /
                                             s.page_size * s.page_size
                                       : s.requests[i].reusable_tokens;
    const sched::RequestResult* res = result_of(i, row.id);
    if (res == nullptr) {
      row.ok = false;
      row.error = "not finished";
    } else {
      detail::account_request(row, *res, *hw, s.include_queue);
      out.snapshots_kept += res->snapshots_kept;
    }
    row.floor_s = detail::floor_seconds(*hw, *model, row.reusable_tokens, row.prompt_tokens);
    row.disk_floor_s =
        detail::disk_floor_seconds(*hw, *model, row.reusable_tokens, row.prompt_tokens);
    out.rows.push_back(std::move(row));
  }
  {
    prompts_of.reset();  // a second in-order pass
    std::vector<sched::Request> prompts;
    std::vector<MissInput> miss_in;
    prompts.reserve(n);  // no reallocation: miss_in holds spans into it
    miss_in.reserve(n);
    std::size_t alignment = s.page_size;
    for (const auto& in : inst) alignment = std::max(alignment, in->sched->learner().alignment());
    for (std::size_t i = 0; i < n; ++i) {
      const sched::RequestResult* res = result_of(i, out.rows[i].id);
      if (res == nullptr || !res->status.is_ok()) continue;
      prompts.push_back(request(i));
      MissInput m;
      m.admitted_s = res->admitted_s;
      m.prompt = prompts.back().prompt;
      m.output = res->output;
      m.cached_tokens = res->cached_tokens;
      m.kv_tokens = res->kv_tokens;
      m.snapshot_boundaries = res->snapshot_boundaries;
      miss_in.push_back(m);
    }
    out.misses = miss_breakdown(miss_in, s.page_size, alignment);
  }
  double executor_s = 0;
  std::uint64_t pool_samples = 0;
  double kv_share_sum = 0, snapshot_share_sum = 0;
  for (const auto& in : inst) {
    detail::add_stats(out.stats, in->kept_stats);  // the processes before a restart (zero without)
    detail::add_stats(out.stats, in->cache->stats());
    detail::add_sched_stats(out.sched, in->kept_sched);
    detail::add_sched_stats(out.sched, in->sched->stats());
    out.placement_alignment = std::max(out.placement_alignment, in->sched->learner().alignment());
    pool_samples += in->pool_samples;
    kv_share_sum += in->kv_share_sum;
    snapshot_share_sum += in->snapshot_share_sum;
    out.keep_finish = in->sched->learner().keep_finish();
    const sched::PlacementLearner& learner = in->sched->learner();
    for (std::size_t k = 0; k < sched::kBoundaryKinds; ++k) {
      out.placement_credits[k] += learner.credits(static_cast<sched::BoundaryKind>(k));
    }
    out.keep_kinds = {learner.keep(sched::BoundaryKind::kPromptEnd),
                      learner.keep(sched::BoundaryKind::kTail),
                      learner.keep(sched::BoundaryKind::kChunk)};
    out.sim_clock_s = std::max(out.sim_clock_s, in->kept_clock_s + in->sched->now());
    executor_s += in->executor->prefill_seconds_total() + in->executor->decode_seconds_total();
  }
  if (pool_samples > 0) {
    out.gpu_kv_share = kv_share_sum / double(pool_samples);
    out.gpu_snapshot_share = snapshot_share_sum / double(pool_samples);
  }
  for (const auto& st : stores) {
    if (!st) continue;
    out.store_records += st->record_count();
    out.store_syncs += st->counts().syncs;
  }
  if (shared) out.shared.counters = shared->counters();
  std::vector<std::size_t> fresh_rows;  // instance 0's first requests after its restart
  if (out.fresh.ran) {
    // Instance 0's first kFreshRequests requests after the restart; the warm instances'
    // requests that arrived from the first of them to the last.
    FreshReport& f = out.fresh;
    std::uint64_t warm_in = 0, warm_hit = 0;
    double first_s = -1, last_s = -1;
    for (std::size_t i = f.restart_request - 1; i < n && f.fresh_requests < kFreshRequests; ++i) {
      if (where[i] != 0) continue;
      if (first_s < 0) first_s = detail::arrival_s(s, i);
      last_s = detail::arrival_s(s, i);
      ++f.fresh_requests;
      fresh_rows.push_back(i);
    }
    for (std::size_t i = 0; i < n && first_s >= 0; ++i) {
      const double t = detail::arrival_s(s, i);
      if (where[i] == 0 || t < first_s || t > last_s) continue;
      ++f.warm_requests;
      warm_in += out.rows[i].prompt_tokens;
      warm_hit += out.rows[i].ok ? out.rows[i].cached_tokens : 0;
    }
    auto ratio = [](std::uint64_t a, std::uint64_t b) {
      return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b);
    };
    f.fresh_hit_ratio = hit_ratio_of(out.rows, fresh_rows);
    f.warm_hit_ratio = ratio(warm_hit, warm_in);
    f.ratio = f.warm_hit_ratio > 0 ? f.fresh_hit_ratio / f.warm_hit_ratio : 0.0;
  }
  out.bytes_h2d = out.stats.bytes_h2d;
  out.bytes_d2h = out.stats.bytes_d2h;
  out.host_bytes_peak = out.stats.host_bytes_peak;
  detail::finish_totals(out);
  detail::finish_cluster(out, s, *hw, o.decode_step_s, executor_s);
  // A comparison run of the same scenario in this process, unobserved.
  auto twin_run = [&](const std::function<void(SimOptions&)>& change) {
    SimOptions t = o;
    change(t);
    t.progress = nullptr;
    t.on_cache = nullptr;
    t.on_step = nullptr;
    return simulate(s, t);
  };
  if (out.fresh.ran) {
    // The same requests in the run without the restart: what a warm instance hit on them.
    auto twin = twin_run([](SimOptions& t) { t.fresh_instance = false; });
    if (!twin) return twin.status();
    FreshReport& f = out.fresh;
    f.same_warm_hit_ratio = hit_ratio_of(twin->rows, fresh_rows);
    f.same_ratio = f.same_warm_hit_ratio > 0 ? f.fresh_hit_ratio / f.same_warm_hit_ratio : 0.0;
  }
  if (out.restart.ran) {
    // The goal's comparison: the same scenario straight through, in the same process.
    auto twin = twin_run([](SimOptions& t) { t.restart = false; });
    if (!twin) return twin.status();
    const std::size_t i = *s.restart_before;
    const RequestRow& after = out.rows.at(i);
    const RequestRow& same = twin->rows.at(i);
    RestartReport& r = out.restart;
    r.request = after.label;
    r.cached_tokens = after.cached_tokens;
    r.cached_tokens_no_restart = same.cached_tokens;
    r.reuse_ratio = same.cached_tokens == 0 ? (after.cached_tokens == 0 ? 1.0 : 0.0)
                                            : static_cast<double>(after.cached_tokens) /
                                                  static_cast<double>(same.cached_tokens);
    r.ttft_s = after.ttft_s;
    r.ttft_s_no_restart = same.ttft_s;
    r.disk_floor_s = after.disk_floor_s;
    r.ttft_ratio = r.disk_floor_s > 0 ? r.ttft_s / r.disk_floor_s : 0.0;
    r.bytes_from_store = after.bytes_from_store;
    r.store_reads = after.store_reads;
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace radixtier::sim
