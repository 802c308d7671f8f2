// The ZMQ publisher: a subscriber decodes vLLM's three-frame messages and its KVEventBatch
// payloads (tagged maps or positional arrays), rebuilds the contents (GPU, CPU and STORAGE
// media) and finds inspect()'s; a late subscriber catches up through the replay socket in
// either reply format; the snapshot events travel only on their own endpoint; the PUB socket
// binds or connects by vLLM's rule. python/tests/test_kv_event_consumers.py decodes the same
// stream with vLLM's, Dynamo's and llm-d's decoders restated.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <msgpack.hpp>
#include <optional>
#include <random>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cache_harness.hpp"
#include "event_mirror.hpp"
#include "memory_store_engine.hpp"
#include "radixtier/events/zmq_publisher.hpp"

namespace radixtier {
namespace {

using testing::EventMirror;
using testing::Harness;

Medium medium(const msgpack::object& o) {
  const std::string s = o.as<std::string>();
  if (s == "GPU") return Medium::kGpu;
  if (s == "CPU") return Medium::kHost;
  if (s == "STORAGE") return Medium::kStore;
  throw std::runtime_error("bad medium " + s);
}

/// One event's fields by name, from a tagged map or a positional array (the names in the
/// order vLLM declares them).
class Fields {
 public:
  Fields(const msgpack::object& ev, WireFormat format) {
    if (format == WireFormat::kVllmCurrent) {
      if (ev.type != msgpack::type::MAP) throw std::runtime_error("event is not a map");
      for (std::uint32_t i = 0; i < ev.via.map.size; ++i)
        by_name_[ev.via.map.ptr[i].key.as<std::string>()] = &ev.via.map.ptr[i].val;
      tag_ = at("type").as<std::string>();
    } else {
      if (ev.type != msgpack::type::ARRAY) throw std::runtime_error("event is not an array");
      tag_ = ev.via.array.ptr[0].as<std::string>();
      static const std::map<std::string, std::vector<std::string>> order = {
          {"BlockStored",
           {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
            "lora_name"}},
          {"BlockRemoved", {"block_hashes", "medium"}},
          {"AllBlocksCleared", {}},
          {"SnapshotStored", {"block_hash", "boundary", "medium"}},
          {"SnapshotRemoved", {"block_hash", "boundary", "medium"}}};
      const auto& names = order.at(tag_);
      if (ev.via.array.size != names.size() + 1)
        throw std::runtime_error(tag_ + ": " + std::to_string(ev.via.array.size) + " elements");
      for (std::size_t i = 0; i < names.size(); ++i) by_name_[names[i]] = &ev.via.array.ptr[i + 1];
    }
  }
  const std::string& tag() const { return tag_; }
  const msgpack::object& at(const std::string& name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw std::runtime_error(tag_ + " lacks " + name);
    return *it->second;
  }
  bool has(const std::string& name) const { return by_name_.count(name) != 0; }
  std::size_t size() const { return by_name_.size(); }

