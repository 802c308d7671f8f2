// radixtier_shared_bench: GET bandwidth of RedisCluster against redis-benchmark, on the same
// 1-master LocalCluster in the same run (a tool, not a test).
//
//   radixtier_shared_bench [--value-bytes N] [--keys K] [--iterations I] [--requests R]
//                          [--inflight-bytes B]   (the client's max_inflight_bytes)
//                          [--reuse 0|1]          (1, the default: get_into, buffers reused)
//                          [--keep-heap 1]        (glibc keeps freed memory: see below)
//
// --reuse 1 (default): every iteration is get_into() into the same reply vector, so values
// land in the strings of the previous iteration (no allocation, no page fault: what
// SharedTier's fetches do with their pooled reply vectors). --reuse 0: every get() hands back
// fresh std::strings; on a VM where page faults are slow, glibc's returning freed 4 MiB
// blocks to the kernel (munmap / trim) and faulting them in again dominates. --keep-heap 1
// raises M_MMAP_THRESHOLD / M_TRIM_THRESHOLD so freed blocks are reused by malloc instead.
//
// Ours: K keys of N bytes, SET once, then I pipelined calls of all K keys (bytes checked on
// the first, after a warm-up call). redis-benchmark: -t set,get -d N -n R -c 1 -P 1 --csv (its SET
// writes the key its GET then reads). Prints both in bytes/s and ours / redis-benchmark.
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "radixtier/shared/redis_cluster.hpp"
#include "shared/local_cluster.hpp"

namespace {

using namespace radixtier::shared;
using namespace std::chrono_literals;

std::string value_of(std::size_t size, std::size_t seed) {
  std::string v(size, '\0');
  for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<char>((i * 131 + seed * 7) >> 3);
  return v;
}

// The "GET" line's rps of redis-benchmark --csv, or a negative number.
double redis_benchmark_get_rps(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  ::pclose(pipe);
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("\"GET\",\"", 0) == 0) return std::atof(line.c_str() + 7);
  }
  std::cerr << "redis-benchmark output:\n" << out;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t value_bytes = 4u << 20;
  std::size_t keys = 32;
  std::size_t iterations = 10;
  std::size_t requests = 200;
  std::size_t inflight = RedisClusterConfig{}.max_inflight_bytes;
  std::size_t keep_heap = 0;
  std::size_t reuse = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::size_t v = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--value-bytes") {
      value_bytes = v;
    } else if (flag == "--keys") {
      keys = v;
    } else if (flag == "--iterations") {
      iterations = v;
    } else if (flag == "--requests") {
      requests = v;
    } else if (flag == "--inflight-bytes") {
      inflight = v;
    } else if (flag == "--keep-heap") {
      keep_heap = v;
    } else if (flag == "--reuse") {
      reuse = v;
    } else {
      std::cerr << "usage: " << argv[0]
                << " [--value-bytes N] [--keys K] [--iterations I] [--requests R] "
                   "[--inflight-bytes B] [--reuse 0|1] [--keep-heap 0|1]\n";
      return 2;
    }
  }
  if (value_bytes == 0 || keys == 0 || iterations == 0 || requests == 0 || inflight == 0) {
    std::cerr << "every flag must be > 0\n";
    return 2;
  }
  if (keep_heap != 0) {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  auto bench_tool = find_redis_program("redis-benchmark");
  if (!bench_tool) {
    std::cerr << bench_tool.status().to_string() << "\n";
    return 1;
  }
  auto cluster = LocalCluster::start(1, 0);
  if (!cluster) {
    std::cerr << cluster.status().to_string() << "\n";
    return 1;
  }
  RedisClusterConfig config;
  config.seeds = (*cluster)->seeds();
  config.expected_value_bytes = value_bytes;
  config.max_inflight_bytes = inflight;
  auto client = RedisCluster::connect(config);
  if (!client) {
    std::cerr << client.status().to_string() << "\n";
    return 1;
  }
  std::vector<std::string> names;
  std::vector<std::string> values;
  std::vector<SetItem> items;
  for (std::size_t i = 0; i < keys; ++i) {
    names.push_back("bench:" + std::to_string(i));
    values.push_back(value_of(value_bytes, i));
  }
  for (std::size_t i = 0; i < keys; ++i) items.push_back({names[i], values[i]});
  for (auto s : (*client)->set(items, Clock::now() + 60s)) {
    if (s != KeyState::kFound) {
      std::cerr << "SET failed\n";
      return 1;
    }
  }
  std::vector<GetReply> got;
  (*client)->get_into(names, Clock::now() + 60s, got);  // warm-up (fills got's buffers)
  const auto start = Clock::now();
  std::size_t bytes = 0;
  for (std::size_t it = 0; it < iterations; ++it) {
    if (reuse != 0) {
      (*client)->get_into(names, Clock::now() + 60s, got);
    } else {
      got = (*client)->get(names, Clock::now() + 60s);
    }
    for (std::size_t i = 0; i < keys; ++i) {
      if (got[i].state != KeyState::kFound || (it == 0 && got[i].value != values[i])) {
        std::cerr << "GET " << names[i] << " failed or wrong\n";
        return 1;
      }
      bytes += got[i].value.size();
    }
  }
  const double ours_s = std::chrono::duration<double>(Clock::now() - start).count();
  const double ours = static_cast<double>(bytes) / ours_s;

  const std::string command =
      *bench_tool + " -h 127.0.0.1 -p " + std::to_string((*cluster)->port(0)) + " -t set,get -d " +
      std::to_string(value_bytes) + " -n " + std::to_string(requests) + " -c 1 -P 1 --csv 2>&1";
  const double rps = redis_benchmark_get_rps(command);
  if (rps <= 0) {
    std::cerr << "redis-benchmark gave no GET line\n";
    return 1;
  }
  const double theirs = rps * static_cast<double>(value_bytes);
  std::printf(
      "value_bytes=%zu keys=%zu iterations=%zu inflight_bytes=%zu reuse=%zu keep_heap=%zu\n",
      value_bytes, keys, iterations, inflight, reuse, keep_heap);
  std::printf("radixtier RedisCluster GET: %.3e bytes/s (%.1f MiB/s)\n", ours, ours / (1 << 20));
  std::printf("redis-benchmark GET (-c 1 -P 1, %zu requests): %.3e bytes/s (%.1f MiB/s)\n",
              requests, theirs, theirs / (1 << 20));
  std::printf("ratio ours / redis-benchmark: %.2f\n", ours / theirs);
  std::printf("command: %s\n", command.c_str());
  return 0;
}
