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
// Prints "N passed, N failed"; exits 0 with a SKIP line when no device is visible.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

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

enum class Kind { kLayerFirst, kPageFirst, kPerLayerPadded };
const char* name(Kind k) {
  return k == Kind::kLayerFirst  ? "layer-first"
         : k == Kind::kPageFirst ? "page-first"
                                 : "per-layer";
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
  CUDA_OK(cudaMalloc(&gpu, gpu_bytes));
  const auto base = reinterpret_cast<std::uintptr_t>(gpu);
  const DeviceLayout layout = make_layout(t.kind, base, t.geometry, t.gpu_pages, &gpu_bytes);
  const std::size_t page = layout.item_bytes();
  PinnedHostPool::Options popt;
  if (t.register_chunk_pages) popt.max_register_chunk = t.register_chunk_pages * page;
  auto pool = PinnedHostPool::create(std::size_t{t.host_pages} * page, page, popt);
  GPU_CHECK_MSG(pool.is_ok(), "%s", pool.status().to_string().c_str());
  if (!pool.is_ok()) return;
  if (t.register_chunk_pages)
    GPU_CHECK(pool->registrations() ==
              (t.host_pages + t.register_chunk_pages - 1) / t.register_chunk_pages);
  cudaStream_t compute, side;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));

  CudaPools pools;
  pools.gpu_kv = layout;
  pools.host_kv = pool->data();
  pools.host_pages = t.host_pages;
  pools.host_kv_chunk_bytes = pool->register_chunk_bytes();
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
  CUDA_OK(cudaMemset(gpu, kPoison, gpu_bytes));  // padding gaps stay poisoned
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

  auto t1 = engine.submit(batch_of(0, t.copies));
  GPU_CHECK(t1.is_ok());
  launch_spin(20, compute);  // the compute stream stays busy while the demotion runs
  GPU_CHECK(t1->wait() == TransferState::kDone);
  std::uint64_t bad = verify_host(layout, base, pool->data(), host_src, kSeed1);
  GPU_CHECK_MSG(bad == 0, "demotion: %llu bytes wrong", static_cast<unsigned long long>(bad));
  const auto s1 = engine.stats();
  GPU_CHECK(s1.slices == slice_count(t.copies, t.slice_pages));

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
  CUDA_OK(cudaMemsetAsync(gpu, kPoison, gpu_bytes, compute));
  std::vector<std::uint32_t> dest(t.gpu_pages);
  std::iota(dest.begin(), dest.end(), 0u);
  std::shuffle(dest.begin(), dest.end(), rng);
  // Keep one consecutive run on both sides so promotion merges too.
  std::sort(dest.begin(), dest.begin() + run);
  std::vector<int> gpu_src(t.gpu_pages, -1);
  TransferBatch up;
  up.direction = Direction::kHostToDevice;
  for (std::uint32_t i = 0; i < 2 * t.copies; ++i) {
    up.pages.push_back({GpuPageId(dest[i]), HostPageId(host_ids[i])});
    gpu_src[dest[i]] = host_src[host_ids[i]];
  }
  auto t3 = engine.submit(std::move(up));
  GPU_CHECK(t3.is_ok());
  launch_spin(20, side);  // SMs busy on another stream during the promotion
  GPU_CHECK(engine.stream_wait(t3->id(), compute).is_ok());
  std::vector<VerifySeg> vsegs;
  for (const StridedSegment& s : layout.segments)
    vsegs.push_back({s.base - base, s.item_stride, s.bytes});
  VerifySeg* dsegs = nullptr;
  int* dsrc = nullptr;
  unsigned long long* dbad = nullptr;
  CUDA_OK(cudaMalloc(&dsegs, vsegs.size() * sizeof(VerifySeg)));
  CUDA_OK(cudaMalloc(&dsrc, gpu_src.size() * sizeof(int)));
  CUDA_OK(cudaMalloc(&dbad, sizeof(unsigned long long)));
  CUDA_OK(cudaMemcpyAsync(dsegs, vsegs.data(), vsegs.size() * sizeof(VerifySeg),
                          cudaMemcpyHostToDevice, compute));
  CUDA_OK(cudaMemcpyAsync(dsrc, gpu_src.data(), gpu_src.size() * sizeof(int),
                          cudaMemcpyHostToDevice, compute));
  CUDA_OK(cudaMemsetAsync(dbad, 0, sizeof(unsigned long long), compute));
  verify_pool<<<1024, 256, 0, compute>>>(dsegs, static_cast<int>(vsegs.size()),
                                         static_cast<unsigned char*>(gpu), t.gpu_pages, dsrc,
                                         kSeed1, dbad);
  unsigned long long gpu_bad = 0;
  CUDA_OK(cudaMemcpyAsync(&gpu_bad, dbad, sizeof(gpu_bad), cudaMemcpyDeviceToHost, compute));
  CUDA_OK(cudaStreamSynchronize(compute));
  GPU_CHECK(t3->wait() == TransferState::kDone);
  GPU_CHECK_MSG(gpu_bad == 0, "promotion: %llu bytes wrong (read on the compute stream)", gpu_bad);
  GPU_CHECK(engine.stats().failed == 0);

  CUDA_OK(cudaDeviceSynchronize());
  t1->reset();
  t2->reset();
  t3->reset();
  cudaFree(dsegs);
  cudaFree(dsrc);
  cudaFree(dbad);
  created->reset();
  cudaStreamDestroy(compute);
  cudaStreamDestroy(side);
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// Snapshots: Qwen3-Next geometry (77 MB, 72 per-layer segments), cut into chunks.
void run_snapshots() {
  std::printf("[snapshots] qwen3-next, 4 GPU slots, 4 host slots, 8-page slices\n");
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
  auto host = PinnedHostPool::create(snap.item_bytes() * kSlots, snap.item_bytes());
  auto host_kv = PinnedHostPool::create(kv.page_bytes() * kPages, kv.page_bytes());
  GPU_CHECK(host.is_ok() && host_kv.is_ok());
  if (!host.is_ok() || !host_kv.is_ok()) return;
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(kvbuf), kv, kPages);
  pools.gpu_snapshots = snap;
  pools.host_kv = host_kv->data();
  pools.host_pages = kPages;
  pools.host_snapshots = host->data();
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
  t1->reset();
  t2->reset();
  engine->reset();
  cudaStreamDestroy(compute);
  cudaFree(conv);
  cudaFree(state);
  cudaFree(kvbuf);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