 private:
  std::string tag_;
  std::map<std::string, const msgpack::object*> by_name_;
};

/// A subscriber's side of the codec: the payload back into events. `names` maps a
/// namespace's name (lora_name or cache_salt) back to its id (lora_id in the mirror).
struct Decoded {
  std::vector<CacheEvent> events;
  int rank = -1;
};
Decoded decode(const zmq::message_t& payload, WireFormat format,
               const std::map<std::string, std::uint32_t>& names = {}) {
  msgpack::object_handle oh =
      msgpack::unpack(static_cast<const char*>(payload.data()), payload.size());
  const msgpack::object& batch = oh.get();
  if (batch.type != msgpack::type::ARRAY || batch.via.array.size != 3)
    throw std::runtime_error("batch is not [ts, events, data_parallel_rank]");
  if (batch.via.array.ptr[0].type != msgpack::type::FLOAT64) throw std::runtime_error("ts");
  Decoded out;
  out.rank = batch.via.array.ptr[2].as<int>();
  const msgpack::object& events = batch.via.array.ptr[1];
  for (std::uint32_t i = 0; i < events.via.array.size; ++i) {
    const Fields f(events.via.array.ptr[i], format);
    if (f.tag() == "BlockStored") {
      BlockStored e;
      e.block_hashes = f.at("block_hashes").as<std::vector<std::uint64_t>>();
      if (!f.at("parent_block_hash").is_nil())
        e.parent_block_hash = f.at("parent_block_hash").as<std::uint64_t>();
      e.token_ids = f.at("token_ids").as<std::vector<Token>>();
      e.block_size = f.at("block_size").as<std::uint32_t>();
      e.medium = medium(f.at("medium"));
      const std::string key = f.has("cache_salt") ? "cache_salt" : "lora_name";
      if (!f.at(key).is_nil()) {
        e.lora_id = names.at(f.at(key).as<std::string>());
        if (key == "lora_name" && f.at("lora_id").as<std::uint32_t>() != *e.lora_id)
          throw std::runtime_error("lora_id and lora_name disagree");
      } else if (!f.at("lora_id").is_nil()) {
        throw std::runtime_error("lora_id without a name");
      }
      out.events.push_back(e);
    } else if (f.tag() == "BlockRemoved") {
      out.events.push_back(BlockRemoved{f.at("block_hashes").as<std::vector<std::uint64_t>>(),
                                        medium(f.at("medium"))});
    } else if (f.tag() == "AllBlocksCleared") {
      out.events.push_back(AllBlocksCleared{});
    } else if (f.tag() == "SnapshotStored" || f.tag() == "SnapshotRemoved") {
      const auto h = f.at("block_hash").as<std::uint64_t>();
      const auto b = f.at("boundary").as<std::size_t>();
      const Medium m = medium(f.at("medium"));
      if (f.tag() == "SnapshotStored") {
        out.events.push_back(SnapshotStored{h, b, m});
      } else {
        out.events.push_back(SnapshotRemoved{h, b, m});
      }
    } else {
      throw std::runtime_error("unknown event " + f.tag());
    }
  }
  return out;
}

std::int64_t be64(const zmq::message_t& m) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<const unsigned char*>(m.data())[i];
  return static_cast<std::int64_t>(v);
}

/// Asks `endpoint` for every kept batch from `start` (DEALER, empty delimiter first, as
/// vLLM's REQ example) and hands each payload to `apply`; checks the reply's frames and the
/// end marker. Returns the sequence numbers replayed.
std::vector<std::int64_t> replay(zmq::context_t& ctx, const std::string& endpoint,
                                 ReplayFormat format, const std::string& topic,
                                 const std::function<void(const zmq::message_t&)>& apply) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::rcvtimeo, 10'000);  // fail, never hang, on a lost reply
  s.connect(endpoint);
  const std::uint64_t zero = 0;
  s.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
  s.send(zmq::buffer(&zero, 8));  // 0 is 0 in either byte order
  const bool with_topic = format == ReplayFormat::kTopicSeqPayload;
  std::vector<std::int64_t> seqs;
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(s, std::back_inserter(frames)))
      throw std::runtime_error("replay reply lost");
    // delimiter, [topic,] seq, payload
    if (frames.size() != (with_topic ? 4u : 3u))
      throw std::runtime_error("replay reply of " + std::to_string(frames.size()) + " frames");
    const zmq::message_t& seq = frames[frames.size() - 2];
    const zmq::message_t& payload = frames.back();
    if (payload.size() == 0) {
      if (be64(seq) != -1) throw std::runtime_error("the end marker is not -1");
      if (with_topic && frames[1].size() != 0) throw std::runtime_error("end marker's topic");
      return seqs;
    }
    if (with_topic && frames[1].to_string() != topic) throw std::runtime_error("replay topic");
    seqs.push_back(be64(seq));
    apply(payload);
  }
}

/// A store-backed cache under a random workload (GPU, host and store residency).
struct Workload {
  CacheConfig config = [] {
    CacheConfig c = testing::small_config();
    c.host_pages = 24;
    return c;
  }();
  testing::MemoryStoreEngine store{config, 160};
  Harness h{config, HostTransferEngine::Mode::kThreaded, &store};
  std::vector<std::vector<Token>> known;

  Workload() { store.attach(h.memory); }
  void run(int ops, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int op = 0; op < ops; ++op) {
      std::vector<Token> p;
      const std::size_t cut = rng() % 60;
      const Token base = Token(1000 * (1 + rng() % 6));
      for (std::size_t i = 0; i < cut; ++i) p.push_back(base + Token(i));
      p.push_back(Token(1 + rng() % 5));
      known.push_back(p);
      const std::size_t snaps[] = {8, 16, 24, 32, 40};
      (void)h.serve(p, snaps, 1 + rng() % 3);
      if (op % 97 == 0) h.cache->drop_host();
    }
    h.cache->drain();
  }
};

