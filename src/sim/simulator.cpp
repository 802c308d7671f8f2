// The simulator (see simulator.hpp).
#include "sim/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "baseline/index_tier_cache.hpp"
#include "radixtier/cache/prefix_cache.hpp"
#include "sim/attention_only_cache.hpp"
#include "sim/block_lru_ideal.hpp"
#include "sim/cost_executor.hpp"
#include "sim/counting_store_engine.hpp"
#include "sim/counting_transfer_engine.hpp"
#include "sim/vllm_like_cache.hpp"

namespace radixtier::sim {

const char* to_string(CacheKind kind) {
  switch (kind) {
    case CacheKind::kNode:
      return "node";
    case CacheKind::kIndex:
      return "index";
    case CacheKind::kGpuOnly:
      return "gpu-only";
    case CacheKind::kIdeal:
      return "ideal";
    case CacheKind::kAttentionOnly:
      return "attention-only";
    case CacheKind::kSglangLike:
      return "sglang-like";
    case CacheKind::kVllmLike:
      return "vllm-like";
  }
  return "?";
}

Result<CacheKind> parse_cache_kind(std::string_view text) {
  for (CacheKind k :
       {CacheKind::kNode, CacheKind::kAttentionOnly, CacheKind::kSglangLike, CacheKind::kVllmLike,
        CacheKind::kIndex, CacheKind::kGpuOnly, CacheKind::kIdeal}) {
    if (text == to_string(k)) return k;
  }
  return invalid_argument(
      "unknown cache '" + std::string(text) +
      "' (known: node, attention-only, sglang-like, vllm-like, index, gpu-only, ideal)");
}

CacheConfig config_for(CacheKind kind, const CacheConfig& base) {
  CacheConfig c = base;
  switch (kind) {
    case CacheKind::kGpuOnly:
      c.host_pages = 0;
      c.host_snapshot_slots = 0;
      c.write_policy = WritePolicy::kWriteBack;
      break;
    case CacheKind::kAttentionOnly:
      c = AttentionOnlyCache::twin_config(base);
      break;
    case CacheKind::kSglangLike: {
      // HiCache's two host pools (hi_mamba_radix_cache.py, HiMambaRadixCache.__init__: the
      // same hicache_ratio for MHATokenToKVPoolHost and MambaPoolHost) are each that ratio x
      // their device pool, so the host bytes split as the device pools' bytes do. No host
      // bytes: HiCache off (enable_hierarchical_cache defaults to False).
      const std::uint64_t host = std::uint64_t{base.host_pages} * base.page_bytes +
                                 std::uint64_t{base.host_snapshot_slots} * base.snapshot_bytes;
      const double gpu_states =
          static_cast<double>(base.gpu_snapshot_slots) * static_cast<double>(base.snapshot_bytes);
      const double gpu_all =
          gpu_states + static_cast<double>(base.gpu_pages) * static_cast<double>(base.page_bytes);
      const auto state_bytes = static_cast<std::uint64_t>(
          gpu_all > 0 ? static_cast<double>(host) * gpu_states / gpu_all : 0);
      c.host_snapshot_slots = static_cast<std::uint32_t>(state_bytes / base.snapshot_bytes);
      c.host_pages = static_cast<std::uint32_t>(
          (host - std::uint64_t{c.host_snapshot_slots} * base.snapshot_bytes) / base.page_bytes);
      // hicache_write_policy = write_through (HiCache on: there is a host tier)
      c.write_policy = c.host_pages > 0 ? WritePolicy::kWriteThrough : WritePolicy::kWriteBack;
      c.snapshot_eviction = SnapshotEviction::kLru;  // mamba_lru_list / full_lru_list
      break;
    }
    case CacheKind::kVllmLike:  // GPU only (the offloading connector is not modelled)
      c.host_pages = 0;
      c.host_snapshot_slots = 0;
      break;
    case CacheKind::kNode:
    case CacheKind::kIndex:
    case CacheKind::kIdeal:
      break;
  }
  return c;
}

std::size_t sglang_chunk_tokens(double hbm_bytes) {
  const double gib = hbm_bytes / static_cast<double>(kGiB);
  if (gib < 35) return 2048;
  if (gib < 60) return 4096;
  if (gib < 160) return 8192;
  return 16384;
}

namespace {

double arrival_s(const Scenario& s, std::size_t i) {
  return s.is_trace() ? static_cast<double>(s.trace[i].timestamp_ms) / 1000.0
                      : s.requests[i].request.arrival_s;
}

}  // namespace

double offered_busy_seconds(const Scenario& s, const HardwarePreset& hw, double decode_step_s) {
  const double per_token =
      decode_step_s / static_cast<double>(std::max<std::size_t>(1, s.max_running));
  double busy = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double prompt = s.is_trace() ? static_cast<double>(s.trace[i].input_length)
                                       : static_cast<double>(s.requests[i].request.prompt.size());
    const std::size_t out =
        s.is_trace() ? s.trace[i].output_length : s.requests[i].request.max_new_tokens;
    busy += prefill_seconds(hw, 0, prompt) + static_cast<double>(out > 0 ? out - 1 : 0) * per_token;
  }
  return busy;
}

