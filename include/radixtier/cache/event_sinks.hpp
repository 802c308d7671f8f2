// EventSinks: the events part of PrefixCache. It owns the attached sinks (not the sinks
// themselves: each must outlive its attachment) and the quiet mode of a flush. What changed on
// a node is found by the cache (prefix_cache_events.cpp: each node keeps what was last
// reported of it); this part only delivers.
//
// Invariants: a sink is attached at most once; while quiet, no per-node event is delivered
// (the flush that set it sends AllBlocksCleared and the contents when it ends); a restart
// (AllBlocksCleared and the contents) reaches each sink in one on_restart() call.
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
    if (restart_ != nullptr) {
      restart_->push_back(event);
      return;
    }
    for (EventSink* s : sinks_) s->on_event(event);
  }
  /// Runs f() with every event it emits collected, then hands them to each sink attached
  /// (on_restart: a restart reaches a sink whole, never cut by a bounded queue).
  template <class F>
  void restart(F&& f) {
    std::vector<CacheEvent> events;
    restart_ = &events;
    f();
    restart_ = nullptr;
    for (std::size_t i = 0; i + 1 < sinks_.size(); ++i) sinks_[i]->on_restart(events);
    if (!sinks_.empty()) sinks_.back()->on_restart(std::move(events));
  }
  /// The first sink that lost events since its stream last restarted (nullptr: none).
  EventSink* lossy() const {
    for (EventSink* s : sinks_)
      if (s->lost_events()) return s;
    return nullptr;
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
  std::vector<CacheEvent>* restart_ = nullptr;  ///< set while restart() collects
};

}  // namespace radixtier
