#include "radixtier/shared/value_codec.hpp"

#include <sodium.h>

#include <array>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace radixtier::shared {

namespace {

void put(char* at, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<char>(v >> (8 * i));
}
std::uint64_t get(const char* at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(at[i])) << (8 * i);
  return v;
}

// Keyed BLAKE2b (libsodium) of a domain tag and `parts`, `out.size()` bytes.
void keyed_hash(std::span<unsigned char> out, std::string_view key, std::string_view tag,
                std::span<const std::span<const std::byte>> parts) {
  static const int init = sodium_init();  // once, thread-safe; picks the fastest code
  (void)init;
  crypto_generichash_state st;
  crypto_generichash_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                          out.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(tag.data()), tag.size());
  for (auto p : parts) {
    crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(p.data()), p.size());
  }
  crypto_generichash_final(&st, out.data(), out.size());
}

std::string token_bytes(std::span<const Token> tokens) {
  std::string toks(tokens.size() * 4, '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i)
    put(toks.data() + 4 * i, static_cast<std::uint32_t>(tokens[i]), 4);
  return toks;
}

// The keyed digest a keyed KV page holds instead of its tokens.
std::array<unsigned char, kTokenDigestBytes> token_digest(std::span<const Token> tokens,
                                                          std::string_view key) {
  const std::string toks = token_bytes(tokens);
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span(toks.data(), toks.size()))};
  std::array<unsigned char, kTokenDigestBytes> d{};
  keyed_hash(d, key, "rtx-tok1", parts);
  return d;
}

bool same_identity(const ValueHeader& a, const ValueHeader& b) {
  return a.kind == b.kind && a.model == b.model && a.ns == b.ns && a.path == b.path &&
         a.boundary == b.boundary && a.tokens == b.tokens && a.index == b.index;
}

}  // namespace

const char* to_string(DecodeError e) {
  switch (e) {
    case DecodeError::kNone:
      return "ok";
    case DecodeError::kShort:
      return "short value";
    case DecodeError::kMagic:
      return "bad magic or version";
    case DecodeError::kIdentity:
      return "header names other data";
    case DecodeError::kChecksum:
      return "checksum mismatch";
    case DecodeError::kTokens:
      return "tokens differ";
    case DecodeError::kMac:
      return "MAC mismatch";
  }
  return "?";
}

std::uint64_t checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::uint64_t checksum(std::span<const std::span<const std::byte>> parts) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (auto p : parts) XXH3_64bits_update(&state, p.data(), p.size());
  return XXH3_64bits_digest(&state);
}

std::size_t value_bytes(std::size_t payload, bool keyed) {
  return kHeaderBytes + payload + (keyed ? kMacBytes : 0);
}

std::size_t kv_payload_bytes(std::size_t tokens, std::size_t page_bytes, bool keyed) {
  return (keyed ? kTokenDigestBytes : 4 * tokens) + page_bytes;
}

std::string encode_value(ValueHeader h, std::span<const std::span<const std::byte>> parts,
                         std::string_view key) {
  std::size_t length = 0;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (auto p : parts) {
    length += p.size();
    XXH3_64bits_update(&state, p.data(), p.size());
  }
  h.length = length;
  h.checksum = XXH3_64bits_digest(&state);
  std::string out(kHeaderBytes, '\0');
  out.reserve(value_bytes(length, !key.empty()));
  char* b = out.data();
  put(b + 0, kMagic, 4);
  put(b + 4, key.empty() ? kVersion : kVersionKeyed, 2);
  put(b + 6, static_cast<std::uint16_t>(h.kind), 2);
  put(b + 8, h.model, 8);
  put(b + 16, h.ns, 8);
  put(b + 24, h.path.lo, 8);
  put(b + 32, h.path.hi, 8);
  put(b + 40, h.boundary, 8);
  put(b + 48, h.tokens, 4);
  put(b + 52, h.index, 4);
  put(b + 56, h.length, 8);
  put(b + 64, h.checksum, 8);
  for (auto p : parts) out.append(reinterpret_cast<const char*>(p.data()), p.size());
  if (!key.empty()) {
    const std::span<const std::byte> all[] = {std::as_bytes(std::span(out.data(), out.size()))};
    std::array<unsigned char, kMacBytes> mac{};
    keyed_hash(mac, key, "rtx-mac1", all);
    out.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  }
  return out;
}