TEST(ZmqPublisher, RejectsBadConfigAndUnbindableEndpoint) {
  auto rejects = [](ZmqPublisherConfig c, const std::string& what) {
    auto r = ZmqPublisher::create(c);
    ASSERT_FALSE(r) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  ZmqPublisherConfig c;
  c.queue_capacity = 0;
  rejects(c, "queue_capacity");
  c = {};
  c.data_parallel_rank = -1;
  rejects(c, "data_parallel_rank");
  c = {};
  c.namespace_field = NamespaceField::kCacheSalt;
  c.wire_format = WireFormat::kVllmLegacy;
  rejects(c, "cache_salt slot");
  c = {};
  c.namespace_names = {{1, "a"}, {2, "a"}};
  rejects(c, "names two namespaces");
  c = {};
  c.namespace_names = {{0, "base"}};
  rejects(c, "default namespace");
  c = {};
  c.namespace_names = {{1, "ns-2"}};
  rejects(c, "another namespace's default name");
  c = {};
  c.snapshot_replay_endpoint = "tcp://127.0.0.1:*";
  rejects(c, "needs a snapshot_endpoint");
  c = {};
  c.endpoint = "tcp://127.0.0.1:5599";
  c.snapshot_endpoint = "tcp://127.0.0.1:5599";
  rejects(c, "snapshot_endpoint = tcp://127.0.0.1:5599 is also given to another socket");
  // A wildcard host with a fixed port is one port (issue 34 item 2): refused before any bind,
  // with the field named, not left to fail at bind.
  c = {};
  c.endpoint = "tcp://*:5557";
  c.replay_endpoint = "tcp://*:5557";
  rejects(c, "ZmqPublisherConfig.replay_endpoint = tcp://*:5557 is also given to another socket");
  // A wildcard port is a new port each time: the same one twice is two sockets.
  c = {};
  c.endpoint = "tcp://127.0.0.1:*";
  c.replay_endpoint = "tcp://127.0.0.1:*";
  EXPECT_TRUE(c.validate()) << c.validate().message();
  c = {};
  c.endpoint = "nonsense://*";
  rejects(c, "cannot bind");
  c = {};
  c.endpoint = "nonsense://x";
  rejects(c, "cannot connect");
}

TEST(ZmqPublisher, BindsOrConnectsByVllmsRule) {
  EXPECT_TRUE(zmq_endpoint_binds("tcp://*:5557"));
  EXPECT_TRUE(zmq_endpoint_binds("tcp://[::]:5557"));
  EXPECT_TRUE(zmq_endpoint_binds("ipc:///tmp/kv"));
  EXPECT_TRUE(zmq_endpoint_binds("inproc://kv"));
  EXPECT_FALSE(zmq_endpoint_binds("tcp://router:5557"));
  EXPECT_FALSE(zmq_endpoint_binds("tcp://127.0.0.1:5557"));
  // A central subscriber binds (as llm-d's does); the publisher connects to it.
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.bind("tcp://127.0.0.1:*");
  const std::string at = sub.get(zmq::sockopt::last_endpoint);
  ZmqPublisherConfig pc;
  pc.endpoint = at;
  pc.data_parallel_rank = 3;
  auto pub = ZmqPublisher::create(pc);
  ASSERT_TRUE(pub) << pub.status().to_string();
  EXPECT_EQ((*pub)->endpoint(), at);
  Harness h(testing::small_config());
  h.cache->add_event_sink(&(*pub)->sink());
  // The connection is made in the background: serve until a message arrives.
  sub.set(zmq::sockopt::rcvtimeo, 100);
  std::vector<zmq::message_t> frames;
  for (int i = 0; i < 100 && frames.empty(); ++i) {
    const std::size_t snaps[] = {8};
    (void)h.serve(testing::seq({{Token(100 * (i + 1)), 9}}), snaps);
    ASSERT_TRUE((*pub)->flush(std::chrono::seconds(5)));
    (void)zmq::recv_multipart(sub, std::back_inserter(frames));
  }
  ASSERT_EQ(frames.size(), 3u) << "the connected publisher reached the bound subscriber";
  EXPECT_EQ(frames[0].to_string(), "kv-events");
  EXPECT_EQ(decode(frames[2], WireFormat::kVllmCurrent).rank, 3);
  h.cache->remove_event_sink(&(*pub)->sink());
}

struct Layout {
  WireFormat wire;
  ReplayFormat replay;
};

class ZmqStream : public ::testing::TestWithParam<Layout> {};

TEST_P(ZmqStream, SubscriberRebuildsTheContentsFromReplayAndLiveMessages) {
  const Layout layout = GetParam();
  ZmqPublisherConfig pc;
  pc.endpoint = "tcp://127.0.0.1:*";
  pc.replay_endpoint = "tcp://127.0.0.1:*";
  pc.wire_format = layout.wire;
  pc.replay_format = layout.replay;
  pc.max_batch_events = 16;  // many batches
  auto pub = ZmqPublisher::create(pc);
  ASSERT_TRUE(pub) << pub.status().to_string();
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv-events");
  sub.connect((*pub)->endpoint());

  Workload w;
  w.h.cache->add_event_sink(&(*pub)->sink());
  w.run(600, 7);
  ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));
  const std::uint64_t batches = (*pub)->batches();
  ASSERT_GT(batches, 10u);
  EXPECT_EQ((*pub)->dropped(), 0u);
  EXPECT_GT(w.h.cache->stats().kv_pages_stored, 0u) << "the store tier was used";

  // The subscriber joined before the first message but may have missed some (slow joiner):
  // everything from 0 comes from the replay socket, then the live stream continues. The
  // vLLM stream has no snapshot events: the mirror compares blocks only.
  EventMirror mirror;
  std::size_t on_store = 0;
  const auto seqs =
      replay(ctx, (*pub)->replay_endpoint(), layout.replay, "kv-events", [&](const auto& p) {
        const Decoded d = decode(p, layout.wire);
        EXPECT_EQ(d.rank, 0) << "data_parallel_rank is always sent";
        for (const auto& e : d.events) {
          if (const auto* s = std::get_if<BlockStored>(&e)) on_store += s->medium == Medium::kStore;
          mirror.apply(e);
        }
      });
  ASSERT_EQ(seqs.size(), batches);
  for (std::size_t i = 0; i < seqs.size(); ++i) ASSERT_EQ(seqs[i], std::int64_t(i));
  ASSERT_EQ(mirror.error, "");
  EventMirror want = EventMirror::from_inspect(*w.h.cache, w.known);
  want.snapshots.clear();
  EXPECT_EQ(mirror.difference(want), "");
  EXPECT_GT(on_store, 0u) << "store residency goes out as STORAGE";
  EXPECT_TRUE(mirror.snapshots.empty());

  // Live: three frames, topic first, sequence numbers continue where replay ended.
  w.h.cache->flush();
  ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  bool found = false;
  while (!found) {
    std::vector<zmq::message_t> frames;
    ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(frames))) << "no live message";
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_EQ(frames[0].to_string(), "kv-events");
    const auto last = static_cast<std::uint64_t>(be64(frames[1]));
    if (last >= batches) {
      for (const auto& e : decode(frames[2], layout.wire).events) mirror.apply(e);
      found = last + 1 == (*pub)->batches();
    }
  }
  EXPECT_EQ(mirror.error, "");
  want = EventMirror::from_inspect(*w.h.cache, w.known);
  want.snapshots.clear();
  EXPECT_EQ(mirror.difference(want), "");
  w.h.cache->remove_event_sink(&(*pub)->sink());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ZmqStream,
    ::testing::Values(Layout{WireFormat::kVllmCurrent, ReplayFormat::kTopicSeqPayload},
                      Layout{WireFormat::kVllmLegacy, ReplayFormat::kSeqPayload},
                      Layout{WireFormat::kVllmLegacy, ReplayFormat::kTopicSeqPayload}),
    [](const auto& info) {
      return std::string(info.param.wire == WireFormat::kVllmCurrent ? "Maps" : "Arrays") +
             (info.param.replay == ReplayFormat::kTopicSeqPayload ? "TopicReplay" : "SeqReplay");
    });