// Errors: invalid ids, a real CUDA error turned into a failed ticket, pageable host memory,
// an impossible pinned pool, a dropped pending ticket.
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
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(base, kv, kPages);
  pools.host_kv = host->data();
  pools.host_pages = kPages;
  CudaEngineOptions opt;
  opt.slice_pages = 4;
  opt.d2h = opt.h2d = method;
  auto engine = CudaTransferEngine::create(pools, opt);
  GPU_CHECK_MSG(engine.is_ok(), "%s", engine.status().to_string().c_str());
  if (!engine.is_ok()) return;
  CudaTransferEngine& e = **engine;
  std::memset(host->data(), kPoison, host->bytes());
  launch_fill(gpu, kv.page_bytes() * kPages, kSeed1, nullptr);

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

  // The engine keeps working; a pending ticket dropped without wait() waits in its destructor.
  std::memset(host->data(), kPoison, host->bytes());
  {
    auto dropped = e.submit(b);
    GPU_CHECK(dropped.is_ok());
  }
  for (std::uint32_t i = 0; i < 10; ++i) src[i] = static_cast<int>(i);
  GPU_CHECK(verify_host(pools.gpu_kv, base, host->data(), src, kSeed1) == 0);
  auto empty = e.submit(TransferBatch{});
  GPU_CHECK(empty.is_ok() && empty->wait() == TransferState::kDone);
  GPU_CHECK(e.poll(TicketId(999999)) == TransferState::kFailed);
  GPU_CHECK(!e.stream_wait(TicketId(999999), nullptr).is_ok());
  empty->reset();
  failed->reset();
  engine->reset();

  // Pageable host memory is refused with a clear error.
  std::vector<std::byte> pageable(kv.page_bytes() * 2);
  CudaPools bad_pools = pools;
  bad_pools.host_kv = pageable.data();
  bad_pools.host_pages = 2;
  auto refused = CudaTransferEngine::create(bad_pools, opt);
  GPU_CHECK(!refused.is_ok() && refused.status().message().find("not pinned") != std::string::npos);
  opt.slice_pages = 0;
  GPU_CHECK(!CudaTransferEngine::create(pools, opt).is_ok());
  // An impossible pool (1 PiB) fails with a message, not a crash.
  auto huge = PinnedHostPool::create(std::size_t{1} << 50, kv.page_bytes());
  GPU_CHECK(!huge.is_ok());
  if (!huge.is_ok()) std::printf("  1 PiB pool refused: %s\n", huge.status().to_string().c_str());
  cudaFree(gpu);
  std::printf("  %s\n", gpucheck::g_failed == failed_before ? "ok" : "FAILED");
}

}  // namespace

int main() {
  if (gpucheck::no_device("radixtier_gpu_transfer_tests")) return 0;
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
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
  };
  const double start = gpucheck::now_s();
  for (const RoundTrip& t : trips) run_round_trip(t, rng);
  run_snapshots();
  run_errors(CopyMethod::kDmaBatch);
  run_errors(CopyMethod::kZeroCopyKernel);
  std::printf("elapsed %.1f s\n", gpucheck::now_s() - start);
  return gpucheck::report();
}
