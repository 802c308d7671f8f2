#include "baseline/host_prefix_index.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace radixtier::index_tier {

HostPrefixIndex::HostPrefixIndex(std::uint32_t page_size, std::uint32_t host_pages,
                                 std::uint32_t host_snapshot_slots, std::size_t page_bytes,
                                 std::size_t snapshot_bytes)
    : page_size_(page_size),
      page_bytes_(page_bytes),
      snapshot_bytes_(snapshot_bytes),
      pages_(host_pages),
      slots_(host_snapshot_slots) {}

std::string HostPrefixIndex::key_of(std::span<const Token> tokens) {
  std::string key(tokens.size() * sizeof(Token), '\0');
  if (!tokens.empty()) std::memcpy(key.data(), tokens.data(), key.size());
  return key;
}

const HostEntry* HostPrefixIndex::lookup(std::span<const Token> tokens) {
  ++stats_.lookups;
  const std::size_t longest = tokens.size() / page_size_ * page_size_;
  for (std::size_t len = longest; len >= page_size_; len -= page_size_) {
    stats_.hashed_tokens += len;
    auto it = map_.find(key_of(tokens.first(len)));
    if (it != map_.end()) {
      touch(it->second);
      return &*it->second;
    }
  }
  return nullptr;
}

const HostEntry* HostPrefixIndex::lookup_exact(std::span<const Token> prefix) {
  ++stats_.lookups;
  stats_.hashed_tokens += prefix.size();
  auto it = map_.find(key_of(prefix));
  if (it == map_.end()) return nullptr;
  touch(it->second);
  return &*it->second;
}

void HostPrefixIndex::put(std::span<const Token> prefix, std::optional<std::vector<HostPageId>> kv,
                          HostSlotId snapshot) {
  assert(prefix.size() % page_size_ == 0);
  assert(!kv || kv->size() * page_size_ == prefix.size());
  std::string key = key_of(prefix);
  auto it = map_.find(key);
  if (it == map_.end()) {
    lru_.push_front(HostEntry{{prefix.begin(), prefix.end()}, std::nullopt, HostSlotId()});
    it = map_.emplace(std::move(key), lru_.begin()).first;
  } else {
    touch(it->second);
  }
  HostEntry& e = *it->second;
  if (kv) {
    if (e.kv) {
      for (HostPageId p : *e.kv) pages_.give_back(p);
      stats_.pages_freed += e.kv->size();
    }
    e.kv = std::move(kv);
  }
  if (snapshot.valid()) {
    if (e.snapshot.valid()) {
      slots_.give_back(e.snapshot);
      ++stats_.slots_replaced;
    }
    e.snapshot = snapshot;
  }
  note_peak();
}

void HostPrefixIndex::release(HostEntry& e, bool dropping) {
  if (e.kv) {
    for (HostPageId p : *e.kv) pages_.give_back(p);
    stats_.pages_freed += e.kv->size();
    e.kv.reset();
  }
  if (e.snapshot.valid()) {
    slots_.give_back(e.snapshot);
    if (dropping) ++stats_.slots_dropped;
    e.snapshot = HostSlotId();
  }
}

bool HostPrefixIndex::drop_oldest() {
  if (lru_.empty()) return false;
  HostEntry& e = lru_.back();
  release(e, true);
  map_.erase(key_of(e.tokens));
  lru_.pop_back();
  ++stats_.entries_dropped;
  return true;
}

std::optional<std::vector<HostPageId>> HostPrefixIndex::alloc_kv(std::size_t n) {
  if (n > pages_.capacity()) return std::nullopt;
  while (pages_.free_count() < n) {
    const bool dropped = drop_oldest();
    assert(dropped);
    (void)dropped;
  }
  std::vector<HostPageId> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(*pages_.take(Holder::kNode));
  note_peak();
  return out;
}

HostSlotId HostPrefixIndex::alloc_snapshot_slot() {
  auto slot = slots_.take(Holder::kNode);
  if (!slot) return HostSlotId();
  note_peak();
  return *slot;
}

void HostPrefixIndex::free_kv(std::span<const HostPageId> pages) {
  for (HostPageId p : pages) pages_.give_back(p);
}

void HostPrefixIndex::free_snapshot_slot(HostSlotId slot) {
  slots_.give_back(slot);
}

std::uint64_t HostPrefixIndex::bytes_in_use() const {
  return std::uint64_t{pages_.count(Holder::kNode)} * page_bytes_ +
         std::uint64_t{slots_.count(Holder::kNode)} * snapshot_bytes_;
}

void HostPrefixIndex::note_peak() {
  stats_.bytes_peak = std::max(stats_.bytes_peak, bytes_in_use());
}

std::string HostPrefixIndex::check() const {
  if (std::string e = pages_.check("host pages"); !e.empty()) return e;
  if (std::string e = slots_.check("host snapshot slots"); !e.empty()) return e;
  if (map_.size() != lru_.size()) return "host index: map and LRU list sizes differ";
  std::vector<bool> page_seen(pages_.capacity(), false), slot_seen(slots_.capacity(), false);
  std::size_t pages = 0, slots = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto m = map_.find(key_of(it->tokens));
    if (m == map_.end() || m->second != it) return "host index: entry not keyed by its prefix";
    if (it->tokens.empty() || it->tokens.size() % page_size_ != 0)
      return "host index: entry prefix is empty or not page-aligned";
    if (it->kv) {
      if (it->kv->size() * page_size_ != it->tokens.size())
        return "host index: entry KV does not cover its whole prefix";
      for (HostPageId p : *it->kv) {
        if (!pages_.in_range(p) || pages_.holder(p) != Holder::kNode || page_seen[p.value()])
          return "host index: host page not held exactly once";
        page_seen[p.value()] = true;
      }
      pages += it->kv->size();
    }
    if (it->snapshot.valid()) {
      const HostSlotId s = it->snapshot;
      if (!slots_.in_range(s) || slots_.holder(s) != Holder::kNode || slot_seen[s.value()])
        return "host index: host snapshot slot not held exactly once";
      slot_seen[s.value()] = true;
      ++slots;
    }
  }
  if (pages != pages_.count(Holder::kNode)) return "host index: host pages leaked";
  if (slots != slots_.count(Holder::kNode)) return "host index: host snapshot slots leaked";
  return {};
}

}  // namespace radixtier::index_tier
