// GPU correctness checks of the CUDA transfer engine (plain CUDA program, no GoogleTest).
//
// Every check writes random bytes, poisons every destination, moves pages or snapshots, and
// verifies every byte of the destination pool: copied items hold the source's bytes, all
// other items still hold the poison. Copies run while kernels keep the compute stream (and a
// second stream) busy, and the ordering contract is exercised in both directions:
//   - the compute stream writes the source pages (after a long spin) right before submit();
//     a demotion that did not wait for it would copy stale bytes;
//   - the compute stream poisons the pool (after a spin) right before a promotion; a
//     promotion that did not wait would be overwritten by the poison;
//   - a kernel on the compute stream reads promoted pages after stream_wait(), before the
//     host sees the ticket done, and overwrites demoted pages after stream_wait().
// Beyond the round trips: padding gaps and bytes past each GPU tensor and host pool stay
// untouched, offsets over 4 GiB, more than 1,024 pages per kernel launch, a failure after
// some slices are queued, concurrent submit/poll in both directions, no CUDA last error
// after a pending poll (and a probe of what cudaEventQuery leaves there), snapshots across
// several registrations, the per-piece DMA fallback on a real device, capture refusal
// (the server's graph stays valid), a global-mode capture on a side stream while a cache
// thread uses the engine (issue 23), the legacy default stream as the compute stream, small
// (8 KiB) pieces through kAuto, layer 0 readable after stream_wait_layer(0), device restore
// (with 2+ GPUs), the stream rule, device-to-device slot pieces (a Qwen3-Next snapshot
// materialized into scattered GPU pages and resumed into another slot, ordered after the
// compute stream both ways).
// `--fatal` runs the sticky-error case alone (it kills the process's context): a fault in
// a compute-stream kernel must turn into kDeviceLost. `--contexts` runs alone too (it needs a
// process where no context exists yet): no context on a device the caller did not use.
// Prints "N passed, N failed"; SKIP / FAIL rules: gpucheck::check_device.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime.hpp"
#include "gpu_common.cuh"
#include "radixtier/cuda/cuda_transfer_engine.hpp"
#include "radixtier/cuda/pinned_host_pool.hpp"

using namespace radixtier;
using namespace radixtier::cuda;
using gpucheck::launch_fill;
using gpucheck::launch_spin;
using gpucheck::pattern_byte;

