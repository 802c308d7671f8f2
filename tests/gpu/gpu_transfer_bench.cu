// Bandwidth and interference benchmark of the CUDA transfer engine (Qwen3-Next geometry), with
// the goals of issue 23 as GOAL lines that tests/gpu/check.sh enforces.
//
// For each piece size (a Qwen3-Next page of P / 1,024 tokens is 24 pieces of P bytes in the
// layer-first GPU pool), each direction, copy method (auto: the default, DMA, the kernel) and
// slice size, a batch of scattered pages (random GPU page -> random host page, the worst case
// for run merging) is timed from submit() to wait(), against a contiguous cudaMemcpyAsync of
// the same number of bytes between the same two pools, measured in the same run; the host
// time of submit() alone is reported too, and an untimed run after the timed ones checks the
// bytes of 32 of its pages (destinations poisoned first, on the compute stream, which the
// engine orders after). Then, for the first piece size, the latency of small batches (1-16
// pages: what time-to-first-token sees) and both directions at once; and for every piece
// size the compute stream's kernel time alone and while promotions run (the overlap goal),
// and while both directions copy (informational), with the copy GB/s reached during that
// window. The compute loads are launched as many short blocks (tens of waves), so a slowdown
// shows in proportion to the SM share the copies take, not as 0% or +100% by wave
// quantization.
//
// Issue 33 adds: the same interference measured with a full-occupancy GEMM-like kernel (16x16
// shared-memory tiles, 65,536 blocks of 256 threads: every SM busy for tens of waves), and the
// device-to-device time per Qwen3-Next snapshot (a live slot <-> 50 scattered GPU pages, the
// slot copy kernel and DMA runs) against one contiguous cudaMemcpyAsync of the same bytes,
// both timed on the GPU (events around the copy on the compute stream, which a spin keeps
// busy while the copy is submitted, so no host latency is counted).
//
// Usage: radixtier_gpu_transfer_bench [--out DIR] [--pages N] [--reps N] [--pieces B,B,...]
//                                     [--slices N,N,...]
//   --pieces: piece sizes in bytes, multiples of 1,024 (default 65536,8192);
//   --slices: slice sizes in pages (default 32,128,512; 128 is always measured: the goals).
// Writes DIR/bench.md (tables) and DIR/bench.csv; prints the tables and the GOAL lines:
//   GOAL <D2H|H2D> <P> B pieces, slice 128, auto (<what it chose>): X% of contiguous -> MET
//   GOAL overlap <P> B pieces: a promotion adds X% to a compute kernel -> MET
//   GOAL gemm-overlap <P> B pieces: promotions add X% to a full-occupancy GEMM-like kernel -> MET
//   GOAL D2D snapshot copy (qwen3-next, slot copy kernel): X times a contiguous ... -> MET
// ("NOT MET" otherwise). Exit status 1 when a byte check failed or a run failed; the goals
// are enforced by check.sh.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpu_common.cuh"
#include "radixtier/cuda/cuda_transfer_engine.hpp"
#include "radixtier/cuda/pinned_host_pool.hpp"

using namespace radixtier;
using namespace radixtier::cuda;

namespace {

constexpr double kBandwidthGoal = 90.0;  // % of a contiguous cudaMemcpyAsync
constexpr double kOverlapGoal = 10.0;    // % a promotion may add to a compute kernel
constexpr double kD2dGoal = 1.5;         // D2D snapshot copy: times a contiguous cudaMemcpyAsync

// A GEMM-like load that fills every SM: C = A * B (n x n floats), 16x16 shared-memory tiles,
// one 256-thread block per tile of C: (n / 16)^2 blocks, tens of waves at n = 4,096.
__global__ void gemm_tiled(const float* a, const float* b, float* c, int n) {
  __shared__ float as[16][16], bs[16][16];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * 16 + ty, col = blockIdx.x * 16 + tx;
  float acc = 0.0f;
  for (int t = 0; t < n; t += 16) {
    as[ty][tx] = a[static_cast<std::size_t>(row) * n + t + tx];
    bs[ty][tx] = b[static_cast<std::size_t>(t + ty) * n + col];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 16; ++k) acc = fmaf(as[ty][k], bs[k][tx], acc);
    __syncthreads();
  }
  c[static_cast<std::size_t>(row) * n + col] = acc;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::size_t> parse_list(const std::string& s) {
  std::vector<std::size_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::stoul(item));
  }
  return out;
}

const char* dir_name(Direction d) {
  return d == Direction::kDeviceToHost ? "D2H" : d == Direction::kHostToDevice ? "H2D" : "D2D";
}

