// Tier: the levels of the cache, fastest first (GPU, host, the store below host). A node
// holds one residency row per tier (node.hpp); evict() and sizes() name one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace radixtier {

enum class Tier : std::uint8_t { kGpu, kHost, kStore };
inline constexpr std::size_t kTierCount = 3;

const char* to_string(Tier tier);

}  // namespace radixtier