namespace {

constexpr unsigned char kPoison = 0xDB;
constexpr std::uint64_t kSeed1 = 0x5EED0001, kSeed2 = 0x5EED0002;

struct VerifySeg {
  std::uint64_t off, stride, bytes;
};

// Counts bytes of the GPU pool that differ from: pattern(seed) of page src_of[g] where
// src_of[g] >= 0, the poison elsewhere.
__global__ void verify_pool(const VerifySeg* segs, int nsegs, const unsigned char* base,
                            std::uint32_t pages, const int* src_of, std::uint64_t seed,
                            unsigned long long* mismatches) {
  const std::uint64_t units = std::uint64_t{pages} * nsegs;
  unsigned long long bad = 0;
  for (std::uint64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const std::uint32_t g = static_cast<std::uint32_t>(u / nsegs);
    const VerifySeg s = segs[u % nsegs];
    const unsigned char* p = base + s.off + g * s.stride;
    const int src = src_of[g];
    for (std::uint64_t b = threadIdx.x; b < s.bytes; b += blockDim.x) {
      const unsigned char want =
          src >= 0 ? pattern_byte(seed, s.off + static_cast<std::uint64_t>(src) * s.stride + b)
                   : kPoison;
      bad += p[b] != want;
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}

// Counts bytes in the ranges [off, off + len) of `base` that are not the poison.
struct Range {
  std::uint64_t off, len;
};
__global__ void verify_poison(const Range* ranges, int n, const unsigned char* base,
                              unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const Range g = ranges[r];
    for (std::uint64_t b = threadIdx.x; b < g.len; b += blockDim.x)
      bad += base[g.off + b] != kPoison;
  }
  if (bad) atomicAdd(mismatches, bad);
}

// The bytes of [0, total) outside every item's segments: padding between tensors and the
// guard past the last one.
std::vector<Range> gaps_of(const DeviceLayout& layout, std::uintptr_t base, std::uint64_t total) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> iv;
  for (const StridedSegment& s : layout.segments)
    for (std::uint32_t i = 0; i < layout.items; ++i)
      iv.emplace_back(s.base - base + std::uint64_t{i} * s.item_stride, s.bytes);
  std::sort(iv.begin(), iv.end());
  std::vector<Range> gaps;
  std::uint64_t at = 0;
  for (auto [off, len] : iv) {
    if (off > at) gaps.push_back({at, off - at});
    at = std::max(at, off + len);
  }
  if (total > at) gaps.push_back({at, total - at});
  return gaps;
}

// Mismatching bytes in `gaps` of the device buffer (synchronous).
unsigned long long count_gap_damage(const std::vector<Range>& gaps, const void* buf) {
  if (gaps.empty()) return 0;
  Range* d = nullptr;
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMalloc(&d, gaps.size() * sizeof(Range)));
  CUDA_OK(cudaMalloc(&bad, sizeof(unsigned long long)));
  CUDA_OK(cudaMemcpy(d, gaps.data(), gaps.size() * sizeof(Range), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(bad, 0, sizeof(unsigned long long)));
  verify_poison<<<1024, 256>>>(d, static_cast<int>(gaps.size()),
                               static_cast<const unsigned char*>(buf), bad);
  unsigned long long n = 0;
  CUDA_OK(cudaMemcpy(&n, bad, sizeof(n), cudaMemcpyDeviceToHost));
  cudaFree(d);
  cudaFree(bad);
  return n;
}

// Bytes of the GPU pool at `base` that differ from what `src_of` says (verify_pool), counted
// by a kernel on `stream`, so after everything that stream waits for; synchronizes `stream`.
unsigned long long count_pool_damage(const std::vector<VerifySeg>& segs, void* base,
                                     std::uint32_t pages, const std::vector<int>& src_of,
                                     std::uint64_t seed, cudaStream_t stream) {
  if (segs.empty()) return 0;
  VerifySeg* dsegs = nullptr;
  int* dsrc = nullptr;
  unsigned long long* dbad = nullptr;
  CUDA_OK(cudaMalloc(&dsegs, segs.size() * sizeof(VerifySeg)));
  CUDA_OK(cudaMalloc(&dsrc, src_of.size() * sizeof(int)));
  CUDA_OK(cudaMalloc(&dbad, sizeof(unsigned long long)));
  CUDA_OK(cudaMemcpyAsync(dsegs, segs.data(), segs.size() * sizeof(VerifySeg),
                          cudaMemcpyHostToDevice, stream));
  CUDA_OK(cudaMemcpyAsync(dsrc, src_of.data(), src_of.size() * sizeof(int), cudaMemcpyHostToDevice,
                          stream));
  CUDA_OK(cudaMemsetAsync(dbad, 0, sizeof(unsigned long long), stream));
  verify_pool<<<1024, 256, 0, stream>>>(dsegs, static_cast<int>(segs.size()),
                                        static_cast<const unsigned char*>(base), pages, dsrc, seed,
                                        dbad);
  unsigned long long bad = 0;
  CUDA_OK(cudaMemcpyAsync(&bad, dbad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaFree(dsegs);
  cudaFree(dsrc);
  cudaFree(dbad);
  return bad;
}

constexpr std::size_t kGuard = 64 << 10;  // poisoned bytes past every pool, checked

enum class Kind { kLayerFirst, kPageFirst, kPerLayerPadded, kMixedAlignment };
const char* name(Kind k) {
  return k == Kind::kLayerFirst       ? "layer-first"
         : k == Kind::kPageFirst      ? "page-first"
         : k == Kind::kPerLayerPadded ? "per-layer"
                                      : "mixed-alignment";
}

DeviceLayout make_layout(Kind kind, std::uintptr_t base, const KvGeometry& g, std::uint32_t pages,
                         std::size_t* buffer_bytes) {
  const std::size_t tensor = g.chunk_bytes() * pages;
  switch (kind) {
    case Kind::kLayerFirst:
      *buffer_bytes = g.page_bytes() * pages;
      return kv_layer_first(base, g, pages);
    case Kind::kPageFirst:
      *buffer_bytes = g.page_bytes() * pages;
      return contiguous_items(base, g.page_bytes(), pages);
    case Kind::kPerLayerPadded: {
      // Separate tensors per layer, emulated inside one buffer with 4 KiB + 16 B gaps.
      const std::size_t pitch = tensor + 4096 + 16;
      std::vector<std::uintptr_t> k, v;
      for (std::uint32_t l = 0; l < g.layers; ++l) k.push_back(base + l * pitch);
      for (std::uint32_t l = 0; l < g.layers; ++l) v.push_back(base + (g.layers + l) * pitch);
      *buffer_bytes = pitch * 2 * g.layers;
      return kv_per_layer(k, v, g, pages);
    }
    case Kind::kMixedAlignment: {
      // Layer-first, plus one odd 24-byte segment at the end of each page's block: every
      // 16-byte-aligned segment still takes the vector path (chosen per range).
      DeviceLayout l = kv_layer_first(base, g, pages);
      const std::uintptr_t odd = base + g.page_bytes() * pages + 8;
      l.segments.insert(l.segments.begin() + 3, StridedSegment{odd, 40, 24});
      l.segment_layers.insert(l.segment_layers.begin() + 3, 1);  // with layer 1's segments
      *buffer_bytes = g.page_bytes() * pages + 8 + 40 * pages;
      return l;
    }
  }
  return {};
}

// Checks every byte of the host pool: host page h holds pattern(seed) of GPU page src[h], or
// the poison where src[h] < 0. Returns the mismatch count.
std::uint64_t verify_host(const DeviceLayout& layout, std::uintptr_t gpu_base,
                          const std::byte* host, const std::vector<int>& src, std::uint64_t seed) {
  std::uint64_t bad = 0;
  const std::size_t page = layout.item_bytes();
  for (std::size_t h = 0; h < src.size(); ++h) {
    const auto* p = reinterpret_cast<const unsigned char*>(host) + h * page;
    if (src[h] < 0) {
      for (std::size_t b = 0; b < page; ++b) bad += p[b] != kPoison;
      continue;
    }
    for (const StridedSegment& s : layout.segments) {
      const std::uint64_t off =
          s.base - gpu_base + static_cast<std::uint64_t>(src[h]) * s.item_stride;
      for (std::size_t b = 0; b < s.bytes; ++b) bad += p[b] != pattern_byte(seed, off + b);
      p += s.bytes;
    }
  }
  return bad;
}

// Bytes past the host pages (the guard) that are not the poison.
std::uint64_t host_guard_damage(const std::byte* host, std::size_t from, std::size_t to) {
  std::uint64_t bad = 0;
  for (std::size_t b = from; b < to; ++b) bad += static_cast<unsigned char>(host[b]) != kPoison;
  return bad;
}

struct RoundTrip {
  const char* label;
  KvGeometry geometry;
  Kind kind;
  CopyMethod d2h, h2d;
  std::size_t slice_pages;
  std::uint32_t gpu_pages, host_pages, copies;  // copies per demotion batch (two batches)
  std::uint32_t register_chunk_pages;           // 0: default 64 GiB
};

void run_round_trip(const RoundTrip& t, std::mt19937& rng) {
  std::printf("[round trip] %s: %s, d2h %s, h2d %s, slice %zu, page %zu B\n", t.label, name(t.kind),
              to_string(t.d2h), to_string(t.h2d), t.slice_pages, t.geometry.page_bytes());
  const int failed_before = gpucheck::g_failed;
  void* gpu = nullptr;
  std::size_t gpu_bytes = 0;
  (void)make_layout(t.kind, 0x1000, t.geometry, t.gpu_pages, &gpu_bytes);
  CUDA_OK(cudaMalloc(&gpu, gpu_bytes + kGuard));
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  const DeviceLayout layout = make_layout(t.kind, base, t.geometry, t.gpu_pages, &gpu_bytes);
  const std::vector<Range> gaps = gaps_of(layout, base, gpu_bytes + kGuard);
  const std::size_t page = layout.item_bytes();
  const std::size_t host_bytes = std::size_t{t.host_pages} * page;
  PinnedHostPool::Options popt;
  if (t.register_chunk_pages) popt.max_register_chunk = t.register_chunk_pages * page;
  auto pool = PinnedHostPool::create(host_bytes + kGuard, page, popt);
  GPU_CHECK_MSG(pool.is_ok(), "%s", pool.status().to_string().c_str());
  if (!pool.is_ok()) return;
  if (t.register_chunk_pages) GPU_CHECK(pool->registrations() > 1);
  cudaStream_t compute, side;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));

  CudaPools pools;
  pools.gpu_kv = layout;
  pools.host_pages = t.host_pages;
  pools.host_kv_pool = &*pool;  // memory and registration chunk from the pool
  CudaEngineOptions opt;
  opt.slice_pages = t.slice_pages;
  opt.d2h = t.d2h;
  opt.h2d = t.h2d;
  opt.compute_stream = compute;
  auto created = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(created.is_ok(), "%s", created.status().to_string().c_str());
  if (!created.is_ok()) return;
  CudaTransferEngine& engine = **created;

  std::memset(pool->data(), kPoison, pool->bytes());
  CUDA_OK(cudaMemset(gpu, kPoison, gpu_bytes + kGuard));  // padding gaps stay poisoned
  // Compute stream: a long spin, then the forward pass "writes" the pages.
  launch_spin(20, compute);
  launch_fill(gpu, gpu_bytes, kSeed1, compute);

  // Demotion batches: a consecutive run (merging) then scattered pages; distinct on both sides.
  std::vector<std::uint32_t> gpu_ids(t.gpu_pages), host_ids(t.host_pages);
  std::iota(gpu_ids.begin(), gpu_ids.end(), 0u);
  std::iota(host_ids.begin(), host_ids.end(), 0u);
  const std::uint32_t run = t.copies / 2;
  std::shuffle(gpu_ids.begin() + run, gpu_ids.end(), rng);
  std::shuffle(host_ids.begin() + run, host_ids.end(), rng);
  std::vector<int> host_src(t.host_pages, -1);
  auto batch_of = [&](std::uint32_t first, std::uint32_t n) {
    TransferBatch b;
    b.direction = Direction::kDeviceToHost;
    for (std::uint32_t i = first; i < first + n; ++i) {
      b.pages.push_back({GpuPageId(gpu_ids[i]), HostPageId(host_ids[i])});
      host_src[host_ids[i]] = static_cast<int>(gpu_ids[i]);
    }
    return b;
  };
  const bool merges = t.kind == Kind::kPageFirst;  // runs merge only where pages are contiguous

  auto t1 = engine.submit(batch_of(0, t.copies));
  GPU_CHECK(t1.is_ok());
  launch_spin(20, compute);  // the compute stream stays busy while the demotion runs
  GPU_CHECK(t1->wait() == TransferState::kDone);
  std::uint64_t bad = verify_host(layout, base, pool->data(), host_src, kSeed1);
  GPU_CHECK_MSG(bad == 0, "demotion: %llu bytes wrong", static_cast<unsigned long long>(bad));
  bad = host_guard_damage(pool->data(), host_bytes, pool->bytes());
  GPU_CHECK_MSG(bad == 0, "demotion wrote %llu bytes past the host pages",
                static_cast<unsigned long long>(bad));
  const auto s1 = engine.stats();
  GPU_CHECK(s1.slices == slice_count(t.copies, t.slice_pages));
  if (merges && t.d2h == CopyMethod::kDmaBatch)
    GPU_CHECK_MSG(s1.pieces < t.copies, "the consecutive run did not merge: %llu pieces",
                  static_cast<unsigned long long>(s1.pieces));

  // Reuse after demotion: the compute stream overwrites every page right after stream_wait().
  auto t2 = engine.submit(batch_of(t.copies, t.copies));
  GPU_CHECK(t2.is_ok());
  GPU_CHECK(engine.stream_wait(t2->id(), compute).is_ok());
  launch_fill(gpu, gpu_bytes, kSeed2, compute);
  GPU_CHECK(t2->wait() == TransferState::kDone);
  bad = verify_host(layout, base, pool->data(), host_src, kSeed1);
  GPU_CHECK_MSG(bad == 0, "demotion then reuse: %llu bytes wrong",
                static_cast<unsigned long long>(bad));

  // Promotion into other pages, after the compute stream poisons the pool (late, after a spin).
  launch_spin(20, compute);
  CUDA_OK(cudaMemsetAsync(gpu, kPoison, gpu_bytes + kGuard, compute));
  // The first `run` host pages (0..run-1, consecutive) go to consecutive GPU pages at the
  // top of the pool, so promotion merges too; the rest are scattered.
  std::vector<std::uint32_t> dest;
  const std::uint32_t top = t.gpu_pages - run;
  for (std::uint32_t i = 0; i < run; ++i) dest.push_back(top + i);
  std::vector<std::uint32_t> rest(top);
  std::iota(rest.begin(), rest.end(), 0u);
  std::shuffle(rest.begin(), rest.end(), rng);
  dest.insert(dest.end(), rest.begin(), rest.end());
  std::vector<int> gpu_src(t.gpu_pages, -1);
  TransferBatch up;
  up.direction = Direction::kHostToDevice;
  for (std::uint32_t i = 0; i < 2 * t.copies; ++i) {
    up.pages.push_back({GpuPageId(dest[i]), HostPageId(host_ids[i])});
    gpu_src[dest[i]] = host_src[host_ids[i]];
  }
  const std::uint64_t pieces_before = engine.stats().pieces;
  auto t3 = engine.submit(std::move(up));
  GPU_CHECK(t3.is_ok());
  if (merges && t.h2d == CopyMethod::kDmaBatch)
    GPU_CHECK_MSG(engine.stats().pieces - pieces_before < 2 * t.copies,
                  "the promotion's consecutive run did not merge");
  launch_spin(20, side);  // SMs busy on another stream during the promotion
  // Layer 0 first: its segments are complete once the model's stream waited for layer 0 only
  // (the later layers may still be copying); then everything after stream_wait.
  std::vector<VerifySeg> vsegs, vsegs0;
  for (std::size_t i = 0; i < layout.segments.size(); ++i) {
    const StridedSegment& s = layout.segments[i];
    vsegs.push_back({s.base - base, s.item_stride, s.bytes});
    if (!layout.segment_layers.empty() && layout.segment_layers[i] == 0)
      vsegs0.push_back(vsegs.back());
  }
  unsigned long long gpu_bad[2] = {0, 0};
  if (!vsegs0.empty()) {
    GPU_CHECK(engine.stream_wait_layer(t3->id(), 0, compute).is_ok());
    gpu_bad[1] = count_pool_damage(vsegs0, gpu, t.gpu_pages, gpu_src, kSeed1, compute);
  }
  GPU_CHECK(engine.stream_wait(t3->id(), compute).is_ok());
  gpu_bad[0] = count_pool_damage(vsegs, gpu, t.gpu_pages, gpu_src, kSeed1, compute);
  GPU_CHECK(t3->wait() == TransferState::kDone);
  GPU_CHECK_MSG(gpu_bad[0] == 0, "promotion: %llu bytes wrong (read on the compute stream)",
                gpu_bad[0]);
  GPU_CHECK_MSG(gpu_bad[1] == 0, "promotion: %llu bytes of layer 0 wrong after stream_wait_layer",
                gpu_bad[1]);
  const CudaEngineStats st = engine.stats();
  if (layout.layers() > 1) GPU_CHECK(st.layer_events > 0);
  const bool small = layout.item_bytes() / layout.segments.size() < opt.kernel_below_piece_bytes;
  if (t.h2d == CopyMethod::kAuto && small && t.kind != Kind::kPageFirst)
    GPU_CHECK_MSG(st.auto_kernel_slices > 0, "kAuto sent %zu-byte pieces by DMA",
                  layout.item_bytes() / layout.segments.size());
  if (st.kernel_fallback) std::printf("  kernel fallback: %s\n", st.kernel_fallback_reason.c_str());
  GPU_CHECK(!st.kernel_fallback);
  const unsigned long long gap_bad = count_gap_damage(gaps, gpu);
  GPU_CHECK_MSG(gap_bad == 0, "promotion wrote %llu bytes into padding or past the tensors",
                gap_bad);
  GPU_CHECK(engine.stats().failed == 0);
  GPU_CHECK(cudaPeekAtLastError() == cudaSuccess);

  CUDA_OK(cudaDeviceSynchronize());
  t1->reset();
  t2->reset();
  t3->reset();
  created->reset();
  cudaStreamDestroy(compute);
  cudaStreamDestroy(side);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// Snapshots: Qwen3-Next geometry (77 MB, 72 per-layer segments), cut into chunks; with
// `register_chunk` > 0 the host pool is registered in chunks of that size, which do not
// divide a snapshot, so snapshots straddle registrations.
void run_snapshots(std::size_t register_chunk) {
  std::printf("[snapshots] qwen3-next, 4 GPU slots, 4 host slots, 8-page slices, %s\n",
              register_chunk ? "several registrations" : "one registration");
  const int failed_before = gpucheck::g_failed;
  const GdnGeometry g = GdnGeometry::qwen3_next();
  const KvGeometry kv = KvGeometry::qwen3_next();
  constexpr std::uint32_t kSlots = 4, kPages = 16;
  void *conv = nullptr, *state = nullptr, *kvbuf = nullptr;
  CUDA_OK(cudaMalloc(&conv, g.conv_bytes() * g.layers * kSlots));
  CUDA_OK(cudaMalloc(&state, g.state_bytes() * g.layers * kSlots));
  CUDA_OK(cudaMalloc(&kvbuf, kv.page_bytes() * kPages));
  const auto cb = reinterpret_cast<std::uintptr_t>(conv),
             sb = reinterpret_cast<std::uintptr_t>(state);
  const DeviceLayout snap = snapshot_layer_first(cb, sb, g, kSlots);
  GPU_CHECK(snap.item_bytes() == 77266944u);
  PinnedHostPool::Options popt;
  if (register_chunk) popt.max_register_chunk = register_chunk;
  auto host = PinnedHostPool::create(snap.item_bytes() * kSlots, snap.item_bytes(), popt);
  auto host_kv = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes());
  GPU_CHECK(host.is_ok() && host_kv.is_ok());
  if (!host.is_ok() || !host_kv.is_ok()) return;
  if (register_chunk) GPU_CHECK(host->registrations() > kSlots);
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(kvbuf), kv, kPages);
  pools.gpu_snapshots = snap;
  pools.host_kv_pool = &*host_kv;
  pools.host_pages = kPages;
  pools.host_snapshot_pool = &*host;
  pools.host_slots = kSlots;
  CudaEngineOptions opt;
  opt.slice_pages = 8;  // 12 MiB chunks: a snapshot takes 7 slices
  opt.compute_stream = compute;
  auto engine = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(engine.is_ok(), "%s", engine.status().to_string().c_str());
  if (!engine.is_ok()) return;