TEST(ZmqPublisher, SnapshotEventsTravelOnlyOnTheirOwnEndpointWithEveryOtherEvent) {
  ZmqPublisherConfig pc;
  pc.endpoint = "tcp://127.0.0.1:*";
  pc.replay_endpoint = "tcp://127.0.0.1:*";
  pc.snapshot_endpoint = "tcp://127.0.0.1:*";
  pc.snapshot_replay_endpoint = "tcp://127.0.0.1:*";
  pc.namespace_names = {{5, "adapter-a"}};
  pc.max_batch_events = 8;
  auto pub = ZmqPublisher::create(pc);
  ASSERT_TRUE(pub) << pub.status().to_string();
  Workload w;
  w.h.cache->add_event_sink(&(*pub)->sink());
  w.run(300, 11);
  // Another namespace's copy of the same prompts: its blocks go out with lora_name.
  w.h.request_options.ns = NamespaceId(5);
  std::vector<std::vector<Token>> known5;
  for (std::size_t i = 0; i < 20; ++i) {
    known5.push_back(w.known[i]);
    const std::size_t snaps[] = {8, 16};
    (void)w.h.serve(w.known[i], snaps);
  }
  w.h.cache->drain();
  ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));
  EXPECT_GE((*pub)->snapshot_batches(), (*pub)->batches()) << "a twin of every vLLM batch";

  zmq::context_t ctx;
  const std::map<std::string, std::uint32_t> names = {{"adapter-a", 5}};
  // The vLLM endpoint, whatever the topic: no snapshot tag (a subscriber of "" gets all).
  EventMirror vllm;
  replay(ctx, (*pub)->replay_endpoint(), pc.replay_format, pc.topic, [&](const auto& p) {
    for (const auto& e : decode(p, pc.wire_format, names).events) {
      ASSERT_FALSE(std::holds_alternative<SnapshotStored>(e) ||
                   std::holds_alternative<SnapshotRemoved>(e));
      vllm.apply(e);
    }
  });
  // The full stream: blocks and snapshots in the cache's order (a snapshot after its KV).
  EventMirror full;
  std::size_t snapshot_events = 0;
  replay(ctx, (*pub)->snapshot_replay_endpoint(), pc.replay_format, pc.snapshot_topic,
         [&](const auto& p) {
           for (const auto& e : decode(p, pc.wire_format, names).events) {
             snapshot_events += std::holds_alternative<SnapshotStored>(e);
             full.apply(e);
           }
         });
  ASSERT_EQ(vllm.error, "");
  ASSERT_EQ(full.error, "");
  EXPECT_GT(snapshot_events, 10u);
  EventMirror want = EventMirror::from_inspect(*w.h.cache, w.known);
  want.merge(EventMirror::from_inspect(*w.h.cache, known5, NamespaceId(5)));
  EXPECT_EQ(full.difference(want), "");
  want.snapshots.clear();
  EXPECT_EQ(vllm.difference(want), "");
  w.h.cache->remove_event_sink(&(*pub)->sink());
}

