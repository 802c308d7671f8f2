#include "kv_event_codec.hpp"

#include <msgpack.hpp>

namespace radixtier::events {

namespace {
using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& p, const char* s) {
  p.pack(std::string_view(s));
}

void pack_hashes(Packer& p, const std::vector<std::uint64_t>& hashes) {
  p.pack_array(static_cast<std::uint32_t>(hashes.size()));
  for (std::uint64_t h : hashes) p.pack_uint64(h);
}

struct Encode {
  Packer& p;
  void operator()(const BlockStored& e) const {
    p.pack_array(7);
    pack_str(p, "BlockStored");
    pack_hashes(p, e.block_hashes);
    if (e.parent_block_hash) {
      p.pack_uint64(*e.parent_block_hash);
    } else {
      p.pack_nil();
    }
    p.pack_array(static_cast<std::uint32_t>(e.token_ids.size()));
    for (Token t : e.token_ids) p.pack_int32(t);
    p.pack_uint32(e.block_size);
    if (e.lora_id) {  // the key namespace
      p.pack_uint32(*e.lora_id);
    } else {
      p.pack_nil();
    }
    pack_str(p, to_string(e.medium));
  }
  void operator()(const BlockRemoved& e) const {
    p.pack_array(3);
    pack_str(p, "BlockRemoved");
    pack_hashes(p, e.block_hashes);
    pack_str(p, to_string(e.medium));
  }
  void operator()(const AllBlocksCleared&) const {
    p.pack_array(1);
    pack_str(p, "AllBlocksCleared");
  }
  void operator()(const SnapshotStored& e) const {
    p.pack_array(4);
    pack_str(p, "SnapshotStored");
    p.pack_uint64(e.block_hash);
    p.pack_uint64(e.boundary);
    pack_str(p, to_string(e.medium));
  }
  void operator()(const SnapshotRemoved& e) const {
    p.pack_array(4);
    pack_str(p, "SnapshotRemoved");
    p.pack_uint64(e.block_hash);
    p.pack_uint64(e.boundary);
    pack_str(p, to_string(e.medium));
  }
};

bool is_snapshot(const CacheEvent& e) {
  return std::holds_alternative<SnapshotStored>(e) || std::holds_alternative<SnapshotRemoved>(e);
}
}  // namespace

std::string encode_batch(double ts, std::span<const CacheEvent> events, bool snapshots,
                         int data_parallel_rank) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_array(data_parallel_rank < 0 ? 2 : 3);
  p.pack_double(ts);
  std::uint32_t n = 0;
  for (const CacheEvent& e : events) n += snapshots || !is_snapshot(e);
  p.pack_array(n);
  for (const CacheEvent& e : events)
    if (snapshots || !is_snapshot(e)) std::visit(Encode{p}, e);
  if (data_parallel_rank >= 0) p.pack_int(data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

}  // namespace radixtier::events
