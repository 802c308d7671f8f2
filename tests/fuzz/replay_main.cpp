// Replays fuzzer inputs without libFuzzer (any compiler): every file named, every file in
// every directory named. `--write-seeds DIR` writes the seed corpus (seeds.cpp) into DIR;
// `--check-seeds DIR` fails when DIR lacks one of them or holds an older version.
// Exit status 0 when every input passed; a failed check aborts with its message.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cache_fuzz.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<std::uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    fs::create_directories(argv[2]);
    for (const auto& seed : radixtier::fuzz::seeds()) {
      std::ofstream out(fs::path(argv[2]) / seed.name, std::ios::binary);
      out.write(reinterpret_cast<const char*>(seed.bytes.data()),
                static_cast<std::streamsize>(seed.bytes.size()));
    }
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--check-seeds") {
    // The committed corpus must hold every seed as seeds.cpp writes it.
    int stale = 0;
    for (const auto& seed : radixtier::fuzz::seeds()) {
      if (read_file(fs::path(argv[2]) / seed.name) != seed.bytes) {
        std::fprintf(stderr, "%s: missing or stale in %s\n", seed.name.c_str(), argv[2]);
        ++stale;
      }
    }
    if (stale) std::fprintf(stderr, "rewrite them: %s --write-seeds %s\n", argv[0], argv[2]);
    return stale ? 1 : 0;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR... | --write-seeds DIR | --check-seeds DIR\n",
                 argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else {
      inputs.push_back(p);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs found\n");
    return 2;
  }
  for (const fs::path& p : inputs) {
    const std::vector<std::uint8_t> bytes = read_file(p);
    std::fprintf(stderr, "%s (%zu bytes)\n", p.string().c_str(), bytes.size());
    radixtier::fuzz::run_input(bytes);
  }
  std::fprintf(stderr, "%zu inputs passed\n", inputs.size());
  return 0;
}
