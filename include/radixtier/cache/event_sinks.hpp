// EventSinks: the events part of PrefixCache. It owns the attached sinks (not the sinks
// themselves: each must outlive its attachment) and the quiet mode of a flush. What changed on
// a node is found by the cache (prefix_cache_events.cpp: each node keeps what was last
// reported of it); this part only delivers.
//
// Invariants: a sink is attached at most once; while quiet, no per-node event is delivered
// (the flush that set it sends AllBlocksCleared and the contents when it ends).
#pragma once

#include <algorithm>
#include <vector>

#include "radixtier/cache/events.hpp"

namespace radixtier {

class EventSinks {
 public:
  bool empty() const { return sinks_.empty(); }
  void add(EventSink* sink) {
    if (std::find(sinks_.begin(), sinks_.end(), sink) == sinks_.end()) sinks_.push_back(sink);
  }
  void remove(EventSink* sink) {
    sinks_.erase(std::remove(sinks_.begin(), sinks_.end(), sink), sinks_.end());
  }
  void emit(const CacheEvent& event) const {
    for (EventSink* s : sinks_) s->on_event(event);
  }
  /// Runs f() with `sink` the only one attached (a stream restarted for one sink alone).
  template <class F>
  void only(EventSink* sink, F&& f) {
    std::vector<EventSink*> all{sink};
    all.swap(sinks_);
    f();
    sinks_.swap(all);
  }

  /// flush(): the nodes' reports are updated but nothing is sent until it ends.
  bool quiet = false;

 private:
  std::vector<EventSink*> sinks_;
};

}  // namespace radixtier
