// Tier: the levels of the cache, fastest first (GPU, host, the store below host). A node
// holds one residency row per tier (node.hpp); evict() and sizes() name one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace radixtier {

enum class Tier : std::uint8_t { kGpu, kHost, kStore };
inline constexpr std::size_t kTierCount = 3;

const char* to_string(Tier tier);

/// The tier below `t` (the store has none: it is its own).
constexpr Tier lower_tier(Tier t) {
  return t == Tier::kGpu ? Tier::kHost : Tier::kStore;
}

/// Calls f.template operator()<T>() for each tier, fastest first (the one loop over the
/// tiers that code written once for every row uses).
template <class F>
constexpr void for_each_tier(F&& f) {
  f.template operator()<Tier::kGpu>();
  f.template operator()<Tier::kHost>();
  f.template operator()<Tier::kStore>();
}

}  // namespace radixtier
