// The content hash of a block (page) that KV events name it by, reproducible from tokens.
//
//   block_hash(parent, page) = XXH64(bytes, seed 0), bytes = parent as 8 bytes little-endian,
//                              then each token of the page as 4 bytes little-endian (int32)
//   parent = the hash of the previous page of the sequence; for the first page the key
//            namespace's id (RequestOptions::ns; 0 for the default namespace)
//
// So page i of a prompt hashes the whole prefix up to its end: equal hashes mean equal
// prefixes (up to 64-bit collisions). docs/events-and-metrics.md has the router's side.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "radixtier/ids.hpp"

namespace radixtier {

std::uint64_t block_hash(std::uint64_t parent, std::span<const Token> page);

/// The hashes of every whole page of `tokens`, first page first (a partial tail is ignored);
/// `parent`: the namespace id for a sequence from its root.
std::vector<std::uint64_t> block_hashes(std::span<const Token> tokens, std::uint32_t page_size,
                                        std::uint64_t parent = 0);

}  // namespace radixtier