  std::memset(host->data(), kPoison, host->bytes());
  launch_spin(10, compute);
  launch_fill(conv, g.conv_bytes() * g.layers * kSlots, kSeed1, compute);
  launch_fill(state, g.state_bytes() * g.layers * kSlots, kSeed2, compute);
  TransferBatch down;
  down.direction = Direction::kDeviceToHost;
  down.snapshots = {{GpuSlotId(0), HostSlotId(2)}, {GpuSlotId(3), HostSlotId(0)}};
  auto t1 = (*engine)->submit(down);
  GPU_CHECK(t1.is_ok() && t1->wait() == TransferState::kDone);
  // Chunks pack the two snapshots back to back: ceil(2 * 77 MB / 12 MiB) slices.
  const std::size_t chunk = 8 * kv.page_bytes();
  GPU_CHECK((*engine)->stats().slices == (2 * snap.item_bytes() + chunk - 1) / chunk);
  // Expected bytes of a snapshot of GPU slot s, in host order.
  auto expect = [&](std::uint32_t s, std::vector<unsigned char>& out) {
    out.clear();
    for (std::size_t l = 0; l < g.layers; ++l) {
      const std::uint64_t co = (l * kSlots + s) * g.conv_bytes(),
                          so = (l * kSlots + s) * g.state_bytes();
      for (std::size_t b = 0; b < g.conv_bytes(); ++b) out.push_back(pattern_byte(kSeed1, co + b));
      for (std::size_t b = 0; b < g.state_bytes(); ++b) out.push_back(pattern_byte(kSeed2, so + b));
    }
  };
  const int host_src[kSlots] = {3, -1, 0, -1};
  std::vector<unsigned char> want;
  std::uint64_t bad = 0;
  for (std::uint32_t h = 0; h < kSlots; ++h) {
    const auto* p = reinterpret_cast<const unsigned char*>(host->data()) + h * snap.item_bytes();
    if (host_src[h] < 0) {
      for (std::size_t b = 0; b < snap.item_bytes(); ++b) bad += p[b] != kPoison;
    } else {
      expect(static_cast<std::uint32_t>(host_src[h]), want);
      for (std::size_t b = 0; b < want.size(); ++b) bad += p[b] != want[b];
    }
  }
  GPU_CHECK_MSG(bad == 0, "snapshot demotion: %llu bytes wrong",
                static_cast<unsigned long long>(bad));

  // Promote host 2 -> GPU 1 and host 0 -> GPU 2 after the compute stream poisons the slots.
  launch_spin(10, compute);
  CUDA_OK(cudaMemsetAsync(conv, kPoison, g.conv_bytes() * g.layers * kSlots, compute));
  CUDA_OK(cudaMemsetAsync(state, kPoison, g.state_bytes() * g.layers * kSlots, compute));
  TransferBatch up;
  up.direction = Direction::kHostToDevice;
  up.snapshots = {{GpuSlotId(1), HostSlotId(2)}, {GpuSlotId(2), HostSlotId(0)}};
  auto t2 = (*engine)->submit(up);
  GPU_CHECK(t2.is_ok() && t2->wait() == TransferState::kDone);
  std::vector<unsigned char> hconv(g.conv_bytes() * g.layers * kSlots),
      hstate(g.state_bytes() * g.layers * kSlots);
  CUDA_OK(cudaMemcpy(hconv.data(), conv, hconv.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hstate.data(), state, hstate.size(), cudaMemcpyDeviceToHost));
  const int gpu_src[kSlots] = {-1, 0, 3, -1};  // original GPU slot of each slot's bytes
  bad = 0;
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    for (std::size_t l = 0; l < g.layers; ++l) {
      const std::uint64_t co = (l * kSlots + s) * g.conv_bytes(),
                          so = (l * kSlots + s) * g.state_bytes();
      const std::uint64_t sco = (l * kSlots + gpu_src[s]) * g.conv_bytes();
      const std::uint64_t sso = (l * kSlots + gpu_src[s]) * g.state_bytes();
      for (std::size_t b = 0; b < g.conv_bytes(); ++b)
        bad += hconv[co + b] != (gpu_src[s] < 0 ? kPoison : pattern_byte(kSeed1, sco + b));
      for (std::size_t b = 0; b < g.state_bytes(); ++b)
        bad += hstate[so + b] != (gpu_src[s] < 0 ? kPoison : pattern_byte(kSeed2, sso + b));
    }
  }
  GPU_CHECK_MSG(bad == 0, "snapshot promotion: %llu bytes wrong",
                static_cast<unsigned long long>(bad));
  GPU_CHECK((*engine)->stats().failed == 0);
  t1->reset();
  t2->reset();
  engine->reset();
  cudaStreamDestroy(compute);
  cudaFree(conv);
  cudaFree(state);
  cudaFree(kvbuf);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// Device to device: a Qwen3-Next snapshot slot (72 segments) materialized into 50 scattered