TEST(ZmqPublisher, AStalledSubscriberNeverBlocksTheCache) {
  ZmqPublisherConfig pc;
  pc.endpoint = "tcp://127.0.0.1:*";
  pc.replay_endpoint = "tcp://127.0.0.1:*";
  pc.max_batch_events = 1;      // one message per event: far past ZMQ's high-water mark
  pc.replay_buffer = 1u << 20;  // the replay keeps them all
  auto pub = ZmqPublisher::create(pc);
  ASSERT_TRUE(pub) << pub.status().to_string();
  zmq::context_t ctx;
  zmq::socket_t stalled(ctx, zmq::socket_type::sub);
  stalled.set(zmq::sockopt::rcvhwm, 1);
  stalled.set(zmq::sockopt::subscribe, "");
  stalled.connect((*pub)->endpoint());  // and never reads
  Harness h(testing::small_config());
  h.cache->add_event_sink(&(*pub)->sink());
  std::vector<std::vector<Token>> known;
  for (int i = 0; i < 2000; ++i) {
    known.push_back(testing::seq({{Token(100 * (i % 50)), std::size_t(9 + i % 30)}}));
    const std::size_t snaps[] = {8, 16, 24, 32};
    (void)h.serve(known.back(), snaps);
    if (i % 300 == 0) h.settle();
  }
  h.settle();
  ASSERT_TRUE((*pub)->flush(std::chrono::seconds(20))) << "the publisher fell behind for good";
  EXPECT_GT((*pub)->batches(), 2000u);
  EXPECT_EQ((*pub)->dropped(), 0u) << "the publisher keeps up; only the subscriber lost messages";
  // What the stalled subscriber missed is all in the replay.
  EventMirror mirror;
  replay(ctx, (*pub)->replay_endpoint(), pc.replay_format, pc.topic, [&](const auto& p) {
    for (const auto& e : decode(p, pc.wire_format).events) mirror.apply(e);
  });
  EXPECT_EQ(mirror.error, "");
  EventMirror want = EventMirror::from_inspect(*h.cache, known);
  want.snapshots.clear();
  EXPECT_EQ(mirror.difference(want), "");
  h.cache->remove_event_sink(&(*pub)->sink());
}

