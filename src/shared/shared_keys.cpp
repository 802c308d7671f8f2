#include "radixtier/shared/shared_keys.hpp"

#include <sodium.h>

#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace radixtier::shared {

namespace {

void put(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put(std::string& out, std::string_view s) {
  put(out, std::uint64_t{s.size()});  // length-prefixed: no two field lists encode alike
  out.append(s);
}

}  // namespace

std::uint64_t ModelFingerprint::hash() const {
  std::string b;
  put(b, model_id);
  put(b, weights_version);
  put(b, kv_dtype);
  for (std::uint64_t v :
       {std::uint64_t{layout_version}, std::uint64_t{tp_rank}, std::uint64_t{tp_size},
        std::uint64_t{page_size}, page_bytes, snapshot_bytes}) {
    put(b, v);
  }
  return XXH3_64bits_withSeed(b.data(), b.size(), 0x7274783166707231ULL);
}

std::uint64_t namespace_hash(std::string_view salt) {
  return XXH3_64bits_withSeed(salt.data(), salt.size(), 0x72747831736c7431ULL);
}

std::uint64_t namespace_hash(std::string_view salt, std::string_view key) {
  static const int init = sodium_init();
  (void)init;
  unsigned char out[16];
  crypto_generichash_state st;
  crypto_generichash_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                          sizeof(out));
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>("rtx-ns1"), 7);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(salt.data()), salt.size());
  crypto_generichash_final(&st, out, sizeof(out));
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(out[i]) << (8 * i);
  return v;
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string hex128(PathHash h) {
  return hex64(h.hi) + hex64(h.lo);
}

std::string KeySpace::kv_key(PathHash page) const {
  return "rt1:" + hex64(model) + ":" + hex64(ns) + ":" + hex128(page) + ":kv";
}

std::string KeySpace::manifest_key(PathHash boundary) const {
  return "rt1:{" + hex64(model) + ":" + hex64(ns) + ":" + hex128(boundary) + "}:m";
}

std::string KeySpace::chunk_key(PathHash boundary, std::uint32_t chunk) const {
  return "rt1:{" + hex64(model) + ":" + hex64(ns) + ":" + hex128(boundary) + "}:c" +
         std::to_string(chunk);
}

}  // namespace radixtier::shared
