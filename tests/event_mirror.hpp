// A router's copy of a cache's contents, rebuilt from KV events alone, and the same contents
// read from inspect(): the two must be equal after every operation.
#pragma once

#include <map>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "radixtier/cache/block_hash.hpp"
#include "radixtier/cache/events.hpp"
#include "radixtier/cache/prefix_cache.hpp"

namespace radixtier::testing {

struct EventMirror {
  std::map<std::pair<std::uint64_t, Medium>, std::vector<Token>> blocks;  ///< page tokens
  std::set<std::tuple<std::uint64_t, std::size_t, Medium>> snapshots;
  std::string error;  ///< the first event that contradicts the mirror (empty: none)
  std::size_t events = 0, cleared = 0;

  void fail(const std::string& why) {
    if (error.empty()) error = "event " + std::to_string(events) + ": " + why;
  }

  void apply(const CacheEvent& e) {
    ++events;
    if (const auto* s = std::get_if<BlockStored>(&e)) {
      if (s->block_size == 0 || s->token_ids.size() != s->block_hashes.size() * s->block_size)
        return fail("BlockStored: token count is not block_hashes x block_size");
      // A router recomputes every hash from the tokens and the parent (block_hash.hpp).
      std::uint64_t prev = s->parent_block_hash.value_or(s->lora_id.value_or(0));
      for (std::size_t i = 0; i < s->block_hashes.size(); ++i) {
        std::span<const Token> page(s->token_ids.data() + i * s->block_size, s->block_size);
        prev = block_hash(prev, page);
        if (prev != s->block_hashes[i]) return fail("BlockStored: hash not reproducible");
        if (!blocks
                 .emplace(std::pair{prev, s->medium}, std::vector<Token>(page.begin(), page.end()))
                 .second)
          return fail("BlockStored twice on " + std::string(to_string(s->medium)));
      }
    } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
      for (std::uint64_t h : r->block_hashes)
        if (blocks.erase({h, r->medium}) != 1) return fail("BlockRemoved of an unknown block");
    } else if (std::holds_alternative<AllBlocksCleared>(e)) {
      ++cleared;
      blocks.clear();
      snapshots.clear();
    } else if (const auto* ss = std::get_if<SnapshotStored>(&e)) {
      if (!snapshots.emplace(ss->block_hash, ss->boundary, ss->medium).second)
        return fail("SnapshotStored twice");
    } else if (const auto* sr = std::get_if<SnapshotRemoved>(&e)) {
      if (snapshots.erase({sr->block_hash, sr->boundary, sr->medium}) != 1)
        return fail("SnapshotRemoved of an unknown snapshot");
    }
  }

  /// The contents as inspect() reports them along every prompt in `known` (which must cover
  /// every sequence ever inserted, so that every node is reached).
  static EventMirror from_inspect(const PrefixCache& cache,
                                  std::span<const std::vector<Token>> known,
                                  NamespaceId ns = kDefaultNamespace) {
    EventMirror m;
    const std::uint32_t ps = cache.page_size();
    auto media = [](Residency r, bool on_store) {
      std::vector<Medium> out;
      if (r == Residency::kGpu || r == Residency::kBoth) out.push_back(Medium::kGpu);
      if (r == Residency::kHost || r == Residency::kBoth) out.push_back(Medium::kHost);
      if (on_store) out.push_back(Medium::kStore);
      return out;
    };
    for (const auto& tokens : known) {
      const std::vector<std::uint64_t> hashes = block_hashes(tokens, ps, ns.value());
      for (const NodeInfo& n : cache.inspect(tokens, ns)) {
        for (Medium md : media(n.kv, n.kv_on_store)) {
          for (std::size_t p = (n.boundary - n.tokens) / ps; p < n.matched / ps; ++p)
            m.blocks.try_emplace({hashes[p], md}, tokens.begin() + p * ps,
                                 tokens.begin() + (p + 1) * ps);
        }
        if (n.matched != n.boundary) continue;
        for (Medium md : media(n.snapshot, n.snapshot_on_store))
          m.snapshots.emplace(hashes[n.boundary / ps - 1], n.boundary, md);
      }
    }
    return m;
  }

  /// Adds another mirror's contents (the contents of several namespaces).
  void merge(const EventMirror& o) {
    blocks.insert(o.blocks.begin(), o.blocks.end());
    snapshots.insert(o.snapshots.begin(), o.snapshots.end());
  }

  /// Empty when both hold the same blocks (with the same tokens) and snapshots.
  std::string difference(const EventMirror& o) const {
    for (const auto& [k, t] : blocks) {
      auto it = o.blocks.find(k);
      if (it == o.blocks.end())
        return "block only in the first on " + std::string(to_string(k.second));
      if (it->second != t) return "block tokens differ";
    }
    for (const auto& [k, t] : o.blocks)
      if (!blocks.count(k))
        return "block only in the second on " + std::string(to_string(k.second));
    for (const auto& s : snapshots)
      if (!o.snapshots.count(s))
        return "snapshot at " + std::to_string(std::get<1>(s)) + " only in the first";
    for (const auto& s : o.snapshots)
      if (!snapshots.count(s))
        return "snapshot at " + std::to_string(std::get<1>(s)) + " only in the second";
    return {};
  }
};

}  // namespace radixtier::testing