double trace_span_seconds(const Scenario& s) {
  return s.size() < 2 ? 0.0 : arrival_s(s, s.size() - 1) - arrival_s(s, 0);
}

std::size_t default_instances(const Scenario& s, const HardwarePreset& hw, double decode_step_s,
                              double target) {
  const double span = trace_span_seconds(s);
  if (span <= 0 || target <= 0) return 1;
  const double busy = offered_busy_seconds(s, hw, decode_step_s);
  auto n = static_cast<std::size_t>(std::max(1.0, std::ceil(busy / (target * span))));
  while (busy / (static_cast<double>(n) * span) > target) ++n;
  return n;
}

namespace {

/// floor_seconds() with every reusable byte read from the preset's disk instead of moved over
/// PCIe: the floor of a request whose prefix survives only on the store (after a restart).
double disk_floor_seconds(const HardwarePreset& hw, const ModelGeometry& m, std::size_t reusable,
                          std::size_t prompt) {
  const std::uint64_t bytes =
      reusable == 0 ? 0 : reusable * m.kv_bytes_per_token() + m.snapshot_bytes();
  return ttft_seconds(
      hw, disk_read_seconds(hw, 0, bytes),
      prefill_seconds(hw, static_cast<double>(reusable), static_cast<double>(prompt)));
}

double floor_seconds(const HardwarePreset& hw, const ModelGeometry& m, std::size_t reusable,
                     std::size_t prompt) {
  const std::uint64_t bytes =
      reusable == 0 ? 0 : reusable * m.kv_bytes_per_token() + m.snapshot_bytes();
  return ttft_seconds(
      hw, reload_seconds(hw, 0, bytes),
      prefill_seconds(hw, static_cast<double>(reusable), static_cast<double>(prompt)));
}

void finish_totals(SimResult& out) {
  for (const RequestRow& row : out.rows) {
    out.input_tokens += row.prompt_tokens;
    if (!row.ok) {
      ++out.failed;
      continue;
    }
    out.cached_tokens += row.cached_tokens;
    out.recomputed_tokens += row.recomputed_tokens;
    out.ttft_s_total += row.ttft_s;
  }
  out.requests = out.rows.size();
  out.hit_ratio = out.input_tokens == 0 ? 0.0
                                        : static_cast<double>(out.cached_tokens) /
                                              static_cast<double>(out.input_tokens);
  if (!out.rows.empty()) {
    const RequestRow& last = out.rows.back();
    out.ttft_s_last = last.ttft_s;
    out.floor_s_last = last.floor_s;
    out.cached_tokens_last = last.cached_tokens;
    out.recomputed_tokens_last = last.recomputed_tokens;
  }
}

std::uint64_t total_bytes(const CacheConfig& c) {
  return (std::uint64_t{c.gpu_pages} + c.host_pages) * c.page_bytes +
         (std::uint64_t{c.gpu_snapshot_slots} + c.host_snapshot_slots) * c.snapshot_bytes;
}

Result<SimResult> simulate_ideal(const Scenario& s, const ModelGeometry& m,
                                 const HardwarePreset& hw, SimResult out) {
  if (!s.is_trace()) {
    return invalid_argument("cache 'ideal' is the trace's reference column: scenario '" + s.name +
                            "' is not a trace");
  }
  BlockLruIdeal ideal(out.instances * total_bytes(out.config) /
                          (std::uint64_t{kTraceBlockTokens} * m.kv_bytes_per_token()),
                      s.page_size);
  out.rows.reserve(s.trace.size());
  for (std::size_t i = 0; i < s.trace.size(); ++i) {
    const TraceRequest& t = s.trace[i];
    RequestRow row;
    row.id = i + 1;
    row.label = "request " + std::to_string(i + 1);
    row.prompt_tokens = t.input_length;
    row.output_tokens = t.output_length;
    row.cached_tokens = ideal.access(t);
    row.recomputed_tokens = row.prompt_tokens - row.cached_tokens;
    row.bytes_h2d = row.cached_tokens * m.kv_bytes_per_token();
    row.reload_s = reload_seconds(hw, 0, row.bytes_h2d);
    row.prefill_s = prefill_seconds(hw, static_cast<double>(row.cached_tokens),
                                    static_cast<double>(row.prompt_tokens));
    row.ttft_s = ttft_seconds(hw, row.reload_s, row.prefill_s);  // no queueing modeled
    out.rows.push_back(std::move(row));
  }
  out.policy = std::string(1, '-');
  out.eviction = std::string("lru-blocks");
  finish_totals(out);
  return out;
}

}  // namespace

