// Bandwidth and interference benchmark of the CUDA transfer engine (Qwen3-Next geometry).
//
// For each direction, copy method and slice size, a batch of scattered pages (random GPU page
// -> random host page, the worst case for run merging) is timed from submit() to wait(),
// against a contiguous cudaMemcpyAsync of the same number of bytes between the same two
// pools, measured in the same run; the host time of submit() alone is reported too, and an
// untimed run after the timed ones checks the bytes of 32 of its pages (destinations
// poisoned first). Then the latency of small batches (1-16 pages: what time-to-first-token
// sees), both directions at once, and the compute stream's kernel time alone and while
// copies run in both directions, with the copy GB/s reached during that window. The compute
// loads are launched as many short blocks (tens of waves), so a slowdown shows in proportion
// to the SM share the copies take, not as 0% or +100% by wave quantization.
//
// Usage: radixtier_gpu_transfer_bench [--out DIR] [--pages N] [--reps N]
// Writes DIR/bench.md (tables) and DIR/bench.csv; prints the tables and GOAL lines.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <numeric>
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
  std::ostringstream md, csv;

  CudaPools pools() const {
    CudaPools p;
    p.gpu_kv = kv_layer_first(reinterpret_cast<std::uintptr_t>(gpu), kv, pool_pages);
    p.host_kv = host.data();
    p.host_pages = pool_pages;
    p.host_kv_chunk_bytes = host.register_chunk_bytes();
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

  // Seconds of one contiguous cudaMemcpyAsync of `bytes` (median of reps).
  double contiguous(Direction dir, std::size_t bytes) {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<double> t;
    for (int r = 0; r < reps + 1; ++r) {
      const double t0 = gpucheck::now_s();
      if (dir == Direction::kDeviceToHost)
        CUDA_OK(cudaMemcpyAsync(host.data(), gpu, bytes, cudaMemcpyDeviceToHost, s));
      else
        CUDA_OK(cudaMemcpyAsync(gpu, host.data(), bytes, cudaMemcpyHostToDevice, s));
      CUDA_OK(cudaStreamSynchronize(s));
      if (r > 0) t.push_back(gpucheck::now_s() - t0);  // first run warms up
    }
    cudaStreamDestroy(s);
    return median(t);
  }

  struct Timing {
    double seconds = 0;   // submit() to wait(), median
    double submit_s = 0;  // submit() alone, median
  };
  // Timing of batches of n scattered pages (median of reps after a warm-up).
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
  // returns how many bytes of those 32 pages differ from their source afterwards.
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
          CUDA_OK(cudaMemset(g + (c * pool_pages + p.gpu.value()) * chunk, 0xDB, chunk));
      }
    }
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

  std::unique_ptr<CudaTransferEngine> engine(std::size_t slice, CopyMethod method) {
    CudaEngineOptions opt;
    opt.slice_pages = slice;
    opt.d2h = opt.h2d = method;
    opt.compute_stream = compute;
    auto e = CudaTransferEngine::create(pools(), opt);
    if (!e.is_ok()) {
      std::printf("FATAL: %s\n", e.status().to_string().c_str());
      std::exit(1);
    }
    return std::move(e).value();
  }
};

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
  Bench b;
  std::string out;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--out")
      out = argv[i + 1];
    else if (a == "--pages")
      b.pages = static_cast<std::uint32_t>(std::stoul(argv[i + 1]));
    else if (a == "--reps")
      b.reps = std::stoi(argv[i + 1]);
  }
  b.pool_pages = std::max(b.pool_pages, b.pages);
  b.page = b.kv.page_bytes();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
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
  {  // pattern 0x5EED0002 by host offset, a word at a time (the same bytes as pattern_byte)
    auto* w = reinterpret_cast<std::uint64_t*>(b.host.data());
    for (std::size_t i = 0; i < b.host.bytes() / 8; ++i)
      w[i] = gpucheck::mix64(0x5EED0002ull ^ i * 0x2545F4914F6CDD1Dull);
  }
  CUDA_OK(cudaDeviceSynchronize());
  const double gb = static_cast<double>(b.page) * b.pages / 1e9;

  b.md << "# radixtier CUDA transfer engine benchmark\n\n"
       << "Device: " << prop.name << " (" << prop.multiProcessorCount << " SMs). Geometry: "
       << "Qwen3-Next (12 attention layers, 2 KV heads x 256, bf16, 64-token pages): " << b.page
       << " B per page in 24 chunks of " << b.kv.chunk_bytes() << " B.\n"
       << "GPU pool: layer-first [2, layers, pages, ...], " << b.pool_pages << " pages. Host pool: "
       << "page-first, pinned in " << b.host.registrations() << " registration(s), pinned in "
       << pin_s << " s.\nEach timed batch: " << b.pages << " scattered pages (" << gb
       << " GB), submit() to wait(), median of " << b.reps << " runs after a warm-up.\n\n";
  b.csv << "direction,method,slice_pages,seconds,gbps,contiguous_gbps,percent,submit_seconds,"
           "wrong_bytes\n";

  const double contig[2] = {b.contiguous(Direction::kDeviceToHost, b.page * b.pages),
                            b.contiguous(Direction::kHostToDevice, b.page * b.pages)};
  b.md << "Contiguous cudaMemcpyAsync of the same bytes: D2H " << gb / contig[0] << " GB/s, H2D "
       << gb / contig[1] << " GB/s.\n\n"
       << "| direction | method | slice pages | GB/s | % of contiguous | submit() ms | bytes "
          "checked |\n|---|---|---|---|---|---|---|\n";
  double at128[2][2] = {};  // [dir][method]
  std::uint64_t wrong_total = 0;
  const std::size_t slices[] = {16, 32, 64, 128, 256, 512};
  for (int d = 0; d < 2; ++d) {
    const Direction dir = d == 0 ? Direction::kDeviceToHost : Direction::kHostToDevice;
    for (int m = 0; m < 2; ++m) {
      const CopyMethod method = m == 0 ? CopyMethod::kDmaBatch : CopyMethod::kZeroCopyKernel;
      for (std::size_t slice : slices) {
        auto e = b.engine(slice, method);
        const Bench::Timing tm = b.engine_time(*e, dir, b.pages, b.reps);
        const std::uint64_t wrong = b.verified_run(*e, dir, b.pages);
        wrong_total += wrong;
        const double s = tm.seconds;
        const double pct = 100.0 * contig[d] / s;
        if (slice == 128) at128[d][m] = pct;
        b.md << "| " << (d == 0 ? "D2H (demote)" : "H2D (promote)") << " | " << to_string(method)
             << " | " << slice << " | " << gb / s << " | " << pct << " | " << 1e3 * tm.submit_s
             << " | " << (wrong == 0 ? std::string("ok") : std::to_string(wrong) + " B WRONG")
             << " |\n";
        b.csv << (d == 0 ? "d2h" : "h2d") << ',' << to_string(method) << ',' << slice << ',' << s
              << ',' << gb / s << ',' << gb / contig[d] << ',' << pct << ',' << tm.submit_s << ','
              << wrong << '\n';
      }
    }
  }

  // Latency of small batches (what a short prefix's time-to-first-token sees).
  b.md << "\n## Small batches: submit() to wait() latency (slice 128, median of 50)\n\n"
          "| pages | D2H dma-batch us | D2H zero-copy us | H2D dma-batch us | H2D zero-copy us | "
          "contiguous D2H us | contiguous H2D us |\n|---|---|---|---|---|---|---|\n";
  {
    auto dma = b.engine(128, CopyMethod::kDmaBatch);
    auto zc = b.engine(128, CopyMethod::kZeroCopyKernel);
    for (std::uint32_t n : {1u, 2u, 4u, 8u, 16u}) {
      b.md << "| " << n;
      for (Direction dir : {Direction::kDeviceToHost, Direction::kHostToDevice})
        for (CudaTransferEngine* e : {dma.get(), zc.get()})
          b.md << " | " << 1e6 * b.engine_time(*e, dir, n, 50).seconds;
      const int saved = b.reps;
      b.reps = 50;
      b.md << " | " << 1e6 * b.contiguous(Direction::kDeviceToHost, b.page * n) << " | "
           << 1e6 * b.contiguous(Direction::kHostToDevice, b.page * n) << " |\n";
      b.reps = saved;
    }
    for (CudaTransferEngine* e : {dma.get(), zc.get()})
      for (Direction dir : {Direction::kDeviceToHost, Direction::kHostToDevice})
        wrong_total += b.verified_run(*e, dir, 16);
  }

  // Both directions at once (slice 128): each direction's share.
  b.md
      << "\n## Both directions at once (slice 128)\n\n| method | D2H GB/s | H2D GB/s | sum GB/s |\n"
         "|---|---|---|---|\n";
  for (int m = 0; m < 2; ++m) {
    const CopyMethod method = m == 0 ? CopyMethod::kDmaBatch : CopyMethod::kZeroCopyKernel;
    auto e = b.engine(128, method);
    const std::uint32_t half = b.pool_pages / 2;
    TransferBatch down = b.scattered(Direction::kDeviceToHost, half);
    TransferBatch up;  // the other half of both pools, so the two batches never overlap
    up.direction = Direction::kHostToDevice;
    std::vector<bool> gused(b.pool_pages), hused(b.pool_pages);
    for (const PageCopy& p : down.pages) gused[p.gpu.value()] = hused[p.host.value()] = true;
    std::vector<std::uint32_t> gf, hf;
    for (std::uint32_t i = 0; i < b.pool_pages; ++i) {
      if (!gused[i]) gf.push_back(i);
      if (!hused[i]) hf.push_back(i);
    }
    for (std::size_t i = 0; i < std::min(gf.size(), hf.size()); ++i)
      up.pages.push_back({GpuPageId(gf[i]), HostPageId(hf[(i * 7919) % hf.size()])});
    const double t0 = gpucheck::now_s();
    auto td = e->submit(down);
    auto tu = e->submit(up);
    td->wait();
    const double t_down = gpucheck::now_s() - t0;
    tu->wait();
    const double t_up = gpucheck::now_s() - t0;
    const double gbd = static_cast<double>(b.page) * down.pages.size() / 1e9;
    const double gbu = static_cast<double>(b.page) * up.pages.size() / 1e9;
    b.md << "| " << to_string(method) << " | " << gbd / t_down << " | " << gbu / t_up << " | "
         << (gbd + gbu) / std::max(t_down, t_up) << " |\n";
  }

  // Interference: compute-stream kernel time alone and while both directions copy, with the
  // copy GB/s reached in that window. A host thread keeps submitting and waiting 512-page
  // batches in both directions (disjoint halves of both pools) until the kernels are done.
  b.md << "\n## Compute-stream kernel time while copies run (slice 128, both directions)\n\n"
          "Compute loads: many short blocks (tens of waves). Copy GB/s: bytes of the batches "
          "finished while the kernels ran, over that time (D2H + H2D).\n\n"
          "| kernel | method | alone ms | during copies ms | growth % | copy GB/s in window |\n"
          "|---|---|---|---|---|---|\n";
  float* sink = nullptr;
  float *src = nullptr, *dst = nullptr;
  const std::uint64_t n = std::uint64_t{256} << 20;  // 1 GiB of floats per buffer
  CUDA_OK(cudaMalloc(&sink, 1024 * sizeof(float)));
  CUDA_OK(cudaMalloc(&src, n * sizeof(float)));
  CUDA_OK(cudaMalloc(&dst, n * sizeof(float)));
  CUDA_OK(cudaMemset(src, 0, n * sizeof(float)));
  const unsigned fma_blocks = static_cast<unsigned>(prop.multiProcessorCount) * 200;
  const unsigned stream_blocks = static_cast<unsigned>((n / 4 + 255) / 256);
  auto kernel_ms = [&](int which, int count) {
    std::vector<cudaEvent_t> ev(count + 1);
    for (auto& x : ev) CUDA_OK(cudaEventCreate(&x));
    CUDA_OK(cudaEventRecord(ev[0], b.compute));
    for (int i = 0; i < count; ++i) {
      if (which == 0)
        gpucheck::busy_fma<<<fma_blocks, 256, 0, b.compute>>>(sink, 100000);
      else
        gpucheck::busy_stream<<<stream_blocks, 256, 0, b.compute>>>(dst, src, n);
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
  const int counts[2] = {15, 100};
  double worst_growth[2] = {0, 0};
  for (int which = 0; which < 2; ++which) {
    kernel_ms(which, 3);  // warm-up
    const double alone = kernel_ms(which, counts[which]);
    for (int m = 0; m < 2; ++m) {
      const CopyMethod method = m == 0 ? CopyMethod::kDmaBatch : CopyMethod::kZeroCopyKernel;
      CudaEngineOptions opt;
      opt.slice_pages = 128;
      opt.d2h = opt.h2d = method;
      opt.compute_stream = b.compute;
      // The copies must not wait for the kernels being measured (they would run after them).
      opt.demote_after_compute = opt.promote_after_compute = false;
      auto created = CudaTransferEngine::create(b.pools(), opt);
      if (!created.is_ok()) {
        std::printf("FATAL: %s\n", created.status().to_string().c_str());
        return 1;
      }
      CudaTransferEngine& e = **created;
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
          auto td = e.submit(down);
          auto tu = e.submit(up);
          if (!td.is_ok() || !tu.is_ok() || td->wait() != TransferState::kDone ||
              tu->wait() != TransferState::kDone) {
            failed = true;
            break;
          }
          bytes += 2 * std::uint64_t{batch} * b.page;
        }
      });
      while (bytes.load() == 0 && !failed.load()) std::this_thread::yield();  // copies running
      const std::uint64_t bytes0 = bytes.load();
      const double w0 = gpucheck::now_s();
      const double during = kernel_ms(which, counts[which]);
      const std::uint64_t bytes1 = bytes.load();
      const double w1 = gpucheck::now_s();
      stop = true;
      copier.join();
      const double gbps = static_cast<double>(bytes1 - bytes0) / 1e9 / (w1 - w0);
      const double growth = 100.0 * (during - alone) / alone;
      worst_growth[m] = std::max(worst_growth[m], growth);
      b.md << "| " << (which == 0 ? "fma (compute-bound)" : "stream (HBM-bound)") << " | "
           << to_string(method) << " | " << alone << " | " << during << " | " << growth << " | "
           << gbps << (failed ? " (a copy FAILED)" : "") << " |\n";
      if (failed) wrong_total += 1;
    }
  }
  b.md << "\nByte checks (32 poisoned destination pages of an untimed run per configuration): "
       << (wrong_total == 0 ? "all ok" : std::to_string(wrong_total) + " bytes WRONG") << ".\n";

  std::ostringstream goals;
  const char* names[2] = {"D2H", "H2D"};
  for (int d = 0; d < 2; ++d) {
    const int best = at128[d][0] >= at128[d][1] ? 0 : 1;
    goals << "GOAL " << names[d] << " slice 128: dma-batch " << at128[d][0] << "%, zero-copy "
          << at128[d][1] << "% of contiguous; faster: "
          << to_string(best == 0 ? CopyMethod::kDmaBatch : CopyMethod::kZeroCopyKernel) << " -> "
          << (at128[d][best] >= 90.0 ? "MET" : "NOT MET") << " (goal >= 90%)\n";
  }
  for (int m = 0; m < 2; ++m)
    goals << "GOAL compute slowdown with "
          << to_string(m == 0 ? CopyMethod::kDmaBatch : CopyMethod::kZeroCopyKernel) << ": worst "
          << worst_growth[m] << "% -> " << (worst_growth[m] <= 5.0 ? "MET" : "NOT MET")
          << " (goal <= 5%)\n";
  b.md << "\n## Goals\n\n```\n" << goals.str() << "```\n";
  std::printf("%s", b.md.str().c_str());
  if (!out.empty()) {
    std::ofstream(out + "/bench.md") << b.md.str();
    std::ofstream(out + "/bench.csv") << b.csv.str();
  }
  cudaFree(sink);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(b.gpu);
  return wrong_total == 0 ? 0 : 1;
}