struct Bench {
  KvGeometry kv = KvGeometry::qwen3_next();
  std::uint32_t pool_pages = 4096;
  std::uint32_t pages = 2048;  // per timed batch
  int reps = 5;
  void* gpu = nullptr;
  std::size_t page = 0;
  PinnedHostPool host;
  cudaStream_t compute = nullptr;
  std::mt19937 rng{7};

  CudaPools pools() const {
    CudaPools p;
    p.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(gpu), kv, pool_pages);
    p.host_kv_pool = &host;
    p.host_pages = pool_pages;
    return p;
  }

  TransferBatch scattered(Direction dir, std::uint32_t n) {
    std::vector<std::uint32_t> g(pool_pages), h(pool_pages);
    std::iota(g.begin(), g.end(), 0u);
    std::iota(h.begin(), h.end(), 0u);
    std::shuffle(g.begin(), g.end(), rng);
    std::shuffle(h.begin(), h.end(), rng);
    TransferBatch b;
    b.direction = dir;
    for (std::uint32_t i = 0; i < n; ++i) b.pages.push_back({GpuPageId(g[i]), HostPageId(h[i])});
    return b;
  }

  // Seconds of one contiguous cudaMemcpyAsync of `bytes` (median of `n` after a warm-up).
  double contiguous(Direction dir, std::size_t bytes, int n) {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<double> t;
    for (int r = 0; r < n + 1; ++r) {
      const double t0 = gpucheck::now_s();
      if (dir == Direction::kDeviceToHost)
        CUDA_OK(cudaMemcpyAsync(host.data(), gpu, bytes, cudaMemcpyDeviceToHost, s));
      else
        CUDA_OK(cudaMemcpyAsync(gpu, host.data(), bytes, cudaMemcpyHostToDevice, s));
      CUDA_OK(cudaStreamSynchronize(s));
      if (r > 0) t.push_back(gpucheck::now_s() - t0);  // the first run warms up
    }
    cudaStreamDestroy(s);
    return median(t);
  }

  struct Timing {
    double seconds = 0;   // submit() to wait(), median
    double submit_s = 0;  // submit() alone, median
  };
  // Timing of batches of n scattered pages (median of reps_here after a warm-up).
  Timing engine_time(CudaTransferEngine& e, Direction dir, std::uint32_t n, int reps_here) {
    std::vector<double> t, ts;
    for (int r = 0; r < reps_here + 1; ++r) {
      TransferBatch b = scattered(dir, n);
      const double t0 = gpucheck::now_s();
      auto ticket = e.submit(std::move(b));
      const double t1 = gpucheck::now_s();
      if (!ticket.is_ok() || ticket->wait() != TransferState::kDone) {
        std::printf("FATAL: benchmark transfer failed: %s %s\n",
                    ticket.status().to_string().c_str(), e.stats().last_error.c_str());
        std::exit(1);
      }
      if (r > 0) {
        t.push_back(gpucheck::now_s() - t0);
        ts.push_back(t1 - t0);
      }
    }
    return {median(t), median(ts)};
  }

  // An untimed run of n scattered pages whose first 32 destinations are poisoned first:
  // returns how many bytes of those 32 pages differ from their source afterwards. GPU pages
  // are poisoned on the compute stream, which the engine orders a promotion after (a
  // cudaMemset on the legacy stream would not be ordered before the non-blocking copy
  // stream, and could land after the copy), and the poison is finished before submit().
  std::uint64_t verified_run(CudaTransferEngine& e, Direction dir, std::uint32_t n) {
    TransferBatch b = scattered(dir, n);
    const std::size_t sample = std::min<std::size_t>(32, b.pages.size());
    const std::size_t chunk = kv.chunk_bytes(), chunks = 2 * std::size_t{kv.layers};
    auto* g = static_cast<unsigned char*>(gpu);
    for (std::size_t i = 0; i < sample; ++i) {
      const PageCopy& p = b.pages[i];
      if (dir == Direction::kDeviceToHost) {
        std::memset(host.data() + std::size_t{p.host.value()} * page, 0xDB, page);
      } else {
        for (std::size_t c = 0; c < chunks; ++c)
          CUDA_OK(
              cudaMemsetAsync(g + (c * pool_pages + p.gpu.value()) * chunk, 0xDB, chunk, compute));
      }
    }
    CUDA_OK(cudaStreamSynchronize(compute));
    auto ticket = e.submit(b);
    if (!ticket.is_ok() || ticket->wait() != TransferState::kDone) return page * sample;
    std::vector<unsigned char> dev(page);
    std::uint64_t bad = 0;
    for (std::size_t i = 0; i < sample; ++i) {
      const PageCopy& p = b.pages[i];
      for (std::size_t c = 0; c < chunks; ++c)
        CUDA_OK(cudaMemcpy(dev.data() + c * chunk, g + (c * pool_pages + p.gpu.value()) * chunk,
                           chunk, cudaMemcpyDeviceToHost));
      const auto* h =
          reinterpret_cast<const unsigned char*>(host.data()) + std::size_t{p.host.value()} * page;
      for (std::size_t x = 0; x < page; ++x) bad += dev[x] != h[x];
    }
    return bad;
  }

  std::unique_ptr<CudaTransferEngine> engine(std::size_t slice, CopyMethod method,
                                             bool overlap = false) {
    CudaEngineOptions opt;
    opt.slice_pages = slice;
    opt.d2h = opt.h2d = method;
    opt.compute_stream = compute;
    // Interference runs: the copies must not wait for the kernels being measured.
    opt.demote_after_compute = opt.promote_after_compute = !overlap;
    auto e = CudaTransferEngine::create(pools(), opt);
    if (!e.is_ok()) {
      std::printf("FATAL: %s\n", e.status().to_string().c_str());
      std::exit(1);
    }
    return std::move(e).value();
  }
};