namespace {

/// One modeled GPU: its transfer engine, cache, executor and scheduler.
struct Instance {
  std::unique_ptr<CountingTransferEngine> engine;
  std::unique_ptr<CacheBackend> cache;
  PrefixCache* prefix = nullptr;  ///< `cache` when it is a PrefixCache (node, sglang-like)
  std::unique_ptr<CostExecutor> executor;
  std::unique_ptr<sched::Scheduler> sched;
  // What the processes before a restart did (a restart ends them):
  std::unordered_map<sched::RequestId, sched::RequestResult> kept;
  CacheStats kept_stats;
  sched::SchedulerStats kept_sched;
  double kept_clock_s = 0;
  std::vector<sched::RequestId> submitted;
};

void add_stats(CacheStats& a, const CacheStats& b) {
  a.admissions += b.admissions;
  a.requested_tokens += b.requested_tokens;
  a.hit_tokens_gpu += b.hit_tokens_gpu;
  a.hit_tokens_host += b.hit_tokens_host;
  a.bytes_d2h += b.bytes_d2h;
  a.bytes_h2d += b.bytes_h2d;
  a.copies_d2h += b.copies_d2h;
  a.copies_h2d += b.copies_h2d;
  a.kv_pages_demoted += b.kv_pages_demoted;
  a.kv_pages_promoted += b.kv_pages_promoted;
  a.kv_pages_dropped_gpu += b.kv_pages_dropped_gpu;
  a.kv_pages_dropped_host += b.kv_pages_dropped_host;
  a.snapshots_demoted += b.snapshots_demoted;
  a.snapshots_promoted += b.snapshots_promoted;
  a.snapshots_dropped += b.snapshots_dropped;
  a.snapshots_inserted += b.snapshots_inserted;
  a.transfers_failed += b.transfers_failed;
  a.alloc_copy_waits += b.alloc_copy_waits;
  a.alloc_wait_bytes += b.alloc_wait_bytes;
  a.alloc_wait_copies += b.alloc_wait_copies;
  a.background_evictions += b.background_evictions;
  a.bytes_to_store += b.bytes_to_store;
  a.bytes_from_store += b.bytes_from_store;
  a.store_writes += b.store_writes;
  a.store_reads += b.store_reads;
  a.kv_pages_stored += b.kv_pages_stored;
  a.kv_pages_loaded += b.kv_pages_loaded;
  a.snapshots_stored += b.snapshots_stored;
  a.snapshots_loaded += b.snapshots_loaded;
  a.kv_pages_dropped_store += b.kv_pages_dropped_store;
  a.store_records_lost += b.store_records_lost;
  a.store_failures += b.store_failures;
  a.store_copy_waits += b.store_copy_waits;
  a.store_wait_bytes += b.store_wait_bytes;
  a.restored_kv_pages += b.restored_kv_pages;
  a.restored_snapshots += b.restored_snapshots;
  a.hit_tokens_store += b.hit_tokens_store;
  a.staged_loads += b.staged_loads;
  a.store_load_misses += b.store_load_misses;
  a.host_bytes_peak = std::max(a.host_bytes_peak, b.host_bytes_peak);  // per instance
}

void add_sched_stats(sched::SchedulerStats& a, const sched::SchedulerStats& b) {
  a.steps += b.steps;
  a.admissions += b.admissions;
  a.transfer_failures += b.transfer_failures;
  a.preemptions += b.preemptions;
  a.stalls += b.stalls;
  a.finished += b.finished;
  a.failed += b.failed;
  a.forwarded_tokens += b.forwarded_tokens;
  a.snapshots_offered += b.snapshots_offered;
  a.snapshots_kept += b.snapshots_kept;
  a.snapshot_slot_misses += b.snapshot_slot_misses;
  a.copy_wait_s += b.copy_wait_s;
  a.store_wait_s += b.store_wait_s;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<std::size_t>(1, rank)) - 1];
}