Decoded decode_value(std::string_view v, const ValueHeader& expect, std::string_view key) {
  Decoded d;
  const std::size_t mac_bytes = key.empty() ? 0 : kMacBytes;
  if (v.size() < kHeaderBytes + mac_bytes) {
    d.error = DecodeError::kShort;
    return d;
  }
  const char* b = v.data();
  if (get(b, 4) != kMagic) {
    d.error = DecodeError::kMagic;
    return d;
  }
  // A keyed reader takes keyed values only (an unkeyed one is what anyone can write).
  if (get(b + 4, 2) != (key.empty() ? kVersion : kVersionKeyed)) {
    d.error = key.empty() ? DecodeError::kMagic : DecodeError::kMac;
    return d;
  }
  if (!key.empty()) {
    const std::string_view body = v.substr(0, v.size() - kMacBytes);
    const std::span<const std::byte> all[] = {std::as_bytes(std::span(body.data(), body.size()))};
    std::array<unsigned char, kMacBytes> mac{};
    keyed_hash(mac, key, "rtx-mac1", all);
    if (crypto_verify_32(mac.data(),
                         reinterpret_cast<const unsigned char*>(body.data() + body.size())) != 0) {
      d.error = DecodeError::kMac;
      return d;
    }
    v = body;
  }
  ValueHeader& h = d.header;
  h.kind = static_cast<ValueKind>(get(b + 6, 2));
  h.model = get(b + 8, 8);
  h.ns = get(b + 16, 8);
  h.path = {get(b + 24, 8), get(b + 32, 8)};
  h.boundary = get(b + 40, 8);
  h.tokens = static_cast<std::uint32_t>(get(b + 48, 4));
  h.index = static_cast<std::uint32_t>(get(b + 52, 4));
  h.length = get(b + 56, 8);
  h.checksum = get(b + 64, 8);
  if (!same_identity(h, expect)) {
    d.error = DecodeError::kIdentity;
    return d;
  }
  if (v.size() - kHeaderBytes != h.length) {
    d.error = DecodeError::kShort;
    return d;
  }
  const auto payload = std::as_bytes(std::span(v.data() + kHeaderBytes, h.length));
  if (checksum(payload) != h.checksum) {
    d.error = DecodeError::kChecksum;
    return d;
  }
  d.payload = payload;
  return d;
}

std::string encode_kv_page(const ValueHeader& id, std::span<const Token> tokens,
                           std::span<const std::byte> bytes, std::string_view key) {
  std::string toks;
  std::array<unsigned char, kTokenDigestBytes> digest{};
  std::span<const std::byte> first;
  if (key.empty()) {
    toks = token_bytes(tokens);
    first = std::as_bytes(std::span(toks.data(), toks.size()));
  } else {
    digest = token_digest(tokens, key);
    first = std::as_bytes(std::span(digest));
  }
  const std::span<const std::byte> parts[] = {first, bytes};
  ValueHeader h = id;
  h.kind = ValueKind::kKvPage;
  h.tokens = static_cast<std::uint32_t>(tokens.size());
  return encode_value(h, parts, key);
}

Decoded decode_kv_page(std::string_view value, const ValueHeader& expect,
                       std::span<const Token> tokens, std::size_t page_bytes,
                       std::string_view key) {
  Decoded d = decode_value(value, expect, key);
  if (d.error != DecodeError::kNone) return d;
  const bool keyed = !key.empty();
  if (d.payload.size() != kv_payload_bytes(tokens.size(), page_bytes, keyed)) {
    d = Decoded{DecodeError::kShort, {}, d.header};
    return d;
  }
  if (keyed) {
    const auto digest = token_digest(tokens, key);
    if (std::memcmp(digest.data(), d.payload.data(), digest.size()) != 0) {
      d = Decoded{DecodeError::kTokens, {}, d.header};
      return d;
    }
    d.payload = d.payload.subspan(kTokenDigestBytes);
    return d;
  }
  const char* t = reinterpret_cast<const char*>(d.payload.data());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<Token>(static_cast<std::uint32_t>(get(t + 4 * i, 4))) != tokens[i]) {
      d = Decoded{DecodeError::kTokens, {}, d.header};
      return d;
    }
  }
  d.payload = d.payload.subspan(tokens.size() * 4);
  return d;
}

}  // namespace radixtier::shared
