#include "radixtier/shared/key_slot.hpp"

#include <array>

namespace radixtier::shared {
namespace {

constexpr std::array<std::uint16_t, 256> make_table() {
  std::array<std::uint16_t, 256> table{};
  for (unsigned i = 0; i < 256; ++i) {
    std::uint16_t crc = static_cast<std::uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<std::uint16_t>(crc << 1);
    }
    table[i] = crc;
  }
  return table;
}

constexpr auto kTable = make_table();

}  // namespace

std::uint16_t crc16(std::string_view bytes) {
  std::uint16_t crc = 0;
  for (unsigned char c : bytes) {
    crc = static_cast<std::uint16_t>((crc << 8) ^ kTable[((crc >> 8) ^ c) & 0xFF]);
  }
  return crc;
}

std::string_view hash_part(std::string_view key) {
  const auto open = key.find('{');
  if (open == std::string_view::npos) return key;
  const auto close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

std::uint16_t key_slot(std::string_view key) {
  return static_cast<std::uint16_t>(crc16(hash_part(key)) % kClusterSlots);
}

}  // namespace radixtier::shared
