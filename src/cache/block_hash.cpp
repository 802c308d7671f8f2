#include "radixtier/cache/block_hash.hpp"

#include <array>
#include <cstring>

// Header-only xxHash (Debian libxxhash-dev): nothing to link, so the installed core library
// carries no new link dependency.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace radixtier {

namespace {
void put_le(unsigned char* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
}  // namespace

std::uint64_t block_hash(std::uint64_t parent, std::span<const Token> page) {
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  unsigned char head[8];
  put_le(head, parent, 8);
  XXH64_update(&state, head, sizeof head);
  // Tokens in chunks, so the byte order is little-endian whatever the host's is.
  std::array<unsigned char, 4 * 256> buf;
  for (std::size_t i = 0; i < page.size();) {
    std::size_t n = 0;
    for (; n < 256 && i < page.size(); ++n, ++i)
      put_le(buf.data() + 4 * n, static_cast<std::uint32_t>(page[i]), 4);
    XXH64_update(&state, buf.data(), 4 * n);
  }
  return XXH64_digest(&state);
}

std::vector<std::uint64_t> block_hashes(std::span<const Token> tokens, std::uint32_t page_size,
                                        std::uint64_t parent) {
  std::vector<std::uint64_t> out;
  if (page_size == 0) return out;
  for (std::size_t pos = 0; pos + page_size <= tokens.size(); pos += page_size) {
    parent = block_hash(parent, tokens.subspan(pos, page_size));
    out.push_back(parent);
  }
  return out;
}

}  // namespace radixtier
