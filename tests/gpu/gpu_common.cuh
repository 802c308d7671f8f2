// Shared helpers of the GPU check programs: tiny check macros (no GoogleTest), a device skip
// check, deterministic byte patterns and the kernels that keep the compute stream busy.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace gpucheck {

inline int g_passed = 0;
inline int g_failed = 0;

#define GPU_CHECK(cond)                                               \
  do {                                                                \
    if (cond) {                                                       \
      ++gpucheck::g_passed;                                           \
    } else {                                                          \
      ++gpucheck::g_failed;                                           \
      std::printf("  FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                 \
  } while (0)

#define GPU_CHECK_MSG(cond, ...)                                      \
  do {                                                                \
    if (cond) {                                                       \
      ++gpucheck::g_passed;                                           \
    } else {                                                          \
      ++gpucheck::g_failed;                                           \
      std::printf("  FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                       \
      std::printf("\n");                                              \
    }                                                                 \
  } while (0)

// A CUDA call that must succeed; a failure is fatal (nothing after it is meaningful).
#define CUDA_OK(expr)                                                                            \
  do {                                                                                           \
    const cudaError_t err_ = (expr);                                                             \
    if (err_ != cudaSuccess) {                                                                   \
      std::printf("FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::printf("%d passed, %d failed\n", gpucheck::g_passed, gpucheck::g_failed + 1);         \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

/// What a GPU program does on this machine: run, skip or fail. It prints the CUDA driver
/// and runtime versions first. Skip only when there is nothing to run on: no driver
/// installed (driver version 0) or cudaErrorNoDevice / zero devices; and not even then when
/// RADIXTIER_GPU_REQUIRED=1 (tests/gpu/check.sh sets it). Any other error fails: with the
/// static CUDA 13 runtime, a driver older than 580 reports cudaErrorInsufficientDriver, and a
/// GPU machine must not "pass" by skipping.
enum class DeviceCheck { kRun, kSkip, kFail };
inline DeviceCheck check_device(const char* program) {
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  std::printf("%s: CUDA driver %d.%d (%d), runtime %d.%d (%d)\n", program, driver / 1000,
              driver % 1000 / 10, driver, runtime / 1000, runtime % 1000 / 10, runtime);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  const char* required = std::getenv("RADIXTIER_GPU_REQUIRED");
  const bool must_run = required != nullptr && required[0] == '1';
  const bool nothing_here =
      err == cudaErrorNoDevice || (err == cudaSuccess && count == 0) || driver == 0;
  if (err == cudaSuccess && count > 0) return DeviceCheck::kRun;
  if (nothing_here && !must_run) {
    std::printf("SKIP %s: no CUDA device visible (%s)\n", program,
                driver == 0          ? "no CUDA driver installed"
                : err != cudaSuccess ? cudaGetErrorName(err)
                                     : "device count is 0");
    return DeviceCheck::kSkip;
  }
  std::printf("FAIL %s: cudaGetDeviceCount: %s: %s (driver %d, runtime %d%s)\n", program,
              cudaGetErrorName(err), cudaGetErrorString(err), driver, runtime,
              must_run ? "; RADIXTIER_GPU_REQUIRED=1" : "");
  return DeviceCheck::kFail;
}

/// A driver API function through the runtime (no -lcuda needed), or nullptr.
template <class Fn>
Fn driver_fn(const char* symbol) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(p);
}

/// The calling thread's current context (cuCtxGetCurrent); nullptr: none.
inline CUcontext current_context() {
  static const auto fn = driver_fn<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent");
  CUcontext ctx = nullptr;
  if (fn != nullptr) (void)fn(&ctx);
  return ctx;
}

/// Whether `device`'s primary context exists (cuDevicePrimaryCtxGetState), or -1 unknown.
inline int primary_context_active(int device) {
  static const auto get = driver_fn<PFN_cuDeviceGet_v2000>("cuDeviceGet");
  static const auto state =
      driver_fn<PFN_cuDevicePrimaryCtxGetState_v7000>("cuDevicePrimaryCtxGetState");
  if (get == nullptr || state == nullptr) return -1;
  CUdevice dev = 0;
  unsigned flags = 0;
  int active = 0;
  if (get(&dev, device) != CUDA_SUCCESS || state(dev, &flags, &active) != CUDA_SUCCESS) return -1;
  return active;
}

inline int report() {
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// --- deterministic bytes: byte at offset o of pattern `seed` ------------------------------
__host__ __device__ inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__host__ __device__ inline unsigned char pattern_byte(std::uint64_t seed, std::uint64_t o) {
  return static_cast<unsigned char>(mix64(seed ^ (o >> 3) * 0x2545F4914F6CDD1Dull) >>
                                    (8 * (o & 7)));
}

/// Fills buf[0, n) with pattern `seed` (offsets relative to buf).
__global__ void fill_pattern(unsigned char* buf, std::uint64_t n, std::uint64_t seed) {
  const std::uint64_t words = n / 8;
  auto* w = reinterpret_cast<std::uint64_t*>(buf);
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < words;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    w[i] = mix64(seed ^ i * 0x2545F4914F6CDD1Dull);
  for (std::uint64_t o = words * 8 + blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; o < n;
       o += std::uint64_t{gridDim.x} * blockDim.x)
    buf[o] = pattern_byte(seed, o);
}

inline void launch_fill(void* buf, std::uint64_t n, std::uint64_t seed, cudaStream_t s) {
  fill_pattern<<<1024, 256, 0, s>>>(static_cast<unsigned char*>(buf), n, seed);
}

/// Compute-bound work: `iters` dependent FMAs per thread, results kept alive in `sink`.
/// Launch it with many more blocks than fit at once (tens of waves), for the same reason.
__global__ void busy_fma(float* sink, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    b = fmaf(b, c, a * 1e-7f);
  }
  if (a == 12345.678f) sink[threadIdx.x] = a + b;
}

/// Memory-bound work: dst = src + 1 over n floats (HBM streaming). Launch it with one
/// thread per 4 floats: many short blocks, so the kernel time degrades in proportion to
/// the SM share taken by other work instead of by whole waves.
__global__ void busy_stream(float* dst, const float* src, std::uint64_t n) {
  const std::uint64_t first = (blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x) * 4;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (first + k < n) dst[first + k] = src[first + k] + 1.0f;
}

/// Spins the compute stream for about `ms` milliseconds on every SM.
__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

inline void launch_spin(double ms, cudaStream_t s) {
  int khz = 0, sms = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (khz <= 0) khz = 1500000;
  spin_kernel<<<2 * sms, 256, 0, s>>>(static_cast<long long>(ms * khz));
}

}  // namespace gpucheck
