// Content-addressed keys of the shared tier: no second index. A key is a function of what the
// value is, so every instance that computed the same bytes names them the same way, and an
// instance that needs them can name them from its prompt alone:
//
//   KV page          rt1:<model>:<namespace>:<path>:kv          (no hash tag: pages spread
//                                                              over every shard)
//   snapshot         rt1:{<model>:<namespace>:<path>}:m          the manifest
//                    rt1:{<model>:<namespace>:<path>}:c<i>       chunk i (a few MiB each)
//                    one hash tag, so a snapshot's parts live on one shard and age together
//
//   <model>      16 hex digits: ModelFingerprint::hash(), everything that changes the bytes
//                (model id, weights version, KV dtype, layout version, TP rank, geometry)
//   <namespace>  16 hex digits: the hash of the namespace's configured salt ("default" for the
//                default namespace): an instance never asks for a namespace it has no
//                salt for. Without a key unkeyed (XXH3) and readable in key names: it
//                separates namespaces for SharedTier, not for anyone with access to the
//                cluster; with a key (SharedTierConfig::namespace_keys) a keyed BLAKE2b of
//                the salt (docs/shared-tier.md, Security)
//   <path>       32 hex digits: the chained 128-bit path hash of the page or boundary
//                (store_record.hpp: extend_path), which covers every token from the root
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "radixtier/transfer/store_record.hpp"

namespace radixtier::shared {

/// Everything that makes two instances' bytes differ for the same tokens. Two instances share
/// only when every field is equal.
struct ModelFingerprint {
  std::string model_id;              ///< e.g. "Qwen/Qwen3-Next-80B-A3B-Instruct"
  std::string weights_version;       ///< a revision or checksum of the weights
  std::string kv_dtype;              ///< "bf16", "fp8_e4m3", ...
  std::uint32_t layout_version = 1;  ///< the engine's page/state layout
  std::uint32_t tp_rank = 0, tp_size = 1;
  std::uint32_t page_size = 0;       ///< tokens per page
  std::uint64_t page_bytes = 0;      ///< bytes of one KV page (all attention layers)
  std::uint64_t snapshot_bytes = 0;  ///< bytes of one recurrent-state snapshot

  /// XXH3-64 of a canonical encoding of every field.
  std::uint64_t hash() const;
};

/// The salt hash of a namespace ("default" for the default namespace).
std::uint64_t namespace_hash(std::string_view salt);
/// A keyed namespace's hash: keyed BLAKE2b of its salt under its key (SharedTierConfig::
/// namespace_keys), so its key names can be computed, and its values read or written, only
/// by whoever holds the key.
std::uint64_t namespace_hash(std::string_view salt, std::string_view key);

std::string hex64(std::uint64_t v);
std::string hex128(PathHash h);

/// The key prefix of one model and namespace: rt1:<model>:<namespace>.
struct KeySpace {
  std::uint64_t model = 0;
  std::uint64_t ns = 0;
  std::string key{};  ///< the namespace's MAC key ("" = unkeyed: value_codec.hpp)
  std::string kv_key(PathHash page) const;
  std::string manifest_key(PathHash boundary) const;
  std::string chunk_key(PathHash boundary, std::uint32_t chunk) const;
};

}  // namespace radixtier::shared