// pages of a layer-first KV pool (24 segments a page; the last page partly filled), then
// resumed from them into another slot. The compute stream writes the slot (after a spin)
// right before the materialization and poisons every slot right before the resume: a copy
// that did not wait for it would read stale bytes or be overwritten.
void run_device_to_device(CopyMethod method) {
  std::printf("[device to device] qwen3-next snapshot <-> 50 scattered KV pages, %s\n",
              method == CopyMethod::kDmaBatch ? "dma" : "slot copy kernel");
  const int failed_before = gpucheck::g_failed;
  const GdnGeometry g = GdnGeometry::qwen3_next();
  const KvGeometry kv = KvGeometry::qwen3_next();
  constexpr std::uint32_t kSlots = 3, kPages = 64;
  void *conv = nullptr, *state = nullptr, *kvbuf = nullptr;
  const std::size_t conv_all = g.conv_bytes() * g.layers * kSlots,
                    state_all = g.state_bytes() * g.layers * kSlots,
                    kv_all = kv.page_bytes() * kPages;
  CUDA_OK(cudaMalloc(&conv, conv_all));
  CUDA_OK(cudaMalloc(&state, state_all));
  CUDA_OK(cudaMalloc(&kvbuf, kv_all));
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(kvbuf), kv, kPages);
  pools.gpu_snapshots = snapshot_layer_first(reinterpret_cast<std::uintptr_t>(conv),
                                             reinterpret_cast<std::uintptr_t>(state), g, kSlots);
  CudaEngineOptions opt;
  opt.slice_pages = 8;
  opt.compute_stream = compute;
  opt.d2d = method;
  auto engine = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(engine.is_ok(), "%s", engine.status().to_string().c_str());
  if (!engine.is_ok()) return;
  const std::size_t snap = g.snapshot_bytes(), page = kv.page_bytes(), chunk = kv.chunk_bytes();
  const std::uint32_t pieces = static_cast<std::uint32_t>((snap + page - 1) / page);
  GPU_CHECK(pieces == 50);
  std::vector<std::uint32_t> pages;  // 37 is prime to 64: distinct, scattered
  for (std::uint32_t k = 0; k < pieces; ++k) pages.push_back((k * 37 + 5) % kPages);

  CUDA_OK(cudaMemsetAsync(kvbuf, kPoison, kv_all, compute));
  launch_spin(10, compute);
  launch_fill(conv, conv_all, kSeed1, compute);
  launch_fill(state, state_all, kSeed2, compute);
  TransferBatch down;
  down.direction = Direction::kDeviceToDevice;
  for (std::uint32_t k = 0; k < pieces; ++k)
    down.slot_pieces.push_back({GpuSlotId(1), std::size_t{k} * page, GpuPageId(pages[k]), false});
  auto t1 = (*engine)->submit(down);
  GPU_CHECK(t1.is_ok() && t1->wait() == TransferState::kDone);

  // Poison every slot, then resume slot 2 from the pages (pieces in reverse order).
  launch_spin(10, compute);
  CUDA_OK(cudaMemsetAsync(conv, kPoison, conv_all, compute));
  CUDA_OK(cudaMemsetAsync(state, kPoison, state_all, compute));
  TransferBatch up;
  up.direction = Direction::kDeviceToDevice;
  for (std::uint32_t k = pieces; k-- > 0;)
    up.slot_pieces.push_back({GpuSlotId(2), std::size_t{k} * page, GpuPageId(pages[k]), true});
  auto t2 = (*engine)->submit(up);
  GPU_CHECK(t2.is_ok() && t2->wait() == TransferState::kDone);
  CUDA_OK(cudaStreamSynchronize(compute));

  // Slot 1's bytes in logical order (its segments one after the other), as the fill wrote them.
  std::vector<unsigned char> want;
  for (std::size_t l = 0; l < g.layers; ++l) {
    const std::uint64_t co = (l * kSlots + 1) * g.conv_bytes(),
                        so = (l * kSlots + 1) * g.state_bytes();
    for (std::size_t b = 0; b < g.conv_bytes(); ++b) want.push_back(pattern_byte(kSeed1, co + b));
    for (std::size_t b = 0; b < g.state_bytes(); ++b) want.push_back(pattern_byte(kSeed2, so + b));
  }
  std::vector<unsigned char> hkv(kv_all), hconv(conv_all), hstate(state_all);
  CUDA_OK(cudaMemcpy(hkv.data(), kvbuf, kv_all, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hconv.data(), conv, conv_all, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hstate.data(), state, state_all, cudaMemcpyDeviceToHost));
  // Pages: byte j of page p is chunk j / chunk of the page (layer-first: chunk c of page p at
  // (c * kPages + p) * chunk); a piece's n bytes, then the poison.
  std::vector<int> piece_of(kPages, -1);
  for (std::uint32_t k = 0; k < pieces; ++k) piece_of[pages[k]] = static_cast<int>(k);
  std::uint64_t bad = 0;
  for (std::uint32_t p = 0; p < kPages; ++p) {
    const std::size_t off = piece_of[p] < 0 ? 0 : std::size_t(piece_of[p]) * page;
    const std::size_t n = piece_of[p] < 0 ? 0 : std::min(page, snap - off);
    for (std::size_t j = 0; j < page; ++j) {
      const unsigned char got = hkv[((j / chunk) * kPages + p) * chunk + j % chunk];
      bad += got != (j < n ? want[off + j] : kPoison);
    }
  }
  GPU_CHECK_MSG(bad == 0, "materialized pages: %llu bytes wrong",
                static_cast<unsigned long long>(bad));
  bad = 0;
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    std::size_t at = 0;  // logical byte of the slot
    for (std::size_t l = 0; l < g.layers; ++l) {
      const std::uint64_t co = (l * kSlots + s) * g.conv_bytes(),
                          so = (l * kSlots + s) * g.state_bytes();
      for (std::size_t b = 0; b < g.conv_bytes(); ++b, ++at)
        bad += hconv[co + b] != (s == 2 ? want[at] : kPoison);
      for (std::size_t b = 0; b < g.state_bytes(); ++b, ++at)
        bad += hstate[so + b] != (s == 2 ? want[at] : kPoison);
    }
  }
  GPU_CHECK_MSG(bad == 0, "resumed slots: %llu bytes wrong", static_cast<unsigned long long>(bad));
  const CudaEngineStats st = (*engine)->stats();
  GPU_CHECK(st.bytes_d2d == 2 * snap);
  GPU_CHECK(st.failed == 0);
  GPU_CHECK_MSG(!st.kernel_fallback, "%s", st.kernel_fallback_reason.c_str());
  if (method == CopyMethod::kDmaBatch) {
    GPU_CHECK(st.d2d_launches == 0 && st.d2d_dma_runs > 1000);
  } else {  // 50 pieces in slices of 8: 7 launches per snapshot
    GPU_CHECK_MSG(st.d2d_launches == 14 && st.d2d_dma_runs == 0, "%llu launches, %llu runs",
                  static_cast<unsigned long long>(st.d2d_launches),
                  static_cast<unsigned long long>(st.d2d_dma_runs));
  }
  GPU_CHECK((*engine)->stream(Direction::kDeviceToDevice) != nullptr);
  t1->reset();
  t2->reset();
  engine->reset();
  cudaStreamDestroy(compute);
  cudaFree(conv);
  cudaFree(state);
  cudaFree(kvbuf);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// Errors: invalid ids, a real CUDA error turned into a failed ticket (on the first slice and
