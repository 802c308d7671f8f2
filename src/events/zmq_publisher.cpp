#include "radixtier/events/zmq_publisher.hpp"

#include <atomic>
#include <deque>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "kv_event_codec.hpp"

namespace radixtier {

Status ZmqPublisherConfig::validate() const {
  auto bad = [](const std::string& field, const std::string& why) {
    return invalid_argument("ZmqPublisherConfig." + field + " " + why);
  };
  if (endpoint.empty()) return bad("endpoint", "is empty");
  if (!replay_endpoint.empty() && replay_endpoint == endpoint &&
      endpoint.find('*') == std::string::npos)
    return bad("replay_endpoint", "equals endpoint");
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
}  // namespace

struct ZmqPublisher::Impl {
  ZmqPublisherConfig config;
  std::unique_ptr<EventQueue> queue;
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  zmq::socket_t replay{context, zmq::socket_type::router};
  bool has_replay = false;
  std::string endpoint, replay_endpoint;
  std::deque<std::pair<std::uint64_t, std::string>> kept;  ///< guarded by: the thread
  std::atomic<std::uint64_t> seq{0};
  std::atomic<std::uint64_t> published_events{0};  ///< events taken from the queue and sent
  std::atomic<bool> stop{false};
  std::thread thread;

  /// Takes what is queued (at most a batch) and sends it; false if the queue was empty.
  bool publish_some() {
    std::vector<CacheEvent> events;
    CacheEvent e;
    while (events.size() < config.max_batch_events && queue->pop(e)) events.push_back(std::move(e));
    if (events.empty()) return false;
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::string payload =
        events::encode_batch(ts, events, config.snapshot_events, config.data_parallel_rank);
    const std::uint64_t s = seq.load(std::memory_order_relaxed);
    const std::string s_bytes = be64(static_cast<std::int64_t>(s));
    // PUB never blocks: past the high-water mark a slow subscriber loses messages (and can
    // ask the replay socket for them).
    pub.send(zmq::buffer(config.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    pub.send(zmq::buffer(s_bytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    if (has_replay && config.replay_buffer > 0) {
      kept.emplace_back(s, std::move(payload));
      while (kept.size() > config.replay_buffer) kept.pop_front();
    }
    published_events.fetch_add(events.size(), std::memory_order_release);
    seq.store(s + 1, std::memory_order_release);
    return true;
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
      const zmq::message_t& body = frames.back();
      if (frames.size() >= 2 && body.size() == 8) {
        const std::int64_t start = from_be64(body.data());
        const bool delimited = frames.size() >= 3;
        auto reply = [&](const std::string& a, const std::string& b) {
          replay.send(zmq::buffer(frames[0].data(), frames[0].size()),
                      zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          if (delimited) replay.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
          replay.send(zmq::buffer(a), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          replay.send(zmq::buffer(b), zmq::send_flags::dontwait);
        };
        for (const auto& [s, payload] : kept)
          if (static_cast<std::int64_t>(s) >= start)
            reply(be64(static_cast<std::int64_t>(s)), payload);
        reply(be64(-1), std::string());
      }
      frames.clear();
    }
  }

  void run() {
    for (;;) {
      const bool stopping = stop.load(std::memory_order_acquire);
      while (publish_some()) {
      }
      if (stopping) return;
      if (has_replay) {
        zmq::pollitem_t item{replay.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(2));
        if (item.revents & ZMQ_POLLIN) serve_replay();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }
};

Result<std::unique_ptr<ZmqPublisher>> ZmqPublisher::create(const ZmqPublisherConfig& config) {
  if (Status s = config.validate(); !s) return s;
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->queue = std::move(EventQueue::create(config.queue_capacity)).value();
  try {
    impl->pub.set(zmq::sockopt::linger, 0);
    impl->pub.bind(config.endpoint);
    impl->endpoint = impl->pub.get(zmq::sockopt::last_endpoint);
    if (!config.replay_endpoint.empty()) {
      impl->replay.set(zmq::sockopt::linger, 0);
      // A replay answers with up to replay_buffer messages at once: past the default
      // high-water mark a ROUTER drops them silently (the end marker too). The queue is
      // bounded by replay_buffer per request anyway.
      impl->replay.set(zmq::sockopt::sndhwm, 0);
      impl->replay.bind(config.replay_endpoint);
      impl->replay_endpoint = impl->replay.get(zmq::sockopt::last_endpoint);
      impl->has_replay = true;
    }
  } catch (const zmq::error_t& e) {
    return Status(ErrorCode::kInvalidArgument,
                  "ZmqPublisher: cannot bind " + config.endpoint +
                      (config.replay_endpoint.empty() ? "" : " / " + config.replay_endpoint) +
                      ": " + e.what());
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
std::uint64_t ZmqPublisher::batches() const {
  return impl_->seq.load(std::memory_order_acquire);
}
const std::string& ZmqPublisher::endpoint() const {
  return impl_->endpoint;
}
const std::string& ZmqPublisher::replay_endpoint() const {
  return impl_->replay_endpoint;
}

bool ZmqPublisher::flush(std::chrono::milliseconds timeout) {
  const std::uint64_t target = impl_->queue->pushed();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (impl_->published_events.load(std::memory_order_acquire) < target) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace radixtier
