#include "radixtier/events/zmq_publisher.hpp"

#include <atomic>
#include <deque>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "kv_event_codec.hpp"

namespace radixtier {

bool zmq_endpoint_binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

std::string ZmqPublisherConfig::namespace_name(std::uint32_t ns) const {
  if (ns == kDefaultNamespace.value()) return {};
  auto it = namespace_names.find(ns);
  return it != namespace_names.end() ? it->second : "ns-" + std::to_string(ns);
}

Status ZmqPublisherConfig::validate() const {
  auto bad = [](const std::string& field, const std::string& why) {
    return invalid_argument("ZmqPublisherConfig." + field + " " + why);
  };
  if (endpoint.empty()) return bad("endpoint", "is empty");
  // An address may appear once, except a wildcard *port* ("tcp://127.0.0.1:*": a new port
  // each time it is bound). A wildcard host with a fixed port ("tcp://*:5557") is one port:
  // given twice, the second bind fails.
  std::set<std::string> bound;
  const std::pair<const char*, const std::string*> sockets[] = {
      {"endpoint", &endpoint},
      {"replay_endpoint", &replay_endpoint},
      {"snapshot_endpoint", &snapshot_endpoint},
      {"snapshot_replay_endpoint", &snapshot_replay_endpoint}};
  for (const auto& [field, e] : sockets) {
    if (e->empty() || e->ends_with(":*") || *e == "ipc://*") continue;
    if (!bound.insert(*e).second)
      return bad(field,
                 "= " + *e +
                     " is also given to another socket (endpoint, replay_endpoint, "
                     "snapshot_endpoint, snapshot_replay_endpoint): each needs its own port");
  }
  if (snapshot_endpoint.empty() && !snapshot_replay_endpoint.empty())
    return bad("snapshot_replay_endpoint", "needs a snapshot_endpoint");
  if (!snapshot_endpoint.empty() && snapshot_topic.empty())
    return bad("snapshot_topic", "is empty (a subscriber of \"\" would take both streams apart)");
  if (data_parallel_rank < 0)
    return bad("data_parallel_rank", "= " + std::to_string(data_parallel_rank) + " is negative");
  if (namespace_field == NamespaceField::kCacheSalt && wire_format != WireFormat::kVllmCurrent)
    return bad("namespace_field",
               "cache-salt needs wire_format vllm-current (a positional event has no "
               "cache_salt slot; use lora-name)");
  std::set<std::string> names;
  for (const auto& [ns, name] : namespace_names) {
    const std::string which = "namespace_names[" + std::to_string(ns) + "]";
    if (ns == kDefaultNamespace.value())
      return bad(which, "names the default namespace, which goes out without a name");
    if (name.empty()) return bad(which, "is empty");
    if (!names.insert(name).second) return bad(which, "\"" + name + "\" names two namespaces");
  }
  for (const auto& [ns, name] : namespace_names) {
    // "ns-<k>" is namespace k's default name: another namespace must not take it.
    if (name.starts_with("ns-") && name != "ns-" + std::to_string(ns) &&
        name.find_first_not_of("0123456789", 3) == std::string::npos && name.size() > 3)
      return bad("namespace_names[" + std::to_string(ns) + "]",
                 "\"" + name + "\" is another namespace's default name");
  }
  if (queue_capacity == 0) return bad("queue_capacity", "must be > 0");
  if (max_batch_events == 0) return bad("max_batch_events", "must be > 0");
  return Status::ok();
}

namespace {
std::string be64(std::int64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(static_cast<std::uint64_t>(v) >> (8 * (7 - i)));
  return out;
}

std::int64_t from_be64(const void* data) {
  const auto* b = static_cast<const unsigned char*>(data);
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return static_cast<std::int64_t>(v);
}

/// One PUB socket with its topic, sequence numbers and (optionally) a ROUTER replay socket.
/// Everything but the counters is the publisher thread's alone once it runs.
struct Stream {
  std::string topic;
  std::size_t replay_buffer = 0;
  ReplayFormat replay_format = ReplayFormat::kTopicSeqPayload;
  zmq::socket_t pub, replay;
  bool has_replay = false;
  std::string endpoint, replay_endpoint;
  std::deque<std::pair<std::uint64_t, std::string>> kept;
  std::atomic<std::uint64_t> seq{0};