/// A subscriber written as vLLM's (its example subscriber, examples/features/kv_events/: a gap
/// in the sequence numbers -> a replay request from the first missing one) and llm-d's
/// (pkg/kvevents: the same over a DEALER socket): every batch is applied once, in order, to a
/// router's index of the contents.
class GapReplayingSubscriber {
 public:
  GapReplayingSubscriber(zmq::context_t& ctx, const ZmqPublisher& pub, const std::string& topic)
      : ctx_(ctx), replay_at_(pub.replay_endpoint()), sub_(ctx, zmq::socket_type::sub) {
    sub_.set(zmq::sockopt::subscribe, topic);
    sub_.connect(pub.endpoint());
  }

  /// Reads what arrived (waiting up to `wait` for the first message).
  void pump(std::chrono::milliseconds wait) {
    sub_.set(zmq::sockopt::rcvtimeo, static_cast<int>(wait.count()));
    for (;;) {
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(sub_, std::back_inserter(frames))) return;
      sub_.set(zmq::sockopt::rcvtimeo, 0);
      if (frames.size() != 3) return fail("a live message of " + std::to_string(frames.size()));
      const std::int64_t seq = be64(frames[1]);
      if (seq <= last_) continue;  // already applied (from a replay)
      if (seq > last_ + 1) {
        ++gaps;
        replay_from(last_ + 1);
      }
      if (seq == last_ + 1) apply(seq, frames[2]);
      if (seq > last_) return fail("the replay did not fill the gap before " + std::to_string(seq));
    }
  }
  /// Pumps until batch `n - 1` is applied (false on timeout).
  bool catch_up(std::uint64_t n) {
    for (int i = 0; i < 200 && last_ + 1 < static_cast<std::int64_t>(n); ++i)
      pump(std::chrono::milliseconds(50));
    return last_ + 1 == static_cast<std::int64_t>(n);
  }

  EventMirror index;
  std::size_t gaps = 0, replayed = 0;
  std::string error;

 private:
  void fail(const std::string& why) {
    if (error.empty()) error = why;
  }
  void apply(std::int64_t seq, const zmq::message_t& payload) {
    for (const CacheEvent& e : decode(payload, WireFormat::kVllmCurrent).events) index.apply(e);
    last_ = seq;
  }
  void replay_from(std::int64_t start) {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::rcvtimeo, 10'000);
    s.connect(replay_at_);
    std::string be(8, '\0');
    for (int i = 0; i < 8; ++i) be[i] = static_cast<char>(std::uint64_t(start) >> (8 * (7 - i)));
    s.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    s.send(zmq::buffer(be));
    for (;;) {
      std::vector<zmq::message_t> frames;  // delimiter, topic, seq, payload
      if (!zmq::recv_multipart(s, std::back_inserter(frames)) || frames.size() != 4)
        return fail("replay reply lost or malformed");
      const std::int64_t seq = be64(frames[2]);
      if (seq == -1) return;
      if (seq == last_ + 1) {
        apply(seq, frames[3]);
        ++replayed;
      }
    }
  }

  zmq::context_t& ctx_;
  std::string replay_at_;
  zmq::socket_t sub_;
  std::int64_t last_ = -1;
};

