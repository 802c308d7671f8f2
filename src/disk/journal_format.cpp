#include "journal_format.hpp"

#include <xxhash.h>

#include <cstring>
#include <string>

namespace radixtier::disk::format {

namespace {

constexpr std::uint32_t kHeaderMagic = 0x48445452;   // "RTDH"
constexpr std::uint32_t kJournalMagic = 0x4a445452;  // "RTDJ"
constexpr std::uint32_t kEntryMagic = 0x454a5452;    // "RTJE"
constexpr std::uint32_t kEndianMarker = 0x01020304;
constexpr std::uint64_t kSeed = 0x72746469736b3031ULL;

class Writer {
 public:
  explicit Writer(std::vector<std::byte>& out) : out_(out) {}
  template <class T>
  void put(T v) {
    const std::size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void put_bytes(const void* p, std::size_t n) {
    const std::size_t at = out_.size();
    out_.resize(at + n);
    if (n > 0) std::memcpy(out_.data() + at, p, n);
  }

 private:
  std::vector<std::byte>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <class T>
  bool get(T& v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_bytes(void* p, std::size_t n) {
    if (in_.size() - pos_ < n) return false;
    if (n > 0) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::size_t pos() const { return pos_; }
  std::size_t left() const { return in_.size() - pos_; }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

std::uint64_t hash(const std::byte* p, std::size_t n) {
  return XXH3_64bits_withSeed(p, n, kSeed);
}

Status corrupt(const std::string& what) {
  return {ErrorCode::kDataLoss, "store header is unreadable: " + what};
}

}  // namespace

std::vector<std::byte> encode_header(const StoreHeader& h) {
  std::vector<std::byte> out;
  Writer w(out);
  w.put(kHeaderMagic);
  w.put(kFormatVersion);
  w.put(kEndianMarker);
  w.put(std::uint32_t{0});
  w.put(h.store_id);
  w.put(h.fingerprint.page_tokens);
  w.put(std::uint32_t{0});
  w.put(h.fingerprint.page_bytes);
  w.put(h.fingerprint.snapshot_bytes);
  w.put(static_cast<std::uint32_t>(h.fingerprint.model_id.size()));
  w.put(static_cast<std::uint32_t>(h.fingerprint.weights_version.size()));
  w.put_bytes(h.fingerprint.model_id.data(), h.fingerprint.model_id.size());
  w.put_bytes(h.fingerprint.weights_version.data(), h.fingerprint.weights_version.size());
  w.put(hash(out.data(), out.size()));
  return out;
}

Result<StoreHeader> decode_header(std::span<const std::byte> bytes) {
  constexpr std::size_t kFixedBytes = 64;  // every field but the two strings, and the checksum
  if (bytes.size() < kFixedBytes) {
    return corrupt("truncated (" + std::to_string(bytes.size()) + " bytes)");
  }
  std::uint64_t want = 0;
  std::memcpy(&want, bytes.data() + bytes.size() - 8, 8);
  Reader r(bytes.first(bytes.size() - 8));
  std::uint32_t magic = 0, version = 0, endian = 0, pad = 0, ml = 0, wl = 0;
  StoreHeader h;
  if (!r.get(magic) || magic != kHeaderMagic) return corrupt("not a radixtier disk store");
  if (!r.get(version) || version != kFormatVersion) {
    return corrupt("format version " + std::to_string(version) + ", this build reads " +
                   std::to_string(kFormatVersion));
  }
  if (!r.get(endian) || endian != kEndianMarker) return corrupt("written on another byte order");
  if (!r.get(pad) || !r.get(h.store_id) || !r.get(h.fingerprint.page_tokens) || !r.get(pad) ||
      !r.get(h.fingerprint.page_bytes) || !r.get(h.fingerprint.snapshot_bytes) || !r.get(ml) ||
      !r.get(wl) || ml > 4096 || wl > 4096 || r.left() != std::size_t{ml} + wl) {
    return corrupt("truncated or malformed");
  }
  h.fingerprint.model_id.resize(ml);
  h.fingerprint.weights_version.resize(wl);
  (void)r.get_bytes(h.fingerprint.model_id.data(), ml);
  (void)r.get_bytes(h.fingerprint.weights_version.data(), wl);
  if (hash(bytes.data(), bytes.size() - 8) != want) return corrupt("checksum mismatch");
  return h;
}

std::vector<std::byte> encode_journal_prologue(std::uint64_t store_id, std::uint64_t first_id) {
  std::vector<std::byte> out;
  Writer w(out);
  w.put(kJournalMagic);
  w.put(kFormatVersion);
  w.put(store_id);
  w.put(first_id);
  w.put(hash(out.data(), out.size()));
  return out;
}

Result<std::uint64_t> check_journal_prologue(std::span<const std::byte> bytes,
                                             std::uint64_t store_id) {
  if (bytes.size() < kJournalPrologueBytes) {
    return Status(ErrorCode::kDataLoss, "journal prologue is truncated");
  }
  std::uint32_t magic = 0, version = 0;
  std::uint64_t id = 0, first_id = 0, sum = 0;
  Reader r(bytes.first(kJournalPrologueBytes));
  (void)(r.get(magic) && r.get(version) && r.get(id) && r.get(first_id) && r.get(sum));
  if (magic != kJournalMagic || version != kFormatVersion ||
      sum != hash(bytes.data(), kJournalPrologueBytes - 8)) {
    return Status(ErrorCode::kDataLoss, "journal prologue is corrupt");
  }
  if (id != store_id) {
    return Status(ErrorCode::kDataLoss, "journal belongs to another store (store id mismatch)");
  }
  return first_id;
}

namespace {

void append_entry(std::vector<std::byte>& out, EntryType type, std::uint64_t seq,
                  const std::vector<std::byte>& payload) {
  const std::size_t start = out.size();
  Writer w(out);
  w.put(kEntryMagic);
  w.put(static_cast<std::uint16_t>(type));
  w.put(std::uint16_t{0});
  w.put(static_cast<std::uint32_t>(payload.size()));
  w.put(std::uint32_t{0});
  w.put(seq);
  w.put(std::uint64_t{0});  // the checksum, filled below
  w.put_bytes(payload.data(), payload.size());
  const std::uint64_t sum = hash(out.data() + start, out.size() - start);
  std::memcpy(out.data() + start + kEntryHeaderBytes - 8, &sum, 8);
}

}  // namespace

void append_commit(std::vector<std::byte>& out, std::uint64_t seq, const RecordInfo& rec) {
  std::vector<std::byte> p;
  Writer w(p);
  w.put(rec.id.value());
  w.put(static_cast<std::uint8_t>(rec.desc.kind));
  for (int i = 0; i < 7; ++i) w.put(std::uint8_t{0});
  w.put(rec.desc.boundary);
  w.put(rec.desc.parent.lo);
  w.put(rec.desc.parent.hi);
  w.put(rec.desc.path.lo);
  w.put(rec.desc.path.hi);
  w.put(rec.checksum);
  w.put(static_cast<std::uint32_t>(rec.desc.tokens.size()));
  w.put(static_cast<std::uint32_t>(rec.slots.size()));
  for (Token t : rec.desc.tokens) w.put(t);
  for (DiskSlotId s : rec.slots) w.put(s.value());
  append_entry(out, EntryType::kCommit, seq, p);
}

void append_free(std::vector<std::byte>& out, std::uint64_t seq, RecordId id) {
  std::vector<std::byte> p;
  Writer w(p);
  w.put(id.value());
  append_entry(out, EntryType::kFree, seq, p);
}

std::optional<DecodedEntry> decode_entry(std::span<const std::byte> data, std::size_t pos,
                                         std::uint64_t expected_seq) {
  if (pos > data.size() || data.size() - pos < kEntryHeaderBytes) return std::nullopt;
  Reader h(data.subspan(pos, kEntryHeaderBytes));
  std::uint32_t magic = 0, len = 0, pad32 = 0;
  std::uint16_t type = 0, pad16 = 0;
  std::uint64_t seq = 0, sum = 0;
  (void)(h.get(magic) && h.get(type) && h.get(pad16) && h.get(len) && h.get(pad32) && h.get(seq) &&
         h.get(sum));
  if (magic != kEntryMagic || len > kMaxEntryPayload || seq != expected_seq) return std::nullopt;
  if (data.size() - pos - kEntryHeaderBytes < len) return std::nullopt;  // torn
  std::vector<std::byte> copy(
      data.begin() + static_cast<std::ptrdiff_t>(pos),
      data.begin() + static_cast<std::ptrdiff_t>(pos + kEntryHeaderBytes + len));
  std::memset(copy.data() + kEntryHeaderBytes - 8, 0, 8);
  if (hash(copy.data(), copy.size()) != sum) return std::nullopt;

  DecodedEntry out;
  out.bytes = kEntryHeaderBytes + len;
  out.entry.seq = seq;
  Reader r(std::span<const std::byte>(copy).subspan(kEntryHeaderBytes));
  std::uint64_t id = 0;
  if (!r.get(id)) return std::nullopt;
  out.entry.record.id = RecordId(id);
  if (type == static_cast<std::uint16_t>(EntryType::kFree)) {
    out.entry.type = EntryType::kFree;
    return r.left() == 0 ? std::optional(out) : std::nullopt;
  }
  if (type != static_cast<std::uint16_t>(EntryType::kCommit)) return std::nullopt;
  out.entry.type = EntryType::kCommit;
  RecordInfo& rec = out.entry.record;
  std::uint8_t kind = 0, pad8 = 0;
  std::uint32_t nt = 0, ns = 0;
  bool ok = r.get(kind);
  for (int i = 0; i < 7; ++i) ok = ok && r.get(pad8);
  ok = ok && r.get(rec.desc.boundary) && r.get(rec.desc.parent.lo) && r.get(rec.desc.parent.hi) &&
       r.get(rec.desc.path.lo) && r.get(rec.desc.path.hi) && r.get(rec.checksum) && r.get(nt) &&
       r.get(ns);
  if (!ok || (kind != 1 && kind != 2)) return std::nullopt;
  if (r.left() != std::size_t{nt} * sizeof(Token) + std::size_t{ns} * 4) return std::nullopt;
  rec.desc.kind = static_cast<RecordKind>(kind);
  rec.desc.tokens.resize(nt);
  (void)r.get_bytes(rec.desc.tokens.data(), std::size_t{nt} * sizeof(Token));
  rec.slots.reserve(ns);
  for (std::uint32_t i = 0; i < ns; ++i) {
    std::uint32_t s = 0;
    (void)r.get(s);
    rec.slots.push_back(DiskSlotId(s));
  }
  return out;
}

}  // namespace radixtier::disk::format