  Stream(zmq::context_t& ctx, const ZmqPublisherConfig& c, std::string t)
      : topic(std::move(t)),
        replay_buffer(c.replay_buffer),
        replay_format(c.replay_format),
        pub(ctx, zmq::socket_type::pub),
        replay(ctx, zmq::socket_type::router) {}

  /// Binds or connects the PUB socket (vLLM's rule) and binds the replay socket; throws
  /// zmq::error_t.
  void open(const std::string& pub_at, const std::string& replay_at) {
    pub.set(zmq::sockopt::linger, 0);
    if (zmq_endpoint_binds(pub_at)) {
      pub.bind(pub_at);
      endpoint = pub.get(zmq::sockopt::last_endpoint);
    } else {
      pub.connect(pub_at);
      endpoint = pub_at;
    }
    if (replay_at.empty()) return;
    replay.set(zmq::sockopt::linger, 0);
    // A replay answers with up to replay_buffer messages at once: past the default
    // high-water mark a ROUTER drops them silently (the end marker too). The queue is
    // bounded by replay_buffer per request anyway.
    replay.set(zmq::sockopt::sndhwm, 0);
    replay.bind(replay_at);
    replay_endpoint = replay.get(zmq::sockopt::last_endpoint);
    has_replay = true;
  }

  void publish(std::string payload) {
    const std::uint64_t s = seq.load(std::memory_order_relaxed);
    const std::string s_bytes = be64(static_cast<std::int64_t>(s));
    // PUB never blocks: past the high-water mark a slow subscriber loses messages (and can
    // ask the replay socket for them).
    pub.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    pub.send(zmq::buffer(s_bytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    if (has_replay && replay_buffer > 0) {
      kept.emplace_back(s, std::move(payload));
      while (kept.size() > replay_buffer) kept.pop_front();
    }
    seq.store(s + 1, std::memory_order_release);
  }

  void serve_replay() {
    std::vector<zmq::message_t> frames;
    for (;;) {
      zmq::message_t m;
      if (!replay.recv(m, zmq::recv_flags::dontwait)) return;
      const bool more = m.more();
      frames.push_back(std::move(m));
      if (more) continue;
      // [identity, (empty delimiter), start]: answer in the same envelope.
      if (frames.size() >= 2 && frames.back().size() == 8) {
        const std::int64_t start = from_be64(frames.back().data());
        const bool delimited = frames.size() >= 3;
        const bool with_topic = replay_format == ReplayFormat::kTopicSeqPayload;
        auto reply = [&](const std::string& t, const std::string& s, const std::string& body) {
          constexpr auto more_now = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
          replay.send(zmq::buffer(frames[0].data(), frames[0].size()), more_now);
          if (delimited) replay.send(zmq::str_buffer(""), more_now);
          if (with_topic) replay.send(zmq::buffer(t), more_now);
          replay.send(zmq::buffer(s), more_now);
          replay.send(zmq::buffer(body), zmq::send_flags::dontwait);
        };
        for (const auto& [s, payload] : kept)
          if (static_cast<std::int64_t>(s) >= start)
            reply(topic, be64(static_cast<std::int64_t>(s)), payload);
        reply(std::string(), be64(-1), std::string());
      }
      frames.clear();
    }
  }
};
}  // namespace

struct ZmqPublisher::Impl {
  ZmqPublisherConfig config;
  std::unique_ptr<EventQueue> queue;
  zmq::context_t context{1};
  Stream vllm{context, config, config.topic};
  std::optional<Stream> full;                      ///< the full stream (snapshot_endpoint set)
  std::atomic<std::uint64_t> published_events{0};  ///< events taken from the queue and sent
  std::atomic<bool> stop{false};
  std::thread thread;

  explicit Impl(const ZmqPublisherConfig& c) : config(c) {
    if (!config.snapshot_endpoint.empty()) full.emplace(context, config, config.snapshot_topic);
  }

  /// Takes what is queued (at most a batch) and sends it; false if the queue was empty.
  bool publish_some() {
    std::vector<CacheEvent> events;
    CacheEvent e;
    std::size_t taken = 0;
    while (taken < config.max_batch_events && queue->pop(e)) {
      ++taken;
      if (published(e)) events.push_back(std::move(e));
    }
    if (taken == 0) return false;
    if (events.empty()) {
      published_events.fetch_add(taken, std::memory_order_release);
      return true;
    }
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    // A batch of snapshot events only is not sent on the vLLM stream (an empty batch).
    bool any_vllm = false;
    for (const CacheEvent& ev : events) any_vllm |= !events::is_snapshot(ev);
    if (any_vllm) vllm.publish(events::encode_batch(ts, events, config, false));
    if (full) full->publish(events::encode_batch(ts, events, config, true));
    published_events.fetch_add(taken, std::memory_order_release);
    return true;
  }