// Issue 34 item 1: with a queue far too small (4 events) the publisher drops, and the stream
// says so: the cache restarts it (AllBlocksCleared, then the contents) at its next poll(), on
// the same sequence numbers. A subscriber that joins late, follows gaps with replay requests
// and reads only now and then ends with an index equal to the cache's contents.
TEST(ZmqPublisher, AnOverloadedQueueRestartsTheStreamAndARoutersIndexEndsExact) {
  ZmqPublisherConfig pc;
  pc.endpoint = "tcp://127.0.0.1:*";
  pc.replay_endpoint = "tcp://127.0.0.1:*";
  pc.queue_capacity = 4;
  auto pub = ZmqPublisher::create(pc);
  ASSERT_TRUE(pub) << pub.status().to_string();
  zmq::context_t ctx;
  Harness h(testing::small_config());
  h.cache->add_event_sink(&(*pub)->sink());
  std::optional<GapReplayingSubscriber> router;
  std::vector<std::vector<Token>> known;
  for (int i = 0; i < 300; ++i) {
    known.push_back(testing::seq({{Token(100 * (i % 50)), std::size_t(9 + i % 30)}}));
    const std::size_t snaps[] = {8, 16, 24, 32};
    (void)h.serve(known.back(), snaps);
    if (i % 50 == 0) h.settle();
    if (i == 40) {
      // Joins late: after batches went out (waited for: on a loaded machine the publisher
      // thread may not have sent one yet, and a subscriber that sees seq 0 sees no gap).
      ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));
      ASSERT_GT((*pub)->batches(), 0u);
      router.emplace(ctx, **pub, pc.topic);
    }
    if (router && i % 10 == 0) router->pump(std::chrono::milliseconds(0));
  }
  h.settle();
  // The last operations may have lost events: the next entry point restarts the stream.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));  // the restart waiting is taken
    h.cache->poll();
    if (!(*pub)->sink().lost_events()) break;
  }
  ASSERT_FALSE((*pub)->sink().lost_events());
  ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));
  std::cout << "[ measured ] queue_capacity 4, 300 requests: " << (*pub)->dropped()
            << " events dropped, " << (*pub)->restarts() << " restarts, " << (*pub)->batches()
            << " batches\n";
  EXPECT_GT((*pub)->dropped(), 0u) << "the queue overflowed";
  EXPECT_GT((*pub)->restarts(), 0u);
  ASSERT_TRUE(router->catch_up((*pub)->batches()));
  EXPECT_EQ(router->error, "");
  EXPECT_GE(router->gaps, 1u) << "it joined late";
  EXPECT_GT(router->replayed, 0u);
  EXPECT_EQ(router->index.error, "");
  EXPECT_GT(router->index.cleared, 1u) << "the restarts reached it";
  EventMirror want = EventMirror::from_inspect(*h.cache, known);
  want.snapshots.clear();
  EXPECT_FALSE(want.blocks.empty());
  EXPECT_EQ(router->index.difference(want), "");
  h.cache->remove_event_sink(&(*pub)->sink());
}

// Issue 34 item 2: Dynamo builds before mid-2026 file every medium under the GPU tier, so a
// CPU removal (drop_host) would take a block that is still on GPU out of their GPU view.
// media = kGpuOnly sends the GPU events alone: the stream rebuilds exactly the GPU contents.
TEST(ZmqPublisher, GpuOnlyMediaSendsTheGpuContentsAlone) {
  ZmqPublisherConfig pc;
  pc.endpoint = "tcp://127.0.0.1:*";
  pc.replay_endpoint = "tcp://127.0.0.1:*";
  pc.media = MediaFilter::kGpuOnly;
  auto pub = ZmqPublisher::create(pc);
  ASSERT_TRUE(pub) << pub.status().to_string();
  Workload w;
  w.h.cache->add_event_sink(&(*pub)->sink());
  w.run(300, 5);
  w.h.cache->drop_host();
  ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));
  zmq::context_t ctx;
  EventMirror mirror;
  std::size_t not_gpu = 0;
  replay(ctx, (*pub)->replay_endpoint(), pc.replay_format, pc.topic, [&](const auto& p) {
    for (const auto& e : decode(p, pc.wire_format).events) {
      if (const auto* s = std::get_if<BlockStored>(&e)) not_gpu += s->medium != Medium::kGpu;
      if (const auto* r = std::get_if<BlockRemoved>(&e)) not_gpu += r->medium != Medium::kGpu;
      mirror.apply(e);
    }
  });
  EXPECT_EQ(not_gpu, 0u);
  EXPECT_EQ(mirror.error, "");
  EventMirror want = EventMirror::from_inspect(*w.h.cache, w.known);
  want.snapshots.clear();
  std::size_t host = 0;
  std::erase_if(want.blocks, [&](const auto& b) {
    host += b.first.second != Medium::kGpu;
    return b.first.second != Medium::kGpu;
  });
  EXPECT_GT(host, 0u) << "the workload has host and store copies that stay unpublished";
  EXPECT_EQ(mirror.difference(want), "");
  w.h.cache->remove_event_sink(&(*pub)->sink());
}

}  // namespace
}  // namespace radixtier