// What kAuto chose in an engine's life so far.
std::string auto_choice(const CudaEngineStats& s) {
  if (s.auto_kernel_slices > 0 && s.auto_dma_slices == 0) return "kernel";
  if (s.auto_dma_slices > 0 && s.auto_kernel_slices == 0) return "dma";
  return "mixed";
}

// Device to device (issue 33): a Qwen3-Next snapshot between a live slot and 50 scattered GPU
// pages, materialize (slot -> pages) and resume (pages -> slot), with the slot copy kernel
// (the default) and with DMA runs, against one contiguous cudaMemcpyAsync of the snapshot's
// bytes. GPU time: events on the compute stream around the copy; a spin keeps that stream busy
// while the batch is submitted and the stream is made to wait for it (stream_wait), so the
// feeder's and the host's latency are not counted, only the copy. Returns wrong bytes of a
// checked round trip (slot 1 -> pages -> slot 2 with the kernel).
std::uint64_t bench_d2d(int reps, std::ostringstream& md, std::ostringstream& csv,
                        std::ostringstream& goals) {
  const GdnGeometry g = GdnGeometry::qwen3_next();
  const KvGeometry kv = KvGeometry::qwen3_next();
  constexpr std::uint32_t kSlots = 3, kPages = 128;
  const std::size_t snap = g.snapshot_bytes(), page = kv.page_bytes();
  void *conv = nullptr, *state = nullptr, *kvbuf = nullptr, *flat_a = nullptr, *flat_b = nullptr;
  CUDA_OK(cudaMalloc(&conv, g.conv_bytes() * g.layers * kSlots));
  CUDA_OK(cudaMalloc(&state, g.state_bytes() * g.layers * kSlots));
  CUDA_OK(cudaMalloc(&kvbuf, page * kPages));
  CUDA_OK(cudaMalloc(&flat_a, snap));
  CUDA_OK(cudaMalloc(&flat_b, snap));
  gpucheck::launch_fill(conv, g.conv_bytes() * g.layers * kSlots, 0x5EED0003, nullptr);
  gpucheck::launch_fill(state, g.state_bytes() * g.layers * kSlots, 0x5EED0004, nullptr);
  gpucheck::launch_fill(flat_a, snap, 0x5EED0005, nullptr);
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaDeviceSynchronize());
  CudaPools pools;
  pools.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(kvbuf), kv, kPages);
  pools.gpu_snapshots = snapshot_layer_first(reinterpret_cast<std::uintptr_t>(conv),
                                             reinterpret_cast<std::uintptr_t>(state), g, kSlots);
  const std::uint32_t pieces = static_cast<std::uint32_t>((snap + page - 1) / page);
  auto batch = [&](std::uint32_t slot, bool to_slot) {
    TransferBatch b;
    b.direction = Direction::kDeviceToDevice;
    for (std::uint32_t k = 0; k < pieces; ++k)  // 37 is prime to 128: scattered pages
      b.slot_pieces.push_back(
          {GpuSlotId(slot), std::size_t{k} * page, GpuPageId((k * 37 + 3) % kPages), to_slot});
    return b;
  };
  const int n = std::max(reps, 20);
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  // GPU milliseconds of `enqueue` (which orders its copy after `start` on the compute stream
  // and makes the compute stream wait for it; its tickets are kept until `stop` is recorded,
  // since a ticket's destructor waits on the host), median of n after a warm-up.
  std::vector<Ticket> keep;
  auto gpu_ms = [&](const std::function<bool()>& enqueue) {
    std::vector<double> ms;
    for (int r = 0; r < n + 1; ++r) {
      gpucheck::launch_spin(1.0, compute);
      CUDA_OK(cudaEventRecord(start, compute));
      if (!enqueue()) return -1.0;
      CUDA_OK(cudaEventRecord(stop, compute));
      CUDA_OK(cudaStreamSynchronize(compute));
      for (Ticket& t : keep) {
        if (t.wait() != TransferState::kDone) return -1.0;
      }
      keep.clear();
      float x = 0;
      CUDA_OK(cudaEventElapsedTime(&x, start, stop));
      if (r > 0) ms.push_back(x);
    }
    return median(ms);
  };
  const double contiguous = gpu_ms([&] {
    return cudaMemcpyAsync(flat_b, flat_a, snap, cudaMemcpyDeviceToDevice, compute) == cudaSuccess;
  });
  md << "## Device to device: one Qwen3-Next snapshot (" << snap << " B, " << pieces
     << " pieces of " << page << " B pages)\n\nGPU time, median of " << n
     << ". Contiguous cudaMemcpyAsync of the same bytes: " << 1e3 * contiguous << " us ("
     << snap / contiguous / 1e6 << " GB/s).\n\n| method | copy | us | GB/s | x contiguous | "
     << "launches or runs |\n|---|---|---|---|---|---|\n";
  double kernel_worst = 0;
  std::uint64_t wrong = 0;
  for (CopyMethod method : {CopyMethod::kAuto, CopyMethod::kDmaBatch}) {
    CudaEngineOptions opt;
    opt.compute_stream = compute;
    opt.d2d = method;
    auto e = CudaTransferEngine::create(pools, opt);
    if (!e.is_ok()) {
      std::printf("FATAL: %s\n", e.status().to_string().c_str());
      std::exit(1);
    }
    for (bool to_slot : {false, true}) {
      const double ms = gpu_ms([&] {
        auto t = (*e)->submit(batch(to_slot ? 2 : 1, to_slot));
        if (!t.is_ok()) return false;
        if (!(*e)->stream_wait(t->id(), compute).is_ok()) return false;
        keep.push_back(std::move(*t));
        return true;
      });
      if (ms < 0) {
        std::printf("FATAL: device-to-device copy failed: %s\n", (*e)->stats().last_error.c_str());
        std::exit(1);
      }
      const CudaEngineStats st = (*e)->stats();
      const double ratio = ms / contiguous;
      const bool kernel = method == CopyMethod::kAuto && !st.kernel_fallback;
      if (method == CopyMethod::kAuto) kernel_worst = std::max(kernel_worst, ratio);
      md << "| " << (kernel ? "slot copy kernel" : "dma runs") << " | "
         << (to_slot ? "resume (pages -> slot)" : "materialize (slot -> pages)") << " | "
         << 1e3 * ms << " | " << snap / ms / 1e6 << " | " << ratio << " | "
         << (kernel ? st.d2d_launches : st.d2d_dma_runs) << " |\n";
      csv << "d2d," << (to_slot ? "resume" : "materialize") << ',' << to_string(method) << ",,"
          << ms / 1e3 << ',' << snap / ms / 1e6 << ',' << snap / contiguous / 1e6 << ','
          << 100.0 / ratio << ",,\n";
    }
    if (method == CopyMethod::kAuto) {  // a checked round trip: slot 1 -> pages -> slot 0
      auto down = (*e)->submit(batch(1, false));
      bool ok = down.is_ok() && down->wait() == TransferState::kDone;
      TransferBatch up = batch(0, true);
      auto t = (*e)->submit(up);
      ok = ok && t.is_ok() && t->wait() == TransferState::kDone;
      if (!ok) wrong += snap;
      for (const StridedSegment& s : pools.gpu_snapshots.segments) {
        std::vector<unsigned char> a(s.bytes), b(s.bytes);
        CUDA_OK(cudaMemcpy(a.data(), reinterpret_cast<void*>(s.base + 1 * s.item_stride), s.bytes,
                           cudaMemcpyDeviceToHost));
        CUDA_OK(
            cudaMemcpy(b.data(), reinterpret_cast<void*>(s.base), s.bytes, cudaMemcpyDeviceToHost));
        for (std::size_t x = 0; x < s.bytes; ++x) wrong += a[x] != b[x];
      }
      if ((*e)->stats().kernel_fallback)
        md << "\n(kernel fallback: " << (*e)->stats().kernel_fallback_reason << ")\n";
    }
  }
  md << "\nRound trip slot 1 -> pages -> slot 0 with the kernel: "
     << (wrong == 0 ? std::string("every byte ok") : std::to_string(wrong) + " bytes WRONG")
     << ".\n\n";
  goals << "GOAL D2D snapshot copy (qwen3-next, slot copy kernel): " << kernel_worst
        << " times a contiguous cudaMemcpyAsync of the same bytes -> "
        << (kernel_worst <= kD2dGoal && wrong == 0 ? "MET" : "NOT MET") << " (goal <= " << kD2dGoal
        << "x)\n";
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(compute);
  cudaFree(conv);
  cudaFree(state);
  cudaFree(kvbuf);
  cudaFree(flat_a);
  cudaFree(flat_b);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  switch (gpucheck::check_device("radixtier_gpu_transfer_bench")) {
    case gpucheck::DeviceCheck::kRun:
      break;
    case gpucheck::DeviceCheck::kSkip:
      return 0;
    case gpucheck::DeviceCheck::kFail:
      return 1;
  }
  std::string out;
  std::uint32_t pages = 2048;
  int reps = 5;
  std::vector<std::size_t> pieces = {65536, 8192}, slices = {32, 128, 512};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--out") {
      out = argv[i + 1];
    } else if (a == "--pages") {
      pages = static_cast<std::uint32_t>(std::stoul(argv[i + 1]));
    } else if (a == "--reps") {
      reps = std::max(1, std::stoi(argv[i + 1]));
    } else if (a == "--pieces") {
      pieces = parse_list(argv[i + 1]);
    } else if (a == "--slices") {
      slices = parse_list(argv[i + 1]);
    } else {
      std::printf("unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (std::find(slices.begin(), slices.end(), std::size_t{128}) == slices.end())
    slices.push_back(128);
  for (std::size_t p : pieces) {
    if (p == 0 || p % 1024 != 0) {
      std::printf("--pieces: %zu is not a positive multiple of 1,024 bytes\n", p);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::ostringstream md, csv, goals;
  md << "# radixtier CUDA transfer engine benchmark\n\n"
     << "Device: " << prop.name << " (" << prop.multiProcessorCount << " SMs). Geometry: "
     << "Qwen3-Next (12 attention layers, 2 KV heads x 256, bf16); a page of P / 1,024 tokens "
     << "is 24 pieces of P bytes in the layer-first GPU pool [2, layers, pages, ...], one "
     << "contiguous page in the page-first pinned pool. Each timed batch: " << pages
     << " scattered pages, submit() to wait(), median of " << reps
     << " runs after a warm-up, against a contiguous cudaMemcpyAsync of the same bytes in the "
        "same run.\n\n";
  csv << "piece_bytes,direction,method,slice_pages,seconds,gbps,contiguous_gbps,percent,"
         "submit_seconds,wrong_bytes\n";
  std::uint64_t wrong_total = 0;
  bool first_size = true;
  for (std::size_t piece : pieces) {
    Bench b;
    b.kv = KvGeometry::qwen3_next(static_cast<std::uint32_t>(piece / 1024));
    b.pages = pages;
    b.reps = reps;
    b.pool_pages = std::max<std::uint32_t>(2 * pages, 1024);
    b.page = b.kv.page_bytes();
    CUDA_OK(cudaMalloc(&b.gpu, b.page * b.pool_pages));
    gpucheck::launch_fill(b.gpu, b.page * b.pool_pages, 0x5EED0001, nullptr);
    CUDA_OK(cudaStreamCreateWithFlags(&b.compute, cudaStreamNonBlocking));
    const double pin0 = gpucheck::now_s();
    auto host = PinnedHostPool::create(b.page * b.pool_pages, b.page);
    if (!host.is_ok()) {
      std::printf("FATAL: %s\n", host.status().to_string().c_str());
      return 1;
    }
    b.host = std::move(host).value();
    const double pin_s = gpucheck::now_s() - pin0;
    {  // pattern 0x5EED0002 by host offset, a word at a time
      auto* w = reinterpret_cast<std::uint64_t*>(b.host.data());
      for (std::size_t i = 0; i < b.host.bytes() / 8; ++i)
        w[i] = gpucheck::mix64(0x5EED0002ull ^ i * 0x2545F4914F6CDD1Dull);
    }
    CUDA_OK(cudaDeviceSynchronize());
    const double gb = static_cast<double>(b.page) * b.pages / 1e9;
    const double contig[2] = {b.contiguous(Direction::kDeviceToHost, b.page * b.pages, b.reps),
                              b.contiguous(Direction::kHostToDevice, b.page * b.pages, b.reps)};
    md << "## " << piece << " B pieces (" << b.kv.page_size << "-token pages of " << b.page
       << " B)\n\nPools: " << b.pool_pages << " pages on each side; pinned in "
       << b.host.registrations() << " registration(s) in " << pin_s << " s. Contiguous "
       << "cudaMemcpyAsync of " << gb << " GB: D2H " << gb / contig[0] << " GB/s, H2D "
       << gb / contig[1] << " GB/s.\n\n"
       << "| direction | method | slice pages | GB/s | % of contiguous | submit() ms | bytes "
          "checked |\n|---|---|---|---|---|---|---|\n";
    for (int d = 0; d < 2; ++d) {
      const Direction dir = d == 0 ? Direction::kDeviceToHost : Direction::kHostToDevice;
      for (CopyMethod method :
           {CopyMethod::kAuto, CopyMethod::kDmaBatch, CopyMethod::kZeroCopyKernel}) {
        for (std::size_t slice : slices) {
          auto e = b.engine(slice, method);
          const Bench::Timing tm = b.engine_time(*e, dir, b.pages, b.reps);
          const std::uint64_t wrong = b.verified_run(*e, dir, b.pages);
          wrong_total += wrong;
          const double pct = 100.0 * contig[d] / tm.seconds;
          std::string name = to_string(method);
          if (method == CopyMethod::kAuto) name += " (" + auto_choice(e->stats()) + ")";
          const CudaEngineStats st = e->stats();
          if (st.kernel_fallback) name += " [kernel fallback: DMA]";
          md << "| " << dir_name(dir) << " | " << name << " | " << slice << " | " << gb / tm.seconds
             << " | " << pct << " | " << 1e3 * tm.submit_s << " | "
             << (wrong == 0 ? std::string("ok") : std::to_string(wrong) + " B WRONG") << " |\n";
          csv << piece << ',' << dir_name(dir) << ',' << to_string(method) << ',' << slice << ','
              << tm.seconds << ',' << gb / tm.seconds << ',' << gb / contig[d] << ',' << pct << ','
              << tm.submit_s << ',' << wrong << '\n';
          if (method == CopyMethod::kAuto && slice == 128) {
            goals << "GOAL " << dir_name(dir) << ' ' << piece << " B pieces, slice 128, auto ("
                  << auto_choice(st) << "): " << pct << "% of contiguous -> "
                  << (pct >= kBandwidthGoal && wrong == 0 ? "MET" : "NOT MET")
                  << " (goal >= " << kBandwidthGoal << "%)\n";
          }
        }
      }
    }

    if (first_size) {
      // Latency of small batches (what a short prefix's time-to-first-token sees).
      md << "\n### Small batches: submit() to wait() latency (slice 128, median of 50)\n\n"
            "| pages | D2H auto us | D2H dma-batch us | H2D auto us | H2D dma-batch us | "
            "contiguous D2H us | contiguous H2D us |\n|---|---|---|---|---|---|---|\n";
      auto au = b.engine(128, CopyMethod::kAuto);
      auto dma = b.engine(128, CopyMethod::kDmaBatch);
      for (std::uint32_t n : {1u, 2u, 4u, 8u, 16u}) {
        md << "| " << n;
        for (Direction dir : {Direction::kDeviceToHost, Direction::kHostToDevice})
          for (CudaTransferEngine* e : {au.get(), dma.get()})
            md << " | " << 1e6 * b.engine_time(*e, dir, n, 50).seconds;
        md << " | " << 1e6 * b.contiguous(Direction::kDeviceToHost, b.page * n, 50) << " | "
           << 1e6 * b.contiguous(Direction::kHostToDevice, b.page * n, 50) << " |\n";
      }
      for (CudaTransferEngine* e : {au.get(), dma.get()})
        for (Direction dir : {Direction::kDeviceToHost, Direction::kHostToDevice})
          wrong_total += b.verified_run(*e, dir, 16);

      // Both directions at once (slice 128): each direction's share.
      md << "\n### Both directions at once (slice 128)\n\n| method | D2H GB/s | H2D GB/s | sum "
            "GB/s |\n|---|---|---|---|\n";
      for (CopyMethod method : {CopyMethod::kAuto, CopyMethod::kDmaBatch}) {
        auto e = b.engine(128, method);
        const std::uint32_t half = b.pool_pages / 2;
        TransferBatch down, up;
        up.direction = Direction::kHostToDevice;
        for (std::uint32_t i = 0; i < half; ++i) {  // disjoint halves of both pools
          down.pages.push_back({GpuPageId((i * 7919) % half), HostPageId(i)});
          up.pages.push_back({GpuPageId(half + (i * 104729) % half), HostPageId(half + i)});
        }
        const double t0 = gpucheck::now_s();
        auto td = e->submit(down);
        auto tu = e->submit(up);
        if (!td.is_ok() || !tu.is_ok()) return 1;
        const bool ok_down = td->wait() == TransferState::kDone;
        const double t_down = gpucheck::now_s() - t0;
        const bool ok_up = tu->wait() == TransferState::kDone;
        const double t_up = gpucheck::now_s() - t0;
        if (!ok_down || !ok_up) wrong_total += 1;
        const double gbh = static_cast<double>(b.page) * half / 1e9;
        md << "| " << to_string(method) << " | " << gbh / t_down << " | " << gbh / t_up << " | "
           << 2 * gbh / std::max(t_down, t_up) << " |\n";
      }
    }

    // Interference: compute-stream kernel time alone and while a host thread keeps copying
    // 512-page batches (promotions only: the overlap goal; both directions: informational),
    // with the copy GB/s reached in that window.
    md << "\n### Compute-stream kernel time while copies run (slice 128)\n\n"
          "Copy GB/s: bytes of the batches finished while the kernels ran, over that time.\n\n"
          "| kernel | copies | method | alone ms | during copies ms | growth % | copy GB/s in "
          "window |\n|---|---|---|---|---|---|---|\n";
    float* sink = nullptr;
    float *src = nullptr, *dst = nullptr;
    const std::uint64_t n = std::uint64_t{256} << 20;  // 1 GiB of floats per buffer
    CUDA_OK(cudaMalloc(&sink, 1024 * sizeof(float)));
    CUDA_OK(cudaMalloc(&src, n * sizeof(float)));
    CUDA_OK(cudaMalloc(&dst, n * sizeof(float)));
    CUDA_OK(cudaMemset(src, 0, n * sizeof(float)));
    CUDA_OK(cudaDeviceSynchronize());
    constexpr int kGemmN = 4096;
    float *gemm_a = nullptr, *gemm_b = nullptr, *gemm_c = nullptr;
    const std::size_t gemm_bytes = std::size_t{kGemmN} * kGemmN * sizeof(float);
    CUDA_OK(cudaMalloc(&gemm_a, gemm_bytes));
    CUDA_OK(cudaMalloc(&gemm_b, gemm_bytes));
    CUDA_OK(cudaMalloc(&gemm_c, gemm_bytes));
    CUDA_OK(cudaMemset(gemm_a, 0, gemm_bytes));
    CUDA_OK(cudaMemset(gemm_b, 0, gemm_bytes));
    CUDA_OK(cudaDeviceSynchronize());
    const unsigned fma_blocks = static_cast<unsigned>(prop.multiProcessorCount) * 200;
    const unsigned stream_blocks = static_cast<unsigned>((n / 4 + 255) / 256);
    auto kernel_ms = [&](int which, int count) {
      std::vector<cudaEvent_t> ev(count + 1);
      for (auto& x : ev) CUDA_OK(cudaEventCreate(&x));
      CUDA_OK(cudaEventRecord(ev[0], b.compute));
      for (int i = 0; i < count; ++i) {
        if (which == 0)
          gpucheck::busy_fma<<<fma_blocks, 256, 0, b.compute>>>(sink, 100000);
        else if (which == 1)
          gpucheck::busy_stream<<<stream_blocks, 256, 0, b.compute>>>(dst, src, n);
        else
          gemm_tiled<<<dim3(kGemmN / 16, kGemmN / 16), dim3(16, 16), 0, b.compute>>>(
              gemm_a, gemm_b, gemm_c, kGemmN);
        CUDA_OK(cudaEventRecord(ev[i + 1], b.compute));
      }
      CUDA_OK(cudaStreamSynchronize(b.compute));
      std::vector<double> ms;
      for (int i = 0; i < count; ++i) {
        float x = 0;
        CUDA_OK(cudaEventElapsedTime(&x, ev[i], ev[i + 1]));
        ms.push_back(x);
      }
      for (auto& x : ev) cudaEventDestroy(x);
      return median(ms);
    };
    const int counts[3] = {15, 100, 10};
    double worst_promotion = 0, gemm_promotion = 0;
    for (int which = 0; which < 3; ++which) {
      kernel_ms(which, 3);  // warm-up
      const double alone = kernel_ms(which, counts[which]);
      for (int both = 0; both < 2; ++both) {
        for (CopyMethod method : {CopyMethod::kAuto, CopyMethod::kDmaBatch}) {
          if (both == 0 && method != CopyMethod::kAuto) continue;  // the goal: the default
          auto e = b.engine(128, method, /*overlap=*/true);
          const std::uint32_t half = b.pool_pages / 2, batch = std::min<std::uint32_t>(512, half);
          std::atomic<bool> stop{false}, failed{false};
          std::atomic<std::uint64_t> bytes{0};
          std::thread copier([&] {
            for (std::uint32_t r = 0; !stop.load(); ++r) {
              TransferBatch down, up;
              down.direction = Direction::kDeviceToHost;
              up.direction = Direction::kHostToDevice;
              const std::uint32_t off = (r * batch) % half;
              for (std::uint32_t i = 0; i < batch; ++i) {
                const std::uint32_t k = (off + i) % half;
                down.pages.push_back({GpuPageId(k), HostPageId(half + (k * 7) % half)});
                up.pages.push_back({GpuPageId(half + k), HostPageId((k * 11) % half)});
              }
              auto tu = e->submit(up);
              std::optional<Result<Ticket>> td;
              if (both) td = e->submit(down);
              bool ok = tu.is_ok() && tu->wait() == TransferState::kDone;
              if (td) ok = ok && td->is_ok() && (*td)->wait() == TransferState::kDone;
              if (!ok) {
                failed = true;
                break;
              }
              bytes += (both ? 2 : 1) * std::uint64_t{batch} * b.page;
            }
          });
          while (bytes.load() == 0 && !failed.load()) std::this_thread::yield();  // copies run
          const std::uint64_t bytes0 = bytes.load();
          const double w0 = gpucheck::now_s();
          const double during = kernel_ms(which, counts[which]);
          const std::uint64_t bytes1 = bytes.load();
          const double w1 = gpucheck::now_s();
          stop = true;
          copier.join();
          const double gbps = static_cast<double>(bytes1 - bytes0) / 1e9 / (w1 - w0);
          const double growth = 100.0 * (during - alone) / alone;
          if (!both && which < 2) worst_promotion = std::max(worst_promotion, growth);
          if (!both && which == 2) gemm_promotion = growth;
          md << "| "
             << (which == 0   ? "fma (compute-bound)"
                 : which == 1 ? "stream (HBM-bound)"
                              : "gemm (full occupancy)")
             << " | " << (both ? "both directions" : "promotions") << " | " << to_string(method)
             << " | " << alone << " | " << during << " | " << growth << " | " << gbps
             << (failed ? " (a copy FAILED)" : "") << " |\n";
          if (failed) wrong_total += 1;
        }
      }
    }
    goals << "GOAL overlap " << piece << " B pieces: promotions add " << worst_promotion
          << "% to a compute kernel (worst of fma and stream) -> "
          << (worst_promotion <= kOverlapGoal ? "MET" : "NOT MET") << " (goal <= " << kOverlapGoal
          << "%)\n";
    goals << "GOAL gemm-overlap " << piece << " B pieces: promotions add " << gemm_promotion
          << "% to a full-occupancy GEMM-like kernel -> "
          << (gemm_promotion <= kOverlapGoal ? "MET" : "NOT MET") << " (goal <= " << kOverlapGoal
          << "%)\n";
    cudaFree(gemm_a);
    cudaFree(gemm_b);
    cudaFree(gemm_c);
    cudaFree(sink);
    cudaFree(src);
    cudaFree(dst);
    b.host.reset();
    cudaStreamDestroy(b.compute);
    cudaFree(b.gpu);
    md << "\n";
    first_size = false;
  }
  wrong_total += bench_d2d(reps, md, csv, goals);
  md << "Byte checks (32 poisoned destination pages of an untimed run per configuration): "
     << (wrong_total == 0 ? "all ok" : std::to_string(wrong_total) + " bytes WRONG") << ".\n";
  md << "\n## Goals\n\n```\n" << goals.str() << "```\n";
  std::printf("%s", md.str().c_str());
  if (!out.empty()) {
    std::ofstream(out + "/bench.md") << md.str();
    std::ofstream(out + "/bench.csv") << csv.str();
  }
  return wrong_total == 0 ? 0 : 1;
}
