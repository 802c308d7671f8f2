// The values of the shared tier: a fixed header checked on every read, then the payload.
//
//   offset  field         what a reader checks
//   0       magic   u32   "RTX1"
//   4       version u16   kVersion
//   6       kind    u16   kKvPage / kManifest / kChunk: the one the key named
//   8       model   u64   ModelFingerprint::hash() of the reader
//   16      ns      u64   namespace_hash() of the reader's namespace
//   24      path    2xu64 the path hash the key named
//   40      boundary u64  tokens from the root to the page's or the snapshot's end
//   48      tokens  u32   KV page: its token count (page_size); else 0
//   52      index   u32   chunk: its index; manifest: the chunk count
//   56      length  u64   payload bytes
//   64      checksum u64  XXH3-64 of the payload
//   72      payload       KV page: its tokens (int32 LE) then its bytes; manifest: the
//                         snapshot's total bytes (u64) and XXH3-64 (u64); chunk: its bytes
//
// Any mismatch, a short value or a bad checksum is a miss (DecodeError says which) and its
// bytes never reach the cache. Little-endian on the wire.
//
// Keyed values (a namespace with a key, SharedTierConfig::namespace_keys; version 2): the
// same header and payload, then a 32-byte keyed BLAKE2b MAC (libsodium crypto_generichash)
// over both; a KV page's payload holds a 16-byte keyed digest of its tokens instead of the
// tokens. A reader with the key takes only values whose MAC checks: a writer without the key
// cannot forge one, a value moved under another key fails its header, and no token is
// stored in clear. The XXH3 checksum (version 1, no key) catches accidents, not writers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "radixtier/ids.hpp"
#include "radixtier/transfer/store_record.hpp"

namespace radixtier::shared {

inline constexpr std::uint32_t kMagic = 0x31585452;  // "RTX1" little-endian
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::uint16_t kVersionKeyed = 2;
inline constexpr std::size_t kHeaderBytes = 72;
inline constexpr std::size_t kMacBytes = 32;          ///< after the payload, keyed values only
inline constexpr std::size_t kTokenDigestBytes = 16;  ///< a keyed KV page's token digest
inline constexpr std::size_t kMinKeyBytes = 16, kMaxKeyBytes = 64;

enum class ValueKind : std::uint16_t { kKvPage = 1, kManifest = 2, kChunk = 3 };

/// What the header says (and what a reader expects it to say).
struct ValueHeader {
  ValueKind kind = ValueKind::kKvPage;
  std::uint64_t model = 0;
  std::uint64_t ns = 0;
  PathHash path;
  std::uint64_t boundary = 0;
  std::uint32_t tokens = 0;
  std::uint32_t index = 0;
  std::uint64_t length = 0;
  std::uint64_t checksum = 0;
};

enum class DecodeError : std::uint8_t {
  kNone,
  kShort,     ///< fewer bytes than the header or its length says
  kMagic,     ///< not a radixtier value (or another version)
  kIdentity,  ///< kind, model, namespace, path, boundary, tokens or index differ
  kChecksum,  ///< the payload does not match its checksum
  kTokens,    ///< a KV page's tokens differ from the prompt's
  kMac,       ///< keyed: the MAC does not check (a writer without the key), or unkeyed
};

const char* to_string(DecodeError e);

/// Header + payload parts, concatenated (the checksum covers the parts); with `key`
/// (kMinKeyBytes..kMaxKeyBytes; empty: none) version 2 and the MAC after them.
std::string encode_value(ValueHeader header, std::span<const std::span<const std::byte>> parts,
                         std::string_view key = {});

/// Checks `value` against `expect` (every field but length and checksum) and returns the
/// payload; on an error `payload` is empty.
struct Decoded {
  DecodeError error = DecodeError::kNone;
  std::span<const std::byte> payload;
  ValueHeader header;
};
/// With `key`, only a version-2 value whose MAC checks (kMac otherwise); without, only
/// version 1.
Decoded decode_value(std::string_view value, const ValueHeader& expect, std::string_view key = {});

/// KV page values: tokens then bytes. decode_kv_page() also checks the tokens and the size.
/// Keyed: the payload is the tokens' keyed digest then the bytes.
std::string encode_kv_page(const ValueHeader& id, std::span<const Token> tokens,
                           std::span<const std::byte> bytes, std::string_view key = {});
Decoded decode_kv_page(std::string_view value, const ValueHeader& expect,
                       std::span<const Token> tokens, std::size_t page_bytes,
                       std::string_view key = {});

/// Bytes of a value whose payload has `payload` bytes; of a KV page's payload.
std::size_t value_bytes(std::size_t payload, bool keyed);
std::size_t kv_payload_bytes(std::size_t tokens, std::size_t page_bytes, bool keyed);

std::uint64_t checksum(std::span<const std::byte> bytes);
/// checksum() of the parts' concatenation (streamed: the parts are never joined).
std::uint64_t checksum(std::span<const std::span<const std::byte>> parts);

}  // namespace radixtier::shared
