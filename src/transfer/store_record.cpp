#include "radixtier/transfer/store_record.hpp"

#include <algorithm>

// Header-only xxHash, as block_hash.cpp: the core library gains no link dependency.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace radixtier {

const char* to_string(RecordKind kind) {
  switch (kind) {
    case RecordKind::kKvPage:
      return "kv_page";
    case RecordKind::kSnapshot:
      return "snapshot";
  }
  return "unknown";
}

std::string PathHash::to_string() const {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

PathHash extend_path(PathHash parent, std::span<const Token> tokens) {
  // Little-endian bytes on the machines the store supports (the header records it).
  std::vector<unsigned char> buf(16 + tokens.size_bytes());
  std::memcpy(buf.data(), &parent.lo, 8);
  std::memcpy(buf.data() + 8, &parent.hi, 8);
  if (!tokens.empty()) std::memcpy(buf.data() + 16, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_withSeed(buf.data(), buf.size(), 0x7261646978746965ULL);
  PathHash out{h.low64, h.high64};
  if (out.is_root()) out.lo = 1;  // the root's hash is reserved
  return out;
}

std::vector<PathHash> page_path_hashes(std::span<const Token> tokens, std::uint32_t page_size,
                                       std::size_t pages) {
  std::vector<PathHash> out;
  if (page_size == 0) return out;
  pages = std::min(pages, tokens.size() / page_size);
  out.reserve(pages + 1);
  out.push_back(PathHash::root());
  for (std::size_t p = 0; p < pages; ++p) {
    out.push_back(extend_path(out.back(), tokens.subspan(p * page_size, page_size)));
  }
  return out;
}

RecordDesc RecordDesc::kv_page(PathHash parent, std::uint64_t boundary, std::vector<Token> tokens) {
  RecordDesc d;
  d.kind = RecordKind::kKvPage;
  d.parent = parent;
  d.boundary = boundary;
  d.tokens = std::move(tokens);
  return d;
}

RecordDesc RecordDesc::snapshot(PathHash path, std::uint64_t boundary) {
  RecordDesc d;
  d.kind = RecordKind::kSnapshot;
  d.path = path;
  d.boundary = boundary;
  return d;
}

PathHash RecordDesc::node_path() const {
  return kind == RecordKind::kKvPage ? extend_path(parent, tokens) : path;
}

}  // namespace radixtier
