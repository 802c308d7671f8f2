// RADIXTIER_VECTOR_CLONES: a hot loop compiled for AVX-512 and AVX2 besides the baseline
// x86-64, the clone picked at load time by the CPU (GCC function multiversioning on x86-64;
// nothing elsewhere). The int64 prompt walk (prefix_cache.cpp) and the Python binding's int64
// narrowing (src/python/arrays.cpp) use it. Internal: not installed.
// Not under ThreadSanitizer: the clones' ifunc resolver runs while the dynamic loader
// relocates the binary, before the TSan runtime is up, and its instrumented code faults
// there (every TSan test binary then dies at load, before main).
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define RADIXTIER_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RADIXTIER_VECTOR_CLONES
#endif
