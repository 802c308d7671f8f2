// The ZMQ publisher: a subscriber decodes vLLM's three-frame messages and its KVEventBatch
// payloads, rebuilds the contents and finds inspect()'s; a late subscriber catches up through
// the replay socket.
#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <random>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cache_harness.hpp"
#include "event_mirror.hpp"
#include "radixtier/events/zmq_publisher.hpp"

namespace radixtier {
namespace {

using testing::EventMirror;
using testing::Harness;

Medium medium(const msgpack::object& o) {
  const std::string s = o.as<std::string>();
  if (s != "GPU" && s != "CPU") throw std::runtime_error("bad medium " + s);
  return s == "GPU" ? Medium::kGpu : Medium::kHost;
}

/// Decodes one payload frame back into events (the subscriber's side of the codec).
std::vector<CacheEvent> decode(const zmq::message_t& payload) {
  msgpack::object_handle oh =
      msgpack::unpack(static_cast<const char*>(payload.data()), payload.size());
  const msgpack::object& batch = oh.get();
  if (batch.type != msgpack::type::ARRAY || batch.via.array.size < 2)
    throw std::runtime_error("batch is not [ts, events]");
  if (batch.via.array.ptr[0].type != msgpack::type::FLOAT64) throw std::runtime_error("ts");
  std::vector<CacheEvent> out;
  const msgpack::object& events = batch.via.array.ptr[1];
  for (std::uint32_t i = 0; i < events.via.array.size; ++i) {
    const msgpack::object* f = events.via.array.ptr[i].via.array.ptr;
    const std::uint32_t n = events.via.array.ptr[i].via.array.size;
    const std::string tag = f[0].as<std::string>();
    if (tag == "BlockStored" && n == 7) {
      BlockStored e;
      e.block_hashes = f[1].as<std::vector<std::uint64_t>>();
      if (!f[2].is_nil()) e.parent_block_hash = f[2].as<std::uint64_t>();
      e.token_ids = f[3].as<std::vector<Token>>();
      e.block_size = f[4].as<std::uint32_t>();
      if (!f[5].is_nil()) e.lora_id = f[5].as<std::uint32_t>();
      e.medium = medium(f[6]);
      out.push_back(e);
    } else if (tag == "BlockRemoved" && n == 3) {
      out.push_back(BlockRemoved{f[1].as<std::vector<std::uint64_t>>(), medium(f[2])});
    } else if (tag == "AllBlocksCleared" && n == 1) {
      out.push_back(AllBlocksCleared{});
    } else if (tag == "SnapshotStored" && n == 4) {
      out.push_back(SnapshotStored{f[1].as<std::uint64_t>(), f[2].as<std::size_t>(), medium(f[3])});
    } else if (tag == "SnapshotRemoved" && n == 4) {
      out.push_back(
          SnapshotRemoved{f[1].as<std::uint64_t>(), f[2].as<std::size_t>(), medium(f[3])});
    } else {
      throw std::runtime_error("unknown event " + tag);
    }
  }
  return out;
}

std::uint64_t be64(const zmq::message_t& m) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<const unsigned char*>(m.data())[i];
  return v;
}

TEST(ZmqPublisher, RejectsBadConfigAndUnbindableEndpoint) {
  ZmqPublisherConfig c;
  c.queue_capacity = 0;
  auto r = ZmqPublisher::create(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("queue_capacity"), std::string::npos);
  c = ZmqPublisherConfig{};
  c.endpoint = "nonsense://x";
  r = ZmqPublisher::create(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("cannot bind"), std::string::npos);
}

TEST(ZmqPublisher, SubscriberRebuildsTheContentsFromReplayAndLiveMessages) {
  ZmqPublisherConfig pc;
  pc.endpoint = "tcp://127.0.0.1:*";
  pc.replay_endpoint = "tcp://127.0.0.1:*";
  pc.max_batch_events = 16;  // many batches
  auto pub = ZmqPublisher::create(pc);
  ASSERT_TRUE(pub) << pub.status().to_string();
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv-events");
  sub.connect((*pub)->endpoint());

  CacheConfig c = testing::small_config();
  Harness h(c, HostTransferEngine::Mode::kThreaded);
  h.cache->add_event_sink(&(*pub)->sink());
  std::mt19937_64 rng(7);
  std::vector<std::vector<Token>> known;
  for (int op = 0; op < 600; ++op) {
    std::vector<Token> p;
    const std::size_t cut = rng() % 60;
    const Token base = Token(1000 * (1 + rng() % 3));
    for (std::size_t i = 0; i < cut; ++i) p.push_back(base + Token(i));
    p.push_back(Token(1 + rng() % 5));
    known.push_back(p);
    const std::size_t snaps[] = {8, 16, 24, 32, 40};
    ASSERT_TRUE(h.serve(p, snaps, 1 + rng() % 3).error.empty() || true);
    if (op % 97 == 0) h.cache->drop_host();
  }
  h.cache->drain();
  ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));
  const std::uint64_t batches = (*pub)->batches();
  ASSERT_GT(batches, 10u);
  EXPECT_EQ((*pub)->dropped(), 0u);

  // The subscriber joined before the first message but may have missed some (slow joiner):
  // everything from 0 comes from the replay socket, then the live stream continues.
  EventMirror mirror;
  zmq::socket_t replay(ctx, zmq::socket_type::dealer);
  replay.set(zmq::sockopt::rcvtimeo, 10'000);  // fail, never hang, on a lost reply
  replay.connect((*pub)->replay_endpoint());
  const std::uint64_t zero = 0;
  replay.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
  replay.send(zmq::buffer(&zero, 8));  // 0 is 0 in either byte order
  std::uint64_t next = 0;
  for (;;) {
    std::vector<zmq::message_t> frames;
    ASSERT_TRUE(zmq::recv_multipart(replay, std::back_inserter(frames))) << "replay reply lost";
    ASSERT_EQ(frames.size(), 3u);  // delimiter, seq, payload
    if (frames[2].size() == 0) {
      EXPECT_EQ(be64(frames[1]), ~0ull) << "the end marker is -1";
      break;
    }
    ASSERT_EQ(be64(frames[1]), next) << "replay in sequence order";
    ++next;
    for (const auto& e : decode(frames[2])) mirror.apply(e);
  }
  EXPECT_EQ(next, batches);
  ASSERT_EQ(mirror.error, "");
  EXPECT_EQ(mirror.difference(EventMirror::from_inspect(*h.cache, known)), "");

  // Live: three frames, topic first, sequence numbers continue where replay ended.
  h.cache->flush();
  ASSERT_TRUE((*pub)->flush(std::chrono::seconds(10)));
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  std::uint64_t last = 0;
  bool found = false;
  while (!found) {
    std::vector<zmq::message_t> frames;
    ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(frames))) << "no live message";
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_EQ(frames[0].to_string(), "kv-events");
    last = be64(frames[1]);
    if (last >= batches) {
      for (const auto& e : decode(frames[2])) mirror.apply(e);
      found = last + 1 == (*pub)->batches();
    }
  }
  EXPECT_EQ(mirror.error, "");
  EXPECT_EQ(mirror.difference(EventMirror::from_inspect(*h.cache, known)), "");
  EXPECT_TRUE(mirror.blocks.empty());
  h.cache->remove_event_sink(&(*pub)->sink());
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
  EXPECT_GT((*pub)->batches(), 5000u);
  EXPECT_EQ((*pub)->dropped(), 0u) << "the publisher keeps up; only the subscriber lost messages";
  // What the stalled subscriber missed is all in the replay.
  EventMirror mirror;
  zmq::socket_t replay(ctx, zmq::socket_type::dealer);
  replay.set(zmq::sockopt::rcvtimeo, 10'000);  // fail, never hang, on a lost reply
  replay.connect((*pub)->replay_endpoint());
  const std::uint64_t zero = 0;
  replay.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
  replay.send(zmq::buffer(&zero, 8));
  for (;;) {
    std::vector<zmq::message_t> frames;
    ASSERT_TRUE(zmq::recv_multipart(replay, std::back_inserter(frames))) << "replay reply lost";
    ASSERT_EQ(frames.size(), 3u);
    if (frames[2].size() == 0) break;
    for (const auto& e : decode(frames[2])) mirror.apply(e);
  }
  EXPECT_EQ(mirror.error, "");
  EXPECT_EQ(mirror.difference(EventMirror::from_inspect(*h.cache, known)), "");
  h.cache->remove_event_sink(&(*pub)->sink());
}

}  // namespace
}  // namespace radixtier