void finish_cluster(SimResult& out, const Scenario& s, const HardwarePreset& hw, double decode_s,
                    double executor_s) {
  std::vector<double> ttft;
  for (const RequestRow& row : out.rows) {
    if (row.ok) ttft.push_back(row.ttft_s);
  }
  out.ttft_s_p50 = percentile(ttft, 0.50);
  out.ttft_s_p90 = percentile(ttft, 0.90);
  out.ttft_s_p99 = percentile(ttft, 0.99);
  const double span = trace_span_seconds(s);
  if (span > 0) {
    const double cap = static_cast<double>(out.instances) * span;
    out.utilization = offered_busy_seconds(s, hw, decode_s) / cap;
    out.busy_utilization = executor_s / cap;
    // The replay's clock against the trace's: a cluster too small for the trace finishes
    // late, and its hit ratios and TTFTs describe a queue, not the trace.
    if (out.sim_clock_s > 0) {  // the ideal runs without a clock
      out.clock_span_ratio = (out.sim_clock_s - arrival_s(s, 0)) / span;
      out.overrun = out.clock_span_ratio > kMaxClockOverrun;
    }
  }
}

}  // namespace

Result<SimResult> simulate(const Scenario& s, const SimOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  auto model = resolve_model(o.model, o.dtypes);
  if (!model) return model.status();
  auto hw = find_hardware(o.hardware);
  if (!hw) return hw.status();
  const std::size_t n_inst = o.instances > 0
                                 ? o.instances
                                 : (s.is_trace() ? default_instances(s, *hw, o.decode_step_s) : 1);
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
  if (budget.gpu_kv_tokens == 0 && o.cache == CacheKind::kSglangLike) {
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
  out.config = cache_config(budget, *model, s.page_size);
  out.config.snapshot_eviction = o.eviction;
  out.config.write_policy = o.write_policy;
  out.config.load_back_min_tokens = o.load_back_min_tokens;
  out.config.max_snapshots_per_path = o.max_snapshots_per_path;
  out.config.gpu_free_low_watermark = o.gpu_free_low_watermark;
  out.config.gpu_free_high_watermark = o.gpu_free_high_watermark;
  out.total_budget_bytes = total_bytes(out.config);
  if (s.is_trace()) out.ceiling_ratio = infinite_cache_ceiling(s.trace).ratio();
  if (o.cache == CacheKind::kIdeal) {
    auto r = simulate_ideal(s, *model, *hw, std::move(out));
    if (r) {
      finish_cluster(*r, s, *hw, o.decode_step_s, 0);
      r->wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return r;
  }

  const std::uint64_t host_budget =  // what the scenario gives every cache's host tier
      std::uint64_t{out.config.host_pages} * out.config.page_bytes +
      std::uint64_t{out.config.host_snapshot_slots} * out.config.snapshot_bytes;
  CacheConfig base_config = out.config;
  if (o.cache == CacheKind::kSglangLike && !o.sglang.hicache) {
    base_config.host_pages = 0;
    base_config.host_snapshot_slots = 0;
  }
  const CacheConfig config = config_for(o.cache, base_config);
  if (o.cache == CacheKind::kAttentionOnly || o.cache == CacheKind::kSglangLike ||
      o.cache == CacheKind::kVllmLike) {
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
  const bool sglang = o.cache == CacheKind::kSglangLike;
  const char* default_policy =
      node_like ? kDefaultPolicy
      : sglang  ? (o.sglang.extra_buffer ? "sglang-extra-buffer" : "sglang-no-buffer")
      : vllm    ? "every-chunk"
                : "end-only";
  auto policy = sched::SnapshotPolicy::parse(!o.policy.empty() ? o.policy : default_policy);
  if (!policy) return policy.status();

  sched::SchedulerConfig sc;
  sc.chunk_tokens = s.chunk_tokens;
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
                                (config.host_pages > 0 ? "+hicache" : "")
                 : vllm && vllm_cpu_ids > 0 ? "lru+cpu-offload"
                                            : "lru";

  CostExecutorOptions eo;
  eo.decode_step_s = o.decode_step_s;
  eo.decode_batch = s.max_running;
  eo.gpu_slots = vllm ? 0 : config.gpu_snapshot_slots;  // vllm-like: states are blocks
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
  // One process of instance k: a transfer engine, a cache (on the store), a scheduler.
  auto start_process = [&](Instance& in, std::size_t k) -> Status {
    in.engine = std::make_unique<CountingTransferEngine>(config);
    in.prefix = nullptr;
    if (o.cache == CacheKind::kNode || o.cache == CacheKind::kSglangLike) {
      auto c = stores[k] ? PrefixCache::create(config, *in.engine, stores[k].get())
                         : PrefixCache::create(config, *in.engine);
      if (!c) return c.status();
      if (o.on_cache) o.on_cache(**c, k);
      in.prefix = c->get();
      in.cache = std::move(*c);
    } else if (o.cache == CacheKind::kAttentionOnly) {
      auto c = AttentionOnlyCache::create(config, *in.engine);
      if (!c) return c.status();
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
      add_stats(in.kept_stats, in.cache->stats());
      add_sched_stats(in.kept_sched, in.sched->stats());
      in.kept_clock_s += in.sched->now();
      in.sched.reset();  // it refers to the cache
      in.cache.reset();
      in.prefix = nullptr;
      in.engine.reset();
      if (Status st = start_process(in, k); !st) return st;
    }
    out.restart.persist_s =
        disk_write_seconds(*hw, out.restart.persist_writes, out.restart.persist_bytes);
    return Status::ok();
  };
  Router router(
      o.router, n_inst,
      out.total_budget_bytes / (std::uint64_t{kTraceBlockTokens} * model->kv_bytes_per_token()),
      s.page_size);

  // Submit lazily (a trace's prompts are synthesized when they are about to arrive) and route
  // each request when it arrives: first every instance steps until its next step would run at
  // or after the arrival, so the router sees the loads of that moment and each scheduler sees
  // exactly what it would with all of its requests queued.
  const std::size_t n = s.size();
  auto request = [&](std::size_t i) {
    return s.is_trace() ? trace_request(s, i) : s.requests[i].request;
  };
  std::vector<std::size_t> where(n, 0);
  std::uint64_t steps = 0;
  Status run_status;
  auto advance_until = [&](double t) {
    for (auto& in : inst) {
      sched::Scheduler& sched = *in->sched;
      while (!sched.idle() && sched.next_step_s() < t) {
        if (Status st = sched.step(); !st) return st;
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
  for (std::size_t i = 0; i < n && run_status; ++i) {
    if (restarts && i == *s.restart_before) {
      run_status = advance_until(std::numeric_limits<double>::infinity());
      if (run_status) run_status = restart_all();
      if (!run_status) break;
      out.restart.ran = true;
    }
    run_status = advance_until(arrival_s(s, i));
    if (!run_status) break;
    if (n_inst > 1) {
      for (std::size_t k = 0; k < n_inst; ++k) {
        load[k] = inst[k]->sched->running() + inst[k]->sched->queued();
      }
      where[i] = router.route(s.trace[i], load);
    }
    (void)inst[where[i]]->sched->submit(request(i));
    if (restarts) inst[where[i]]->submitted.push_back(s.requests[i].request.id);
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
    row.reusable_tokens = s.is_trace() ? 0 : s.requests[i].reusable_tokens;
    const sched::RequestResult* res = result_of(i, row.id);
    if (res == nullptr) {
      row.ok = false;
      row.error = "not finished";
    } else {
      row.ok = res->status.is_ok();
      if (!row.ok) row.error = res->status.to_string();
      row.output_tokens = res->output.size();
      row.cached_tokens = res->cached_tokens;
      row.gpu_cached_tokens = res->gpu_cached_tokens;
      row.host_cached_tokens = res->host_cached_tokens;
      row.recomputed_tokens = res->recomputed_tokens;
      row.bytes_h2d = res->admit_bytes_h2d;
      row.copies_h2d = res->admit_copies_h2d;
      row.reload_s = reload_seconds(*hw, row.copies_h2d, row.bytes_h2d);
      row.store_cached_tokens = res->store_cached_tokens;
      row.store_reads = res->admit_store_reads;
      row.bytes_from_store = res->admit_bytes_from_store;
      // Without a store there are no store reads: disk_s is 0 and TTFT is as it always was.
      row.disk_s = disk_read_seconds(*hw, row.store_reads, row.bytes_from_store);
      row.prefill_s = res->prefill_s;
      row.queue_s = res->queue_s();
      row.ttft_s =
          ttft_seconds(*hw, row.disk_s + row.reload_s,
                       s.include_queue ? res->first_token_s - res->arrival_s : res->prefill_s);
      row.snapshots_kept = res->snapshots_kept;
      row.preemptions = res->preemptions;
      out.snapshots_kept += res->snapshots_kept;
    }
    if (!s.is_trace()) {
      row.floor_s = floor_seconds(*hw, *model, row.reusable_tokens, row.prompt_tokens);
      row.disk_floor_s = disk_floor_seconds(*hw, *model, row.reusable_tokens, row.prompt_tokens);
    }
    out.rows.push_back(std::move(row));
  }
  {
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
  for (const auto& in : inst) {
    add_stats(out.stats, in->kept_stats);  // the processes before a restart (zero without)
    add_stats(out.stats, in->cache->stats());
    add_sched_stats(out.sched, in->kept_sched);
    add_sched_stats(out.sched, in->sched->stats());
    out.placement_alignment = std::max(out.placement_alignment, in->sched->learner().alignment());
    out.keep_finish = in->sched->learner().keep_finish();
    out.sim_clock_s = std::max(out.sim_clock_s, in->kept_clock_s + in->sched->now());
    executor_s += in->executor->prefill_seconds_total() + in->executor->decode_seconds_total();
  }
  for (const auto& st : stores) {
    if (!st) continue;
    out.store_records += st->record_count();
    out.store_syncs += st->counts().syncs;
  }
  out.bytes_h2d = out.stats.bytes_h2d;
  out.bytes_d2h = out.stats.bytes_d2h;
  out.host_bytes_peak = out.stats.host_bytes_peak;
  finish_totals(out);
  finish_cluster(out, s, *hw, o.decode_step_s, executor_s);
  if (out.restart.ran) {
    // The goal's comparison: the same scenario straight through, in the same process.
    SimOptions straight = o;
    straight.restart = false;
    straight.progress = nullptr;
    straight.on_cache = nullptr;
    straight.on_step = nullptr;
    auto twin = simulate(s, straight);
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

namespace {

/// The value printed with 6 significant digits, as the JSON always carried it.
double num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return std::strtod(buf, nullptr);
}

}  // namespace

std::string to_json(const SimResult& r, bool rows) {
  nlohmann::ordered_json o;
  o["scenario"] = r.scenario;
  o["cache"] = r.cache;
  o["model"] = r.model;
  o["hardware"] = r.hardware;
  o["policy"] = r.policy;
  o["eviction"] = r.eviction;
  o["requests"] = r.requests;
  o["failed"] = r.failed;
  o["input_tokens"] = r.input_tokens;
  o["cached_tokens"] = r.cached_tokens;
  o["hit_ratio"] = num(r.hit_ratio);
  o["recomputed_tokens"] = r.recomputed_tokens;
  o["ttft_s_total"] = num(r.ttft_s_total);
  o["ttft_s_last"] = num(r.ttft_s_last);
  o["floor_s_last"] = num(r.floor_s_last);
  o["cached_tokens_last"] = r.cached_tokens_last;
  o["recomputed_tokens_last"] = r.recomputed_tokens_last;
  o["bytes_h2d"] = r.bytes_h2d;
  o["bytes_d2h"] = r.bytes_d2h;
  o["host_bytes_peak"] = r.host_bytes_peak;
  o["snapshots_kept"] = r.snapshots_kept;
  o["total_budget_bytes"] = r.total_budget_bytes;
  o["ceiling_ratio"] = num(r.ceiling_ratio);
  o["sim_clock_s"] = num(r.sim_clock_s);
  o["clock_span_ratio"] = num(r.clock_span_ratio);
  o["overrun"] = r.overrun;
  o["wall_s"] = num(r.wall_s);
  nlohmann::ordered_json& c = o["config"];
  c["page_size"] = r.config.page_size;
  c["gpu_pages"] = r.config.gpu_pages;
  c["host_pages"] = r.config.host_pages;
  c["gpu_snapshot_slots"] = r.config.gpu_snapshot_slots;
  c["host_snapshot_slots"] = r.config.host_snapshot_slots;
  c["page_bytes"] = r.config.page_bytes;
  c["snapshot_bytes"] = r.config.snapshot_bytes;
  c["kv_bytes_per_token"] = r.config.page_size == 0 ? 0 : r.config.page_bytes / r.config.page_size;
  o["snapshots_dropped"] = r.stats.snapshots_dropped;
  o["preemptions"] = r.sched.preemptions;
  o["snapshot_slot_misses"] = r.sched.snapshot_slot_misses;
  o["alloc_copy_waits"] = r.stats.alloc_copy_waits;
  o["alloc_wait_bytes"] = r.stats.alloc_wait_bytes;
  o["copy_wait_s"] = num(r.sched.copy_wait_s);
  o["background_evictions"] = r.stats.background_evictions;
  o["disk_bytes"] = r.disk_bytes;
  o["bytes_to_store"] = r.stats.bytes_to_store;
  o["bytes_from_store"] = r.stats.bytes_from_store;
  o["store_writes"] = r.stats.store_writes;
  o["store_reads"] = r.stats.store_reads;
  o["kv_pages_stored"] = r.stats.kv_pages_stored;
  o["kv_pages_loaded"] = r.stats.kv_pages_loaded;
  o["snapshots_stored"] = r.stats.snapshots_stored;
  o["snapshots_loaded"] = r.stats.snapshots_loaded;
  o["kv_pages_dropped_store"] = r.stats.kv_pages_dropped_store;
  o["store_records_lost"] = r.stats.store_records_lost;
  o["store_failures"] = r.stats.store_failures;
  o["store_copy_waits"] = r.stats.store_copy_waits;
  o["store_wait_bytes"] = r.stats.store_wait_bytes;
  o["store_wait_s"] = num(r.sched.store_wait_s);
  o["restored_kv_pages"] = r.stats.restored_kv_pages;
  o["restored_snapshots"] = r.stats.restored_snapshots;
  o["hit_tokens_store"] = r.stats.hit_tokens_store;
  o["store_records"] = r.store_records;
  o["store_syncs"] = r.store_syncs;
  o["instances"] = r.instances;
  o["router"] = r.router;
  o["utilization"] = num(r.utilization);
  o["busy_utilization"] = num(r.busy_utilization);
  o["ttft_s_p50"] = num(r.ttft_s_p50);
  o["ttft_s_p90"] = num(r.ttft_s_p90);
  o["ttft_s_p99"] = num(r.ttft_s_p99);
  o["placement_alignment"] = r.placement_alignment;
  o["keep_finish"] = r.keep_finish;
  nlohmann::ordered_json& mb = o["misses"];
  mb["reachable_tokens"] = r.misses.reachable_tokens;
  mb["cached_tokens"] = r.misses.cached_tokens;
  mb["no_snapshot_placed"] = r.misses.no_snapshot_placed;
  mb["no_snapshot_tail"] = r.misses.no_snapshot_tail;
  mb["no_snapshot_branch"] = r.misses.no_snapshot_branch;
  mb["no_snapshot_divergence"] = r.misses.no_snapshot_divergence;
  mb["kv_missing"] = r.misses.kv_missing;
  mb["snapshot_missing"] = r.misses.snapshot_missing;
  if (r.restart.ran) {
    nlohmann::ordered_json& x = o["restart"];
    x["request"] = r.restart.request;
    x["cached_tokens"] = r.restart.cached_tokens;
    x["cached_tokens_no_restart"] = r.restart.cached_tokens_no_restart;
    x["reuse_ratio"] = num(r.restart.reuse_ratio);
    x["ttft_s"] = num(r.restart.ttft_s);
    x["ttft_s_no_restart"] = num(r.restart.ttft_s_no_restart);
    x["disk_floor_s"] = num(r.restart.disk_floor_s);
    x["ttft_ratio"] = num(r.restart.ttft_ratio);
    x["bytes_from_store"] = r.restart.bytes_from_store;
    x["store_reads"] = r.restart.store_reads;
    x["persist_bytes"] = r.restart.persist_bytes;
    x["persist_writes"] = r.restart.persist_writes;
    x["persist_s"] = num(r.restart.persist_s);
  }
  o["status"] = r.status;
  if (rows) {
    nlohmann::ordered_json& list = o["rows"] = nlohmann::ordered_json::array();
    for (const RequestRow& w : r.rows) {
      nlohmann::ordered_json& x = list.emplace_back();
      x["label"] = w.label;
      x["ok"] = w.ok;
      x["prompt_tokens"] = w.prompt_tokens;
      x["output_tokens"] = w.output_tokens;
      x["cached_tokens"] = w.cached_tokens;
      x["host_cached_tokens"] = w.host_cached_tokens;
      x["recomputed_tokens"] = w.recomputed_tokens;
      x["reusable_tokens"] = w.reusable_tokens;
      x["bytes_h2d"] = w.bytes_h2d;
      x["reload_s"] = num(w.reload_s);
      x["prefill_s"] = num(w.prefill_s);
      x["queue_s"] = num(w.queue_s);
      x["ttft_s"] = num(w.ttft_s);
      x["floor_s"] = num(w.floor_s);
      x["store_cached_tokens"] = w.store_cached_tokens;
      x["bytes_from_store"] = w.bytes_from_store;
      x["store_reads"] = w.store_reads;
      x["disk_s"] = num(w.disk_s);
      x["disk_floor_s"] = num(w.disk_floor_s);
      x["snapshots_kept"] = w.snapshots_kept;
      x["error"] = w.error;
    }
  }
  return o.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace radixtier::sim
