// Redis Cluster key routing: CRC16 (XMODEM: poly 0x1021, init 0, no reflection, as the Redis
// Cluster specification defines it) of the key's hash part, mod 16384.
//
// Contract: hash_part(key) is the part between the first '{' and the first '}' after it when
// that part is non-empty ("{user1000}.following" -> "user1000"); otherwise the whole key
// ("foo{}{bar}" -> whole key, "foo{{bar}}zap" -> "{bar", "foo{bar}{zap}" -> "bar").
// Pure functions: no state, any thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace radixtier::shared {

inline constexpr std::uint16_t kClusterSlots = 16384;

/// CRC16-XMODEM of `bytes` (check value: crc16("123456789") == 0x31C3).
std::uint16_t crc16(std::string_view bytes);
/// The part of `key` that is hashed (its hash tag when it has a non-empty one).
std::string_view hash_part(std::string_view key);
/// The cluster slot of `key`: crc16(hash_part(key)) mod 16384.
std::uint16_t key_slot(std::string_view key);

}  // namespace radixtier::shared