  /// Whether the media filter lets `e` out (AllBlocksCleared always goes).
  bool published(const CacheEvent& e) const {
    if (config.media == MediaFilter::kAll) return true;
    return std::visit(
        [](const auto& ev) {
          if constexpr (requires { ev.medium; }) {
            return ev.medium == Medium::kGpu;
          } else {
            return true;
          }
        },
        e);
  }

  void run() {
    std::vector<zmq::pollitem_t> items;
    std::vector<Stream*> replaying;
    for (Stream* s : {&vllm, full ? &*full : nullptr}) {
      if (s == nullptr || !s->has_replay) continue;
      items.push_back({s->replay.handle(), 0, ZMQ_POLLIN, 0});
      replaying.push_back(s);
    }
    for (;;) {
      const bool stopping = stop.load(std::memory_order_acquire);
      while (publish_some()) {
      }
      if (stopping) return;
      if (items.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(2));
      for (std::size_t i = 0; i < items.size(); ++i)
        if (items[i].revents & ZMQ_POLLIN) replaying[i]->serve_replay();
    }
  }
};

Result<std::unique_ptr<ZmqPublisher>> ZmqPublisher::create(const ZmqPublisherConfig& config) {
  if (Status s = config.validate(); !s) return s;
  auto impl = std::make_unique<Impl>(config);
  impl->queue = std::move(EventQueue::create(config.queue_capacity)).value();
  auto open = [](Stream& s, const std::string& pub_at, const std::string& replay_at) -> Status {
    try {
      s.open(pub_at, replay_at);
      return Status::ok();
    } catch (const zmq::error_t& e) {
      return Status(ErrorCode::kInvalidArgument,
                    std::string("ZmqPublisher: cannot ") +
                        (zmq_endpoint_binds(pub_at) ? "bind " : "connect ") + pub_at +
                        (replay_at.empty() ? "" : " / bind " + replay_at) + ": " + e.what());
    }
  };
  if (Status s = open(impl->vllm, config.endpoint, config.replay_endpoint); !s) return s;
  if (impl->full) {
    Status s = open(*impl->full, config.snapshot_endpoint, config.snapshot_replay_endpoint);
    if (!s) return s;
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<ZmqPublisher>(new ZmqPublisher(std::move(impl)));
}

ZmqPublisher::ZmqPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ZmqPublisher::~ZmqPublisher() {
  impl_->stop.store(true, std::memory_order_release);
  impl_->thread.join();
}

EventSink& ZmqPublisher::sink() {
  return *impl_->queue;
}
std::uint64_t ZmqPublisher::dropped() const {
  return impl_->queue->dropped();
}
std::uint64_t ZmqPublisher::restarts() const {
  return impl_->queue->restarts();
}
const EventQueue& ZmqPublisher::queue() const {
  return *impl_->queue;
}
std::uint64_t ZmqPublisher::batches() const {
  return impl_->vllm.seq.load(std::memory_order_acquire);
}
std::uint64_t ZmqPublisher::snapshot_batches() const {
  return impl_->full ? impl_->full->seq.load(std::memory_order_acquire) : 0;
}
const std::string& ZmqPublisher::endpoint() const {
  return impl_->vllm.endpoint;
}
const std::string& ZmqPublisher::replay_endpoint() const {
  return impl_->vllm.replay_endpoint;
}
const std::string& ZmqPublisher::snapshot_endpoint() const {
  static const std::string none;
  return impl_->full ? impl_->full->endpoint : none;
}
const std::string& ZmqPublisher::snapshot_replay_endpoint() const {
  static const std::string none;
  return impl_->full ? impl_->full->replay_endpoint : none;
}

bool ZmqPublisher::flush(std::chrono::milliseconds timeout) {
  const std::uint64_t target = impl_->queue->pushed();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // A restart that replaced queued events (superseded) is what publishes them.
  while (impl_->published_events.load(std::memory_order_acquire) + impl_->queue->superseded() <
         target) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace radixtier