// after two slices were queued), pageable host memory, the explicit-stream rule, an
// impossible pinned pool, a dropped pending ticket, no last error after a pending poll.
void run_errors(CopyMethod method) {
  std::printf("[errors] %s\n", to_string(method));
  const int failed_before = gpucheck::g_failed;
  const KvGeometry kv = KvGeometry::qwen3_next();
  constexpr std::uint32_t kPages = 32;
  void* gpu = nullptr;
  CUDA_OK(cudaMalloc(&gpu, kv.page_bytes() * kPages));
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  auto host = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes());
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(base, kv, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.slice_pages = 4;
  opt.d2h = opt.h2d = method;
  opt.compute_stream = compute;
  opt.slices_in_flight = 0;  // every slice enqueued by submit(): the polls below query events
  // The stream rule: the per-thread default stream is refused (the legacy one is fine).
  {
    CudaEngineOptions o = opt;
    o.compute_stream = cudaStreamPerThread;
    auto refused = CudaTransferEngine::create(pools, o);
    GPU_CHECK(!refused.is_ok() && refused.status().message().find(
                                      "CudaEngineOptions.compute_stream") != std::string::npos);
  }
  auto engine = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(engine.is_ok(), "%s", engine.status().to_string().c_str());
  if (!engine.is_ok()) return;
  CudaTransferEngine& e = **engine;
  std::memset(host->data(), kPoison, host->bytes());
  launch_fill(gpu, kv.page_bytes() * kPages, kSeed1, compute);

  TransferBatch bad_batch;
  bad_batch.pages = {{GpuPageId(0), HostPageId(0)}, {GpuPageId(kPages), HostPageId(1)}};
  auto rejected = e.submit(bad_batch);
  GPU_CHECK(!rejected.is_ok() && rejected.status().code() == ErrorCode::kInvalidArgument);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<int> src(kPages, -1);
  GPU_CHECK(verify_host(pools.gpu_kv, base, host->data(), src, kSeed1) == 0);  // nothing copied

  TransferBatch b;
  for (std::uint32_t i = 0; i < 10; ++i) b.pages.push_back({GpuPageId(i), HostPageId(i)});
  e.inject_error_on_next_submit();
  auto failed = e.submit(b);
  GPU_CHECK(failed.is_ok());
  GPU_CHECK(failed->wait() == TransferState::kFailed);
  GPU_CHECK(failed->poll() == TransferState::kFailed);
  GPU_CHECK(e.stats().failed == 1 && !e.stats().last_error.empty());
  std::printf("  injected error reported as: %s\n", e.stats().last_error.c_str());
  GPU_CHECK(cudaPeekAtLastError() == cudaSuccess);  // the engine's own error was not left behind
  GPU_CHECK(e.health().is_ok());                    // and it is not fatal

  // A failure after two slices were queued (10 pages, slices of 4: the third fails): the
  // ticket fails, the first two slices' pages arrived, the engine keeps working.
  std::memset(host->data(), kPoison, host->bytes());
  e.inject_error_on_next_submit(2);
  auto late = e.submit(b);
  GPU_CHECK(late.is_ok() && late->wait() == TransferState::kFailed);
  for (std::uint32_t i = 0; i < 8; ++i) src[i] = static_cast<int>(i);
  GPU_CHECK_MSG(verify_host(pools.gpu_kv, base, host->data(), src, kSeed1) == 0,
                "the slices queued before the failure did not arrive intact");
  GPU_CHECK(e.stats().failed == 2 && e.health().is_ok());

  // The engine keeps working; a pending ticket dropped without wait() waits in its destructor.
  std::memset(host->data(), kPoison, host->bytes());
  {
    launch_spin(20, compute);
    auto dropped = e.submit(b);
    GPU_CHECK(dropped.is_ok());
    // Item 1 of issue 12: a pending poll leaves no cudaErrorNotReady behind.
    GPU_CHECK(dropped->poll() == TransferState::kPending);
    GPU_CHECK_MSG(cudaPeekAtLastError() == cudaSuccess, "poll left %s as the last error",
                  cudaGetErrorName(cudaPeekAtLastError()));
    GPU_CHECK(cudaGetLastError() == cudaSuccess);
  }
  for (std::uint32_t i = 0; i < 10; ++i) src[i] = static_cast<int>(i);
  GPU_CHECK(verify_host(pools.gpu_kv, base, host->data(), src, kSeed1) == 0);
  auto empty = e.submit(TransferBatch{});
  GPU_CHECK(empty.is_ok() && empty->wait() == TransferState::kDone);
  GPU_CHECK(e.poll(TicketId(999999)) == TransferState::kFailed);
  GPU_CHECK(!e.stream_wait(TicketId(999999), compute).is_ok());
  GPU_CHECK(e.stream_wait(empty->id(), cudaStreamPerThread).code() == ErrorCode::kInvalidArgument);
  empty->reset();
  failed->reset();
  late->reset();
  engine->reset();

  // Pageable host memory is refused with a clear error.
  std::vector<std::byte> pageable(kv.page_bytes() * 2);
  CudaPools bad_pools = pools;
  bad_pools.host_kv_pool = nullptr;
  bad_pools.host_kv = pageable.data();
  bad_pools.host_pages = 2;
  auto refused = CudaTransferEngine::create(bad_pools, opt);
  GPU_CHECK(!refused.is_ok() && refused.status().message().find("not pinned") != std::string::npos);
  opt.slice_pages = 0;
  GPU_CHECK(!CudaTransferEngine::create(pools, opt).is_ok());
  // An impossible pool (1 PiB) fails with a message, not a crash (the memory check).
  auto huge = PinnedHostPool::create(std::size_t{1} << 50, kv.page_bytes());
  GPU_CHECK(!huge.is_ok());
  if (!huge.is_ok()) std::printf("  1 PiB pool refused: %s\n", huge.status().to_string().c_str());
  GPU_CHECK(cudaPeekAtLastError() == cudaSuccess);
  cudaStreamDestroy(compute);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// What this driver leaves as the last error after cudaEventQuery on a pending event (the
// hazard of issue 12, item 1; informational), and that the engine leaves nothing.
void run_probe_not_ready() {
  std::printf("[probe] cudaEventQuery on a pending event\n");
  cudaStream_t s;
  cudaEvent_t ev;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  (void)cudaGetLastError();
  launch_spin(50, s);
  CUDA_OK(cudaEventRecord(ev, s));
  const cudaError_t q = cudaEventQuery(ev);
  const cudaError_t after = cudaPeekAtLastError();
  std::printf("  PROBE cudaEventQuery returned %s; cudaPeekAtLastError then returned %s (%s)\n",
              cudaGetErrorName(q), cudaGetErrorName(after),
              after == cudaErrorNotReady ? "the engine must clear it: it does"
                                         : "nothing to clear on this driver");
  (void)cudaGetLastError();
  CUDA_OK(cudaStreamSynchronize(s));
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
}

// Offsets over 4 GiB on both sides: 1 MiB pages, 4,200 of them (4.4 GB) on the GPU and in
// the pinned pool; pages above 4 GiB move both ways with both methods.
void run_large_offsets() {
  std::printf("[offsets > 4 GiB] page-first, 1 MiB pages, 4,200 pages on each side\n");
  const int failed_before = gpucheck::g_failed;
  constexpr std::size_t kPage = 1 << 20;
  constexpr std::uint32_t kPages = 4200, kMoved = 64;
  void* gpu = nullptr;
  if (cudaMalloc(&gpu, kPage * kPages) != cudaSuccess) {
    (void)cudaGetLastError();
    GPU_CHECK_MSG(false, "cudaMalloc of 4.4 GB failed");
    return;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  auto host = PinnedHostPool::create(kPage * kPages, kPage);
  GPU_CHECK_MSG(host.is_ok(), "%s", host.status().to_string().c_str());
  if (!host.is_ok()) return;
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  const DeviceLayout layout = contiguous_items(base, kPage, kPages);
  std::vector<unsigned char> page(kPage);
  for (CopyMethod method : {CopyMethod::kDmaBatch, CopyMethod::kZeroCopyKernel}) {
    CudaPools pools;
    pools.gpu_kv = layout;
    pools.host_kv_pool = &*host;
    pools.host_pages = kPages;
    CudaEngineOptions opt;
    opt.d2h = opt.h2d = method;
    opt.compute_stream = compute;
    auto engine = CudaTransferEngine::create(pools, opt);
    GPU_CHECK_MSG(engine.is_ok(), "%s", engine.status().to_string().c_str());
    if (!engine.is_ok()) continue;
    // Demote GPU pages 4,136.. (offsets > 4 GiB) to host pages 4,100.. (> 4 GiB), scattered.
    launch_fill(gpu, kPage * kPages, kSeed1, compute);
    std::memset(host->data() + std::size_t{4096} * kPage, kPoison, std::size_t{104} * kPage);
    TransferBatch down;
    for (std::uint32_t i = 0; i < kMoved; ++i)
      down.pages.push_back({GpuPageId(kPages - 1 - i), HostPageId(4100 + (i * 37) % 100)});
    auto t = (*engine)->submit(down);
    GPU_CHECK(t.is_ok() && t->wait() == TransferState::kDone);
    std::uint64_t bad = 0;
    for (const PageCopy& p : down.pages) {
      const auto* h = reinterpret_cast<const unsigned char*>(host->data()) +
                      std::size_t{p.host.value()} * kPage;
      for (std::size_t b = 0; b < kPage; ++b)
        bad += h[b] != pattern_byte(kSeed1, std::uint64_t{p.gpu.value()} * kPage + b);
    }
    GPU_CHECK_MSG(bad == 0, "%s demotion above 4 GiB: %llu bytes wrong", to_string(method),
                  static_cast<unsigned long long>(bad));
    // Promote them back into other pages above 4 GiB, after poisoning the GPU pool.
    CUDA_OK(cudaMemsetAsync(gpu, kPoison, kPage * kPages, compute));
    TransferBatch up;
    up.direction = Direction::kHostToDevice;
    for (std::uint32_t i = 0; i < kMoved; ++i)
      up.pages.push_back({GpuPageId(4100 + i), down.pages[i].host});
    auto u = (*engine)->submit(up);
    GPU_CHECK(u.is_ok() && u->wait() == TransferState::kDone);
    bad = 0;
    for (std::uint32_t i = 0; i < kMoved; ++i) {
      CUDA_OK(cudaMemcpy(page.data(),
                         static_cast<unsigned char*>(gpu) + std::size_t{4100 + i} * kPage, kPage,
                         cudaMemcpyDeviceToHost));
      const std::uint64_t origin = std::uint64_t{down.pages[i].gpu.value()} * kPage;
      for (std::size_t b = 0; b < kPage; ++b) bad += page[b] != pattern_byte(kSeed1, origin + b);
    }
    GPU_CHECK_MSG(bad == 0, "%s promotion above 4 GiB: %llu bytes wrong", to_string(method),
                  static_cast<unsigned long long>(bad));
    GPU_CHECK((*engine)->stats().failed == 0);
  }
  cudaStreamDestroy(compute);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// Concurrent submit/poll in both directions from two threads on one engine, with byte checks
// after every batch: demotions of GPU pages 0-127 to host pages 0-127 and promotions of host
// pages 256-383 to GPU pages 128-255, each thread polling its own tickets.
void run_concurrent(CopyMethod method) {
  std::printf("[concurrent] two threads, both directions, %s\n", to_string(method));
  const int failed_before = gpucheck::g_failed;
  const KvGeometry g{4, 16, 2, 128, 2};  // 32 KiB pages in 8 chunks
  constexpr std::uint32_t kGpu = 256, kHost = 512, kHalf = 128, kRounds = 24, kBatch = 32;
  const std::size_t page = g.page_bytes(), chunk = g.chunk_bytes();
  void* gpu = nullptr;
  CUDA_OK(cudaMalloc(&gpu, page * kGpu));
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  auto host = PinnedHostPool::create(page * kHost, page);
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(base, g, kGpu);
  pools.host_kv_pool = &*host;
  pools.host_pages = kHost;
  CudaEngineOptions opt;
  opt.slice_pages = 8;
  opt.d2h = opt.h2d = method;
  opt.compute_stream = compute;
  auto created = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(created.is_ok(), "%s", created.status().to_string().c_str());
  if (!created.is_ok()) return;
  CudaTransferEngine& e = **created;
  launch_fill(gpu, page * kGpu, kSeed1, compute);
  CUDA_OK(cudaStreamSynchronize(compute));
  // Host pages 256.. hold pattern kSeed2 by host offset.
  auto* hbytes = reinterpret_cast<unsigned char*>(host->data());
  for (std::size_t o = std::size_t{256} * page; o < std::size_t{384} * page; ++o)
    hbytes[o] = pattern_byte(kSeed2, o);
  std::atomic<std::uint64_t> bad_down{0}, bad_up{0}, not_done{0};
  auto poll_until_done = [&](Ticket& t) {
    TransferState s;
    while ((s = t.poll()) == TransferState::kPending) std::this_thread::yield();
    if (s != TransferState::kDone) ++not_done;
  };
  std::thread down([&] {
    for (std::uint32_t r = 0; r < kRounds; ++r) {
      const std::uint32_t first = r * kBatch % kHalf;
      std::memset(hbytes + std::size_t{first} * page, kPoison, std::size_t{kBatch} * page);
      TransferBatch b;
      for (std::uint32_t i = 0; i < kBatch; ++i)
        b.pages.push_back({GpuPageId(first + i), HostPageId(first + (i * 5) % kBatch)});
      auto t = e.submit(b);
      if (!t.is_ok()) {
        ++not_done;
        continue;
      }
      poll_until_done(*t);
      for (const PageCopy& p : b.pages) {
        const unsigned char* h = hbytes + std::size_t{p.host.value()} * page;
        for (std::uint32_t c = 0; c < 2 * g.layers; ++c)
          for (std::size_t x = 0; x < chunk; ++x)
            bad_down += h[c * chunk + x] !=
                        pattern_byte(kSeed1, (std::uint64_t{c} * kGpu + p.gpu.value()) * chunk + x);
      }
    }
  });
  std::thread up([&] {
    cudaStream_t mine;
    CUDA_OK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
    std::vector<unsigned char> back(page * kGpu);
    for (std::uint32_t r = 0; r < kRounds; ++r) {
      // Poison GPU pages 128-255 (one range per chunk tensor), then promote into them.
      for (std::uint32_t c = 0; c < 2 * g.layers; ++c)
        CUDA_OK(cudaMemsetAsync(
            static_cast<unsigned char*>(gpu) + (std::size_t{c} * kGpu + kHalf) * chunk, kPoison,
            std::size_t{kHalf} * chunk, mine));
      CUDA_OK(cudaStreamSynchronize(mine));
      TransferBatch b;
      b.direction = Direction::kHostToDevice;
      for (std::uint32_t i = 0; i < kHalf; ++i)
        b.pages.push_back({GpuPageId(kHalf + i), HostPageId(256 + (i * 7 + r) % kHalf)});
      auto t = e.submit(b);
      if (!t.is_ok()) {
        ++not_done;
        continue;
      }
      poll_until_done(*t);
      CUDA_OK(cudaMemcpyAsync(back.data(), gpu, back.size(), cudaMemcpyDeviceToHost, mine));
      CUDA_OK(cudaStreamSynchronize(mine));
      for (const PageCopy& p : b.pages)
        for (std::uint32_t c = 0; c < 2 * g.layers; ++c)
          for (std::size_t x = 0; x < chunk; ++x)
            bad_up += back[(std::size_t{c} * kGpu + p.gpu.value()) * chunk + x] !=
                      pattern_byte(kSeed2, std::size_t{p.host.value()} * page + c * chunk + x);
    }
    cudaStreamDestroy(mine);
  });
  down.join();
  up.join();
  GPU_CHECK_MSG(not_done == 0, "%llu batches did not finish kDone",
                static_cast<unsigned long long>(not_done.load()));
  GPU_CHECK_MSG(bad_down == 0 && bad_up == 0, "bytes wrong: %llu demoted, %llu promoted",
                static_cast<unsigned long long>(bad_down.load()),
                static_cast<unsigned long long>(bad_up.load()));
  created->reset();
  cudaStreamDestroy(compute);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// More than 1,024 pages in one kernel slice (the kernel's per-launch limit).
void run_big_kernel_slice() {
  std::printf("[zero-copy] 2,500 pages in slices of 2,048 (launches of <= 1,024 pages)\n");
  const int failed_before = gpucheck::g_failed;
  const KvGeometry g{2, 4, 1, 64, 2};  // 2 KiB pages in 4 chunks of 512 B
  constexpr std::uint32_t kPages = 3000, kMoved = 2500;
  const std::size_t page = g.page_bytes();
  void* gpu = nullptr;
  CUDA_OK(cudaMalloc(&gpu, page * kPages));
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  auto host = PinnedHostPool::create(page * kPages, page);
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(base, g, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.slice_pages = 2048;
  opt.d2h = opt.h2d = CopyMethod::kZeroCopyKernel;
  opt.compute_stream = compute;
  auto e = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
  if (!e.is_ok()) return;
  launch_fill(gpu, page * kPages, kSeed1, compute);
  std::memset(host->data(), kPoison, host->bytes());
  std::vector<int> src(kPages, -1);
  TransferBatch b;
  for (std::uint32_t i = 0; i < kMoved; ++i) {
    const std::uint32_t h = (i * 7) % kPages;  // 7 is prime to 3000: distinct host pages
    b.pages.push_back({GpuPageId(kPages - 1 - i), HostPageId(h)});
    src[h] = static_cast<int>(kPages - 1 - i);
  }
  auto t = (*e)->submit(b);
  GPU_CHECK(t.is_ok() && t->wait() == TransferState::kDone);
  GPU_CHECK((*e)->stats().kernel_launches == 3);
  const std::uint64_t bad = verify_host(pools.gpu_kv, base, host->data(), src, kSeed1);
  GPU_CHECK_MSG(bad == 0, "%llu bytes wrong", static_cast<unsigned long long>(bad));
  t->reset();
  e->reset();
  cudaStreamDestroy(compute);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// The real runtime, except that cudaMemcpyBatchAsync is "not supported" (an old driver).
class NoBatchRuntime final : public radixtier::cuda::detail::RealRuntime {
 public:
  cudaError_t memcpy_batch_async(void* const*, const void* const*, const std::size_t*, std::size_t,
                                 bool, cudaStream_t) override {
    return cudaErrorNotSupported;
  }
};

// The per-piece fallback on a real device: bytes right, reported once.
void run_fallback() {
  std::printf("[fallback] cudaMemcpyBatchAsync unsupported -> per-piece cudaMemcpyAsync\n");
  const int failed_before = gpucheck::g_failed;
  const KvGeometry kv = KvGeometry::qwen3_next();
  constexpr std::uint32_t kPages = 64;
  void* gpu = nullptr;
  CUDA_OK(cudaMalloc(&gpu, kv.page_bytes() * kPages));
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  auto host = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes());
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  NoBatchRuntime rt;
  radixtier::cuda::detail::EngineSeams seams;
  seams.runtime = &rt;
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(base, kv, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.slice_pages = 16;
  opt.compute_stream = compute;
  int lines = 0;
  opt.log = [&](const std::string& line) {
    ++lines;
    std::printf("  log: %s\n", line.c_str());
  };
  auto e = CudaTransferEngine::create(pools, opt, seams);
  GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
  if (!e.is_ok()) return;
  launch_fill(gpu, kv.page_bytes() * kPages, kSeed1, compute);
  std::memset(host->data(), kPoison, host->bytes());
  std::vector<int> src(kPages, -1);
  TransferBatch b;
  for (std::uint32_t i = 0; i < 40; ++i) {
    b.pages.push_back({GpuPageId(i), HostPageId(63 - i)});
    src[63 - i] = static_cast<int>(i);
  }
  auto t = (*e)->submit(b);
  GPU_CHECK(t.is_ok() && t->wait() == TransferState::kDone);
  GPU_CHECK((*e)->stats().dma_batch_fallback && lines == 1);
  GPU_CHECK(verify_host(pools.gpu_kv, base, host->data(), src, kSeed1) == 0);
  GPU_CHECK(cudaPeekAtLastError() == cudaSuccess);
  t->reset();
  e->reset();
  cudaStreamDestroy(compute);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

__global__ void tiny_kernel(int* p) {
  if (threadIdx.x == 0 && p != nullptr) *p += 1;
}

// Capture of the compute stream (global mode, as torch.cuda.graph does by default): submit is
// refused with nothing enqueued, a pending ticket's poll is deferred, the graph stays valid
// and holds only the server's own node.
void run_capture() {
  std::printf("[capture] submit and poll while the compute stream is captured\n");
  const int failed_before = gpucheck::g_failed;
  const KvGeometry kv = KvGeometry::qwen3_next();
  constexpr std::uint32_t kPages = 16;
  void* gpu = nullptr;
  int* counter = nullptr;
  CUDA_OK(cudaMalloc(&gpu, kv.page_bytes() * kPages));
  CUDA_OK(cudaMalloc(&counter, sizeof(int)));
  auto host = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes());
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  cudaStream_t compute, other;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(gpu), kv, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.compute_stream = compute;
  auto e = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
  if (!e.is_ok()) return;
  TransferBatch b;
  for (std::uint32_t i = 0; i < 8; ++i) b.pages.push_back({GpuPageId(i), HostPageId(i)});
  launch_spin(30, other);
  // A ticket that is still pending when the capture begins (it waits behind `other`).
  cudaEvent_t gate;
  CUDA_OK(cudaEventCreateWithFlags(&gate, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(gate, other));
  CUDA_OK(cudaStreamWaitEvent(compute, gate, 0));
  auto pending = (*e)->submit(b);
  GPU_CHECK(pending.is_ok());
  // Capture only records work issued after it begins; the queued wait stays outside.
  CUDA_OK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeGlobal));
  tiny_kernel<<<1, 32, 0, compute>>>(counter);
  auto refused = (*e)->submit(b);
  GPU_CHECK(!refused.is_ok() && refused.status().code() == ErrorCode::kFailedPrecondition);
  if (!refused.is_ok()) std::printf("  refused: %s\n", refused.status().message().c_str());
  // The ticket is still behind the 30 ms spin: its poll (a real event query, in relaxed
  // capture mode) says pending and leaves the capture valid.
  GPU_CHECK(pending->poll() == TransferState::kPending);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(compute, &graph);
  GPU_CHECK_MSG(end == cudaSuccess, "the capture was invalidated: %s", cudaGetErrorName(end));
  if (end == cudaSuccess) {
    std::size_t nodes = 0;
    CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
    GPU_CHECK_MSG(nodes == 1, "the graph holds %zu nodes (the engine's copies joined it?)", nodes);
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, compute));
    CUDA_OK(cudaStreamSynchronize(compute));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  GPU_CHECK(pending->wait() == TransferState::kDone);
  GPU_CHECK((*e)->stats().refused_captures == 1);
  GPU_CHECK(cudaPeekAtLastError() == cudaSuccess);
  auto after = (*e)->submit(b);
  GPU_CHECK(after.is_ok() && after->wait() == TransferState::kDone);
  pending->reset();
  after->reset();
  e->reset();
  cudaEventDestroy(gate);
  cudaStreamDestroy(compute);
  cudaStreamDestroy(other);
  cudaFree(counter);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// stream_wait into a stream being captured (issue 33): refused with nothing enqueued, through
// the TransferEngine interface and the engine's own calls, with and without a layer; the
// server's graph ends valid with its own 2 nodes and launches; outside the capture the same
// wait is accepted, and a kernel after it reads the promoted bytes.
void run_stream_wait_capture() {
  std::printf("[stream_wait capture] stream_wait into a captured stream is refused\n");
  const int failed_before = gpucheck::g_failed;
  const KvGeometry kv = KvGeometry::qwen3_next();
  constexpr std::uint32_t kPages = 16;
  void* gpu = nullptr;
  int* counter = nullptr;
  CUDA_OK(cudaMalloc(&gpu, kv.page_bytes() * kPages));
  CUDA_OK(cudaMalloc(&counter, sizeof(int)));
  CUDA_OK(cudaMemset(counter, 0, sizeof(int)));
  CUDA_OK(cudaDeviceSynchronize());  // the memset (legacy stream) before the non-blocking ones
  auto host = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes());
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  cudaStream_t compute, graph_stream;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&graph_stream, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(gpu), kv, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.compute_stream = compute;
  auto e = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
  if (!e.is_ok()) return;
  TransferEngine& te = **e;
  GPU_CHECK(te.waits_on_device());
  std::memset(host->data(), 0x3C, kv.page_bytes() * kPages);
  TransferBatch b;
  b.direction = Direction::kHostToDevice;
  for (std::uint32_t i = 0; i < 8; ++i) b.pages.push_back({GpuPageId(i), HostPageId(i)});
  auto t = (*e)->submit(b);
  GPU_CHECK(t.is_ok());
  if (!t.is_ok()) return;
  CUDA_OK(cudaStreamBeginCapture(graph_stream, cudaStreamCaptureModeGlobal));
  tiny_kernel<<<1, 32, 0, graph_stream>>>(counter);
  const Status refused = te.stream_wait(t->id(), graph_stream, std::nullopt);
  GPU_CHECK_MSG(refused.code() == ErrorCode::kFailedPrecondition, "%s",
                refused.to_string().c_str());
  std::printf("  refused: %s\n", refused.message().c_str());
  GPU_CHECK(te.stream_wait(t->id(), graph_stream, 0u).code() == ErrorCode::kFailedPrecondition);
  GPU_CHECK((*e)->stream_wait(t->id(), graph_stream).code() == ErrorCode::kFailedPrecondition);
  tiny_kernel<<<1, 32, 0, graph_stream>>>(counter);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(graph_stream, &graph);
  GPU_CHECK_MSG(end == cudaSuccess, "the capture was invalidated: %s", cudaGetErrorName(end));
  if (end == cudaSuccess) {
    std::size_t nodes = 0;
    CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
    GPU_CHECK_MSG(nodes == 2, "the graph holds %zu nodes (a wait joined it?)", nodes);
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, graph_stream));
    CUDA_OK(cudaStreamSynchronize(graph_stream));
    int launched = 0;
    CUDA_OK(cudaMemcpy(&launched, counter, sizeof(int), cudaMemcpyDeviceToHost));
    GPU_CHECK_MSG(launched == 2, "the graph ran %d of its 2 increments", launched);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  GPU_CHECK((*e)->stats().refused_stream_waits == 3);
  // Eager: accepted; a copy ordered on the stream after it sees the promoted bytes.
  GPU_CHECK(te.stream_wait(t->id(), graph_stream, std::nullopt).is_ok());
  std::vector<unsigned char> got(kv.chunk_bytes());
  CUDA_OK(cudaMemcpyAsync(got.data(), gpu, got.size(), cudaMemcpyDeviceToHost, graph_stream));
  CUDA_OK(cudaStreamSynchronize(graph_stream));
  GPU_CHECK(std::all_of(got.begin(), got.end(), [](unsigned char c) { return c == 0x3C; }));
  GPU_CHECK(t->wait() == TransferState::kDone);
  GPU_CHECK(cudaPeekAtLastError() == cudaSuccess);
  t->reset();
  e->reset();
  cudaStreamDestroy(compute);
  cudaStreamDestroy(graph_stream);
  cudaFree(counter);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// With 2+ GPUs: an engine on device 1 leaves the caller's thread on device 0.
void run_device_restore() {
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("[device restore] SKIPPED: needs 2 GPUs, %d visible\n", count);
    return;
  }
  std::printf("[device restore] engine on device 1, caller on device 0\n");
  const int failed_before = gpucheck::g_failed;
  const KvGeometry kv{2, 4, 1, 64, 2};
  constexpr std::uint32_t kPages = 64;
  CUDA_OK(cudaSetDevice(1));
  void* gpu = nullptr;
  cudaStream_t compute;
  CUDA_OK(cudaMalloc(&gpu, kv.page_bytes() * kPages));
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaSetDevice(0));
  PinnedHostPool::Options popt;
  popt.device = 1;
  auto host = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes(), popt);
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(gpu), kv, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.device = 1;
  opt.compute_stream = compute;
  auto e = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
  int dev = -1;
  CUDA_OK(cudaGetDevice(&dev));
  GPU_CHECK(dev == 0);
  if (e.is_ok()) {
    TransferBatch b;
    for (std::uint32_t i = 0; i < 8; ++i) b.pages.push_back({GpuPageId(i), HostPageId(i)});
    auto t = (*e)->submit(b);
    CUDA_OK(cudaGetDevice(&dev));
    GPU_CHECK(dev == 0);
    GPU_CHECK(t.is_ok() && t->wait() == TransferState::kDone);
    t->reset();
    e->reset();
  }
  CUDA_OK(cudaSetDevice(1));
  cudaStreamDestroy(compute);
  cudaFree(gpu);
  CUDA_OK(cudaSetDevice(0));
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// Side-stream capture, as torch.cuda.graph does it: the server captures a graph on its own
// non-blocking stream in global mode while a cache thread (which never chose a device)
// submits, polls, waits, waits on the GPU and drops tickets on the engine. The capture must
// end valid, holding only the server's kernels; the cache thread must end with no context;
// every byte moved during the capture is checked afterwards.
void run_side_capture(CopyMethod method) {
  std::printf("[side-stream capture] global-mode capture on a side stream, cache thread busy, %s\n",
              to_string(method));
  const int failed_before = gpucheck::g_failed;
  const KvGeometry kv = KvGeometry::qwen3_next(16);  // 16 KiB pieces
  constexpr std::uint32_t kPages = 128, kMoved = 48;
  const std::size_t page = kv.page_bytes(), bytes = page * kPages;
  void* gpu = nullptr;
  int* counter = nullptr;
  CUDA_OK(cudaMalloc(&gpu, bytes));
  CUDA_OK(cudaMalloc(&counter, sizeof(int)));
  CUDA_OK(cudaMemset(counter, 0, sizeof(int)));
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  auto host = PinnedHostPool::create(bytes, page);
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  cudaStream_t compute, capture;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(base, kv, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.slice_pages = 8;  // several slices: the feeders work during the capture
  opt.d2h = opt.h2d = method;
  opt.compute_stream = compute;
  auto e = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
  if (!e.is_ok()) return;
  CudaTransferEngine& engine = **e;
  std::memset(host->data(), kPoison, host->bytes());
  launch_fill(gpu, bytes, kSeed1, compute);
  CUDA_OK(cudaStreamSynchronize(compute));
  std::vector<int> host_src(kPages, -1);
  TransferBatch down, up;
  up.direction = Direction::kHostToDevice;
  for (std::uint32_t i = 0; i < kMoved; ++i) {
    down.pages.push_back({GpuPageId(i), HostPageId(kPages - 1 - i)});
    host_src[kPages - 1 - i] = static_cast<int>(i);
    up.pages.push_back({GpuPageId(kPages - 1 - i), HostPageId(kPages - 1 - i)});
  }

  CUDA_OK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
  tiny_kernel<<<1, 32, 0, capture>>>(counter);
  std::atomic<int> errors{0};
  bool no_context = false;
  std::thread cache([&] {
    auto d = engine.submit(down);
    if (!d.is_ok()) {
      ++errors;
      return;
    }
    TransferState st;
    while ((st = d->poll()) == TransferState::kPending) std::this_thread::yield();
    errors += st != TransferState::kDone;
    auto u = engine.submit(up);
    if (!u.is_ok() || !engine.stream_wait_layer(u->id(), 0, compute).is_ok() ||
        !engine.stream_wait(u->id(), compute).is_ok() || u->wait() != TransferState::kDone)
      ++errors;
    auto dropped = engine.submit(down);  // dropped at once: its destructor polls and waits
    errors += !dropped.is_ok();
    no_context = gpucheck::current_context() == nullptr;
  });
  cache.join();
  tiny_kernel<<<1, 32, 0, capture>>>(counter);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(capture, &graph);
  GPU_CHECK_MSG(end == cudaSuccess, "the server's capture was invalidated: %s",
                cudaGetErrorName(end));
  GPU_CHECK_MSG(errors == 0, "%d engine calls failed during the capture", errors.load());
  GPU_CHECK_MSG(no_context, "the cache thread was left with a current context");
  if (end == cudaSuccess) {
    std::size_t nodes = 0;
    CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
    GPU_CHECK_MSG(nodes == 2, "the graph holds %zu nodes, not the server's 2", nodes);
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, capture));
    CUDA_OK(cudaStreamSynchronize(capture));
    int count = 0;
    CUDA_OK(cudaMemcpy(&count, counter, sizeof(int), cudaMemcpyDeviceToHost));
    GPU_CHECK(count == 2);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::uint64_t bad = verify_host(pools.gpu_kv, base, host->data(), host_src, kSeed1);
  GPU_CHECK_MSG(bad == 0, "demotion during the capture: %llu bytes wrong",
                static_cast<unsigned long long>(bad));
  std::vector<unsigned char> back(bytes);
  CUDA_OK(cudaMemcpy(back.data(), gpu, bytes, cudaMemcpyDeviceToHost));
  bad = 0;
  const std::size_t chunk = kv.chunk_bytes();
  for (std::uint32_t i = 0; i < kMoved; ++i)
    for (std::uint32_t c = 0; c < 2 * kv.layers; ++c)
      for (std::size_t x = 0; x < chunk; ++x) {
        const std::uint64_t want = (std::uint64_t{c} * kPages + i) * chunk + x;
        bad += back[(std::size_t{c} * kPages + kPages - 1 - i) * chunk + x] !=
               pattern_byte(kSeed1, want);
      }
  GPU_CHECK_MSG(bad == 0, "promotion during the capture: %llu bytes wrong",
                static_cast<unsigned long long>(bad));
  GPU_CHECK(engine.stats().failed == 0);
  GPU_CHECK(cudaPeekAtLastError() == cudaSuccess);
  e->reset();
  cudaStreamDestroy(compute);
  cudaStreamDestroy(capture);
  cudaFree(counter);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// PyTorch's default stream: the legacy default stream (compute_stream = nullptr). The model
// writes pages on it after a spin, a demotion submitted at once must read them; the model
// poisons pages on it, a promotion must land after that and a kernel on the legacy stream
// after stream_wait(ticket, nullptr) must read the promoted bytes.
void run_legacy_stream() {
  std::printf("[legacy stream] the compute stream is the legacy default stream (nullptr)\n");
  const int failed_before = gpucheck::g_failed;
  const KvGeometry kv = KvGeometry::qwen3_next();
  constexpr std::uint32_t kPages = 96, kMoved = 40;
  const std::size_t page = kv.page_bytes(), bytes = page * kPages;
  void* gpu = nullptr;
  CUDA_OK(cudaMalloc(&gpu, bytes));
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  auto host = PinnedHostPool::create(bytes, page);
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return;
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(base, kv, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.compute_stream = nullptr;
  auto e = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
  if (!e.is_ok()) return;
  CudaTransferEngine& engine = **e;
  std::memset(host->data(), kPoison, host->bytes());
  CUDA_OK(cudaMemset(gpu, kPoison, bytes));
  launch_spin(20, nullptr);
  launch_fill(gpu, bytes, kSeed1, nullptr);
  std::vector<int> host_src(kPages, -1);
  TransferBatch down;
  for (std::uint32_t i = 0; i < kMoved; ++i) {
    down.pages.push_back({GpuPageId(2 * i), HostPageId(i)});
    host_src[i] = static_cast<int>(2 * i);
  }
  auto t = engine.submit(down);
  GPU_CHECK(t.is_ok() && t->wait() == TransferState::kDone);
  std::uint64_t bad = verify_host(pools.gpu_kv, base, host->data(), host_src, kSeed1);
  GPU_CHECK_MSG(bad == 0, "a demotion did not wait for the legacy stream: %llu bytes wrong",
                static_cast<unsigned long long>(bad));
  // Promotion after the legacy stream poisons the whole pool.
  launch_spin(20, nullptr);
  CUDA_OK(cudaMemsetAsync(gpu, kPoison, bytes, nullptr));
  TransferBatch up;
  up.direction = Direction::kHostToDevice;
  std::vector<int> gpu_src(kPages, -1);
  for (std::uint32_t i = 0; i < kMoved; ++i) {
    up.pages.push_back({GpuPageId(kPages - 1 - i), HostPageId(i)});
    gpu_src[kPages - 1 - i] = static_cast<int>(2 * i);
  }
  auto u = engine.submit(up);
  GPU_CHECK(u.is_ok());
  GPU_CHECK(engine.stream_wait(u->id(), nullptr).is_ok());
  std::vector<VerifySeg> vsegs;
  for (const StridedSegment& s : pools.gpu_kv.segments)
    vsegs.push_back({s.base - base, s.item_stride, s.bytes});
  const unsigned long long gpu_bad =
      count_pool_damage(vsegs, gpu, kPages, gpu_src, kSeed1, nullptr);  // on the legacy stream
  GPU_CHECK(u->wait() == TransferState::kDone);
  GPU_CHECK_MSG(gpu_bad == 0, "promotion read on the legacy stream: %llu bytes wrong", gpu_bad);
  GPU_CHECK(engine.stats().failed == 0);
  GPU_CHECK(cudaPeekAtLastError() == cudaSuccess);
  t->reset();
  u->reset();
  e->reset();
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// `--contexts`, in a fresh process: the model's thread works on the last device D; a cache
// thread that never chose a device makes the pinned pool and the engine on D and uses them.
// Afterwards no other device has a primary context and the cache thread has none current.
// (With one GPU, D = 0 and only the thread's context is checked.)
int run_contexts() {
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  const int d = count - 1;
  std::printf("[contexts] engine on device %d of %d, used from a thread without a context\n", d,
              count);
  for (int i = 0; i < count; ++i) {
    const int active = gpucheck::primary_context_active(i);
    std::printf("  device %d primary context at start: %s\n", i,
                active < 0 ? "unknown"
                : active   ? "active"
                           : "none");
  }
  const KvGeometry kv = KvGeometry::qwen3_next(8);
  constexpr std::uint32_t kPages = 64;
  void* gpu = nullptr;
  cudaStream_t compute = nullptr;
  std::thread model([&] {  // the model's thread, on device D
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaMalloc(&gpu, kv.page_bytes() * kPages));
    CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    launch_fill(gpu, kv.page_bytes() * kPages, kSeed1, compute);
    CUDA_OK(cudaStreamSynchronize(compute));
  });
  model.join();
  std::thread cache([&] {
    auto fail = [](const char* what) {
      ++gpucheck::g_failed;
      std::printf("  FAILED: %s left the cache thread with a current context\n", what);
    };
    PinnedHostPool::Options popt;
    popt.device = d;
    auto host = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes(), popt);
    GPU_CHECK_MSG(host.is_ok(), "%s", host.status().to_string().c_str());
    if (!host.is_ok()) return;
    if (gpucheck::current_context() != nullptr) fail("PinnedHostPool::create");
    CudaPools pools;
    pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(gpu), kv, kPages);
    pools.host_kv_pool = &*host;
    pools.host_pages = kPages;
    CudaEngineOptions opt;
    opt.device = d;
    opt.compute_stream = compute;
    auto e = CudaTransferEngine::create(pools, opt);
    GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
    if (!e.is_ok()) return;
    if (gpucheck::current_context() != nullptr) fail("create");
    TransferBatch down;
    for (std::uint32_t i = 0; i < 16; ++i) down.pages.push_back({GpuPageId(i), HostPageId(i)});
    auto t = (*e)->submit(down);
    GPU_CHECK(t.is_ok());
    if (gpucheck::current_context() != nullptr) fail("submit");
    (void)t->poll();
    if (gpucheck::current_context() != nullptr) fail("poll");
    GPU_CHECK(t->wait() == TransferState::kDone);
    if (gpucheck::current_context() != nullptr) fail("wait");
    TransferBatch up = down;
    up.direction = Direction::kHostToDevice;
    for (PageCopy& p : up.pages) p.gpu = GpuPageId(p.gpu.value() + 32);
    auto u = (*e)->submit(up);
    GPU_CHECK(u.is_ok() && (*e)->stream_wait_layer(u->id(), 0, compute).is_ok() &&
              (*e)->stream_wait(u->id(), compute).is_ok());
    if (gpucheck::current_context() != nullptr) fail("stream_wait");
    u->reset();
    t->reset();
    if (gpucheck::current_context() != nullptr) fail("Ticket::reset");
    e->reset();
    host->reset();
    if (gpucheck::current_context() != nullptr) fail("the destructors");
  });
  cache.join();
  for (int i = 0; i < count; ++i) {
    if (i == d) continue;
    const int active = gpucheck::primary_context_active(i);
    GPU_CHECK_MSG(active == 0, "device %d has a primary context (%d) nobody asked for", i, active);
  }
  std::printf("  %s\n", gpucheck::g_failed == 0 ? "ok" : "FAILED");
  return gpucheck::report();
}

__global__ void fault_kernel(int* p) {
  *p = 1;
}

// `--fatal`: a fault in a compute-stream kernel (the model's) is a sticky error: the engine
// must report kDeviceLost, not a recomputable failed ticket. Run alone: it kills the context.
int run_fatal() {
  std::printf("[fatal] illegal address in a compute-stream kernel\n");
  const KvGeometry kv{2, 4, 1, 64, 2};
  constexpr std::uint32_t kPages = 64;
  void* gpu = nullptr;
  cudaStream_t compute;
  CUDA_OK(cudaMalloc(&gpu, kv.page_bytes() * kPages));
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  auto host = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes());
  GPU_CHECK(host.is_ok());
  if (!host.is_ok()) return gpucheck::report();
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(gpu), kv, kPages);
  pools.host_kv_pool = &*host;
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.compute_stream = compute;
  std::string logged;
  opt.log = [&](const std::string& line) { logged = line; };
  auto e = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(e.is_ok(), "%s", e.status().to_string().c_str());
  if (!e.is_ok()) return gpucheck::report();
  TransferBatch b;
  for (std::uint32_t i = 0; i < 8; ++i) b.pages.push_back({GpuPageId(i), HostPageId(i)});
  launch_spin(20, compute);
  fault_kernel<<<1, 1, 0, compute>>>(reinterpret_cast<int*>(0x10));
  auto t = (*e)->submit(b);  // waits for the faulting kernel (demote_after_compute)
  TransferState s = TransferState::kPending;
  if (t.is_ok()) {
    const double start = gpucheck::now_s();
    while ((s = t->poll()) == TransferState::kPending && gpucheck::now_s() - start < 20) {
    }
  }
  GPU_CHECK(!t.is_ok() || s == TransferState::kFailed);
  const Status h = (*e)->health();
  GPU_CHECK_MSG(h.code() == ErrorCode::kDeviceLost, "health: %s", h.to_string().c_str());
  std::printf("  health: %s\n", h.to_string().c_str());
  auto next = (*e)->submit(b);
  GPU_CHECK(!next.is_ok() && next.status().code() == ErrorCode::kDeviceLost);
  GPU_CHECK((*e)->stats().fatal && !logged.empty());
  std::printf("  %s\n", gpucheck::g_failed == 0 ? "ok" : "FAILED");
  return gpucheck::report();  // no cleanup: the context is gone
}

}  // namespace

