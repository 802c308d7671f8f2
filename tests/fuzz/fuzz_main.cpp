// libFuzzer entry point of the cache fuzzer (the `fuzz` preset builds it with
// -fsanitize=fuzzer,address,undefined). Run: build/fuzz/bin/radixtier_cache_fuzzer
// CORPUS_DIR tests/fuzz/corpus -max_total_time=SECONDS (docs/how-to-run.md).
#include <cstddef>
#include <cstdint>

#include "cache_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  radixtier::fuzz::run_input({data, size});
  return 0;
}
