#include "kv_event_codec.hpp"

#include <msgpack.hpp>
#include <optional>

namespace radixtier::events {

namespace {
using Packer = msgpack::packer<msgpack::sbuffer>;

/// One tagged event: a map {"type": tag, name: value...} or an array [tag, value...]. The
/// caller packs each value right after field(name), in the declared order.
class Record {
 public:
  Record(Packer& p, bool as_map, std::string_view tag, std::uint32_t fields)
      : p_(p), as_map_(as_map) {
    if (as_map_) {
      p_.pack_map(fields + 1);
      p_.pack(std::string_view("type"));
    } else {
      p_.pack_array(fields + 1);
    }
    p_.pack(tag);
  }
  Packer& field(std::string_view name) {
    if (as_map_) p_.pack(name);
    return p_;
  }

 private:
  Packer& p_;
  bool as_map_;
};

void pack_hashes(Packer& p, const std::vector<std::uint64_t>& hashes) {
  p.pack_array(static_cast<std::uint32_t>(hashes.size()));
  for (std::uint64_t h : hashes) p.pack_uint64(h);
}

void pack_optional(Packer& p, const std::optional<std::uint64_t>& v) {
  if (v) {
    p.pack_uint64(*v);
  } else {
    p.pack_nil();
  }
}

void pack_name(Packer& p, const std::string& name) {
  if (name.empty()) {
    p.pack_nil();
  } else {
    p.pack(name);
  }
}

struct Encode {
  Packer& p;
  const ZmqPublisherConfig& config;
  bool as_map = config.wire_format == WireFormat::kVllmCurrent;

  void operator()(const BlockStored& e) const {
    // The namespace: its id as lora_id and its name as lora_name, or its name as cache_salt.
    const std::string name = e.lora_id ? config.namespace_name(*e.lora_id) : std::string();
    const bool salt = config.namespace_field == NamespaceField::kCacheSalt;
    Record r(p, as_map, "BlockStored", salt ? 8 : 7);
    pack_hashes(r.field("block_hashes"), e.block_hashes);
    pack_optional(r.field("parent_block_hash"), e.parent_block_hash);
    Packer& tokens = r.field("token_ids");
    tokens.pack_array(static_cast<std::uint32_t>(e.token_ids.size()));
    for (Token t : e.token_ids) tokens.pack_int32(t);
    r.field("block_size").pack_uint32(e.block_size);
    pack_optional(r.field("lora_id"), salt ? std::nullopt : e.lora_id);
    r.field("medium").pack(std::string_view(to_string(e.medium)));
    pack_name(r.field("lora_name"), salt ? std::string() : name);
    if (salt) pack_name(r.field("cache_salt"), name);  // map events only (validate())
  }
  void operator()(const BlockRemoved& e) const {
    Record r(p, as_map, "BlockRemoved", 2);
    pack_hashes(r.field("block_hashes"), e.block_hashes);
    r.field("medium").pack(std::string_view(to_string(e.medium)));
  }
  void operator()(const AllBlocksCleared&) const { Record(p, as_map, "AllBlocksCleared", 0); }
  void snapshot(std::string_view tag, std::uint64_t hash, std::size_t boundary, Medium m) const {
    Record r(p, as_map, tag, 3);
    r.field("block_hash").pack_uint64(hash);
    r.field("boundary").pack_uint64(boundary);
    r.field("medium").pack(std::string_view(to_string(m)));
  }
  void operator()(const SnapshotStored& e) const {
    snapshot("SnapshotStored", e.block_hash, e.boundary, e.medium);
  }
  void operator()(const SnapshotRemoved& e) const {
    snapshot("SnapshotRemoved", e.block_hash, e.boundary, e.medium);
  }
};
}  // namespace

bool is_snapshot(const CacheEvent& e) {
  return std::holds_alternative<SnapshotStored>(e) || std::holds_alternative<SnapshotRemoved>(e);
}

std::string encode_batch(double ts, std::span<const CacheEvent> events,
                         const ZmqPublisherConfig& config, bool snapshots) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_array(3);
  p.pack_double(ts);
  std::uint32_t n = 0;
  for (const CacheEvent& e : events) n += snapshots || !is_snapshot(e);
  p.pack_array(n);
  const Encode encode{p, config};
  for (const CacheEvent& e : events)
    if (snapshots || !is_snapshot(e)) std::visit(encode, e);
  p.pack_int(config.data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

}  // namespace radixtier::events