int main(int argc, char** argv) {
  switch (gpucheck::check_device("radixtier_gpu_transfer_tests")) {
    case gpucheck::DeviceCheck::kRun:
      break;
    case gpucheck::DeviceCheck::kSkip:
      return 0;
    case gpucheck::DeviceCheck::kFail:
      return 1;
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  if (argc > 1 && std::string(argv[1]) == "--fatal") return run_fatal();
  if (argc > 1 && std::string(argv[1]) == "--contexts") return run_contexts();
  std::mt19937 rng(12345);
  const KvGeometry qwen = KvGeometry::qwen3_next();
  const KvGeometry odd{3, 5, 1, 7, 1};  // 35-byte chunks: the byte path, unaligned addresses
  const RoundTrip trips[] = {
      {"qwen3-next dma", qwen, Kind::kLayerFirst, CopyMethod::kDmaBatch, CopyMethod::kDmaBatch, 128,
       512, 512, 200, 0},
      {"qwen3-next zero-copy", qwen, Kind::kLayerFirst, CopyMethod::kZeroCopyKernel,
       CopyMethod::kZeroCopyKernel, 128, 512, 512, 200, 0},
      {"qwen3-next mixed", qwen, Kind::kLayerFirst, CopyMethod::kDmaBatch,
       CopyMethod::kZeroCopyKernel, 32, 256, 256, 100, 0},
      {"page-first, 3-page registrations", qwen, Kind::kPageFirst, CopyMethod::kDmaBatch,
       CopyMethod::kDmaBatch, 64, 256, 256, 100, 3},
      {"page-first zero-copy", qwen, Kind::kPageFirst, CopyMethod::kZeroCopyKernel,
       CopyMethod::kZeroCopyKernel, 64, 256, 256, 100, 3},
      {"odd per-layer dma", odd, Kind::kPerLayerPadded, CopyMethod::kDmaBatch,
       CopyMethod::kDmaBatch, 7, 200, 200, 60, 0},
      {"odd per-layer zero-copy", odd, Kind::kPerLayerPadded, CopyMethod::kZeroCopyKernel,
       CopyMethod::kZeroCopyKernel, 7, 200, 200, 60, 0},
      {"mixed alignment zero-copy", KvGeometry{2, 16, 2, 64, 2}, Kind::kMixedAlignment,
       CopyMethod::kZeroCopyKernel, CopyMethod::kZeroCopyKernel, 16, 128, 128, 40, 0},
      {"mixed alignment dma", KvGeometry{2, 16, 2, 64, 2}, Kind::kMixedAlignment,
       CopyMethod::kDmaBatch, CopyMethod::kDmaBatch, 16, 128, 128, 40, 0},
      {"qwen3-next auto (64 KiB pieces)", qwen, Kind::kLayerFirst, CopyMethod::kAuto,
       CopyMethod::kAuto, 128, 256, 256, 100, 0},
      {"qwen3-next 8-token pages auto (8 KiB pieces)", KvGeometry::qwen3_next(8), Kind::kLayerFirst,
       CopyMethod::kAuto, CopyMethod::kAuto, 128, 512, 512, 200, 0},
      {"qwen3-next 8-token pages dma (8 KiB pieces)", KvGeometry::qwen3_next(8), Kind::kLayerFirst,
       CopyMethod::kDmaBatch, CopyMethod::kDmaBatch, 128, 256, 256, 100, 0},
  };
  const double start = gpucheck::now_s();
  run_probe_not_ready();
  for (const RoundTrip& t : trips) run_round_trip(t, rng);
  run_snapshots(0);
  run_snapshots((std::size_t{5} << 20) + 4096);
  run_device_to_device(CopyMethod::kAuto);
  run_device_to_device(CopyMethod::kDmaBatch);
  run_errors(CopyMethod::kDmaBatch);
  run_errors(CopyMethod::kZeroCopyKernel);
  run_large_offsets();
  run_big_kernel_slice();
  run_concurrent(CopyMethod::kDmaBatch);
  run_concurrent(CopyMethod::kZeroCopyKernel);
  run_fallback();
  run_capture();
  run_stream_wait_capture();
  run_side_capture(CopyMethod::kAuto);
  run_side_capture(CopyMethod::kDmaBatch);
  run_legacy_stream();
  run_device_restore();
  std::printf("elapsed %.1f s\n", gpucheck::now_s() - start);
  return gpucheck::report();
}
