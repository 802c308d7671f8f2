#include "radixtier/shared/value_codec.hpp"

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

std::string encode_value(ValueHeader h, std::span<const std::span<const std::byte>> parts) {
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
  out.reserve(kHeaderBytes + length);
  char* b = out.data();
  put(b + 0, kMagic, 4);
  put(b + 4, kVersion, 2);
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
  return out;
}

Decoded decode_value(std::string_view v, const ValueHeader& expect) {
  Decoded d;
  if (v.size() < kHeaderBytes) {
    d.error = DecodeError::kShort;
    return d;
  }
  const char* b = v.data();
  if (get(b, 4) != kMagic || get(b + 4, 2) != kVersion) {
    d.error = DecodeError::kMagic;
    return d;
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
                           std::span<const std::byte> bytes) {
  std::string toks(tokens.size() * 4, '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i)
    put(toks.data() + 4 * i, static_cast<std::uint32_t>(tokens[i]), 4);
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span(toks.data(), toks.size())),
                                              bytes};
  ValueHeader h = id;
  h.kind = ValueKind::kKvPage;
  h.tokens = static_cast<std::uint32_t>(tokens.size());
  return encode_value(h, parts);
}

Decoded decode_kv_page(std::string_view value, const ValueHeader& expect,
                       std::span<const Token> tokens, std::size_t page_bytes) {
  Decoded d = decode_value(value, expect);
  if (d.error != DecodeError::kNone) return d;
  if (d.payload.size() != tokens.size() * 4 + page_bytes) {
    d = Decoded{DecodeError::kShort, {}, d.header};
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
