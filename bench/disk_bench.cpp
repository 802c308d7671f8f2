// Disk engine bandwidth against a plain pwrite/pread loop, same directory, same run
// (issue #13: the engine must reach >= 80% of the loop's sequential read and write bandwidth).
//
// Every variant moves the same file of kFileBytes in kOpBytes operations. A write
// iteration writes the whole file and ends with fdatasync (the bytes are on the device); a
// read iteration first (untimed) drops the file's pages from the page cache with
// posix_fadvise(DONTNEED), so it reads from the device. The engines get one batch of all
// operations, sliced at 1 MiB; io_uring keeps queue_depth slices in flight, the thread pool
// runs io_threads blocking calls at once.
//
//   RADIXTIER_BENCH_DIR=/path/on/the/disk build/default/bin/radixtier_bench
//     --benchmark_filter=Disk --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "radixtier/disk/io_engine.hpp"

namespace radixtier::disk {
namespace {

constexpr std::size_t kFileBytes = std::size_t{256} << 20;
constexpr std::size_t kOpBytes = std::size_t{1} << 20;

std::string bench_file() {
  const char* env = std::getenv("RADIXTIER_BENCH_DIR");
  const std::filesystem::path dir = env ? env : std::filesystem::temp_directory_path();
  return (dir / "radixtier-disk-bench.dat").string();
}

struct BenchFile {
  int fd = -1;
  std::vector<std::byte> buf;
  BenchFile() : buf(kFileBytes) {
    fd = ::open(bench_file().c_str(), O_RDWR | O_CREAT, 0644);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::byte>(i * 131 + 7);
  }
  ~BenchFile() {
    ::close(fd);
    ::unlink(bench_file().c_str());
  }
  void drop_cache() const {
    (void)::fdatasync(fd);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  std::vector<IoOp> ops(IoOp::Kind kind) {
    std::vector<IoOp> out;
    for (std::size_t off = 0; off < kFileBytes; off += kOpBytes) {
      out.push_back({kind, fd, off, buf.data() + off, kOpBytes});
    }
    return out;
  }
};

// 0: plain loop, 1: io_uring engine, 2: thread-pool engine.
std::unique_ptr<DiskIoEngine> engine_for(int variant, benchmark::State& state) {
  if (variant == 0) return nullptr;
  IoEngineConfig c;
  c.kind = variant == 1 ? IoEngineKind::kIoUring : IoEngineKind::kThreadPool;
  if (state.range(1) > 0) c.io_threads = static_cast<std::uint32_t>(state.range(1));
  c.slice_bytes = kOpBytes;
  auto e = make_io_engine(c);
  if (!e.is_ok()) {
    state.SkipWithError(e.status().to_string().c_str());
    return nullptr;
  }
  return std::move(e).value();
}

void label(benchmark::State& state, int variant) {
  static const char* names[] = {"plain loop", "io_uring", "thread_pool"};
  state.SetLabel(names[variant]);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kFileBytes));
}

void BM_DiskSeqWrite(benchmark::State& state) {
  const int variant = static_cast<int>(state.range(0));
  BenchFile f;
  auto engine = engine_for(variant, state);
  if (variant != 0 && !engine) return;
  for (auto _ : state) {
    if (variant == 0) {
      for (std::size_t off = 0; off < kFileBytes; off += kOpBytes) {
        if (::pwrite(f.fd, f.buf.data() + off, kOpBytes, static_cast<off_t>(off)) !=
            static_cast<ssize_t>(kOpBytes)) {
          state.SkipWithError("pwrite failed");
          return;
        }
      }
    } else {
      auto t = engine->submit(f.ops(IoOp::Kind::kWrite));
      if (!t.is_ok() || !t->wait().is_ok()) {
        state.SkipWithError("engine write failed");
        return;
      }
    }
    (void)::fdatasync(f.fd);
  }
  label(state, variant);
}

void BM_DiskSeqRead(benchmark::State& state) {
  const int variant = static_cast<int>(state.range(0));
  BenchFile f;
  auto engine = engine_for(variant, state);
  if (variant != 0 && !engine) return;
  for (std::size_t off = 0; off < kFileBytes; off += kOpBytes) {
    (void)!::pwrite(f.fd, f.buf.data() + off, kOpBytes, static_cast<off_t>(off));
  }
  for (auto _ : state) {
    state.PauseTiming();
    f.drop_cache();
    state.ResumeTiming();
    if (variant == 0) {
      for (std::size_t off = 0; off < kFileBytes; off += kOpBytes) {
        if (::pread(f.fd, f.buf.data() + off, kOpBytes, static_cast<off_t>(off)) !=
            static_cast<ssize_t>(kOpBytes)) {
          state.SkipWithError("pread failed");
          return;
        }
      }
    } else {
      auto t = engine->submit(f.ops(IoOp::Kind::kRead));
      if (!t.is_ok() || !t->wait().is_ok()) {
        state.SkipWithError("engine read failed");
        return;
      }
    }
  }
  label(state, variant);
}

// Args: {variant, io_threads (0: the default 4)}.
BENCHMARK(BM_DiskSeqWrite)
    ->ArgsProduct({{0, 1, 2}, {0}})
    ->Iterations(6)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DiskSeqRead)
    ->ArgsProduct({{0, 1, 2}, {0}})
    ->Args({2, 1})
    ->Args({2, 2})
    ->Args({2, 8})
    ->Iterations(6)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace radixtier::disk
