// An engine's view of the events component: only the installed headers of radixtier::events
// (and cppzmq, which the component's package config found). A subscriber bound first, the
// publisher connecting to it (vLLM's rule for an address without '*'); one BlockStored
// batch arrives as [topic, seq, payload].
#include <cstdio>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "radixtier/events/zmq_publisher.hpp"
#include "tiny_cache.hpp"

int main() {
  using namespace radixtier;
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv@consumer@tiny");
  sub.set(zmq::sockopt::rcvtimeo, 100);
  sub.bind("tcp://127.0.0.1:*");
  ZmqPublisherConfig pc;
  pc.endpoint = sub.get(zmq::sockopt::last_endpoint);
  pc.topic = "kv@consumer@tiny";
  auto pub = ZmqPublisher::create(pc);
  if (!pub) return std::fprintf(stderr, "publisher: %s\n", pub.status().to_string().c_str()), 1;

  TinyCache tiny(64, 0);
  if (!tiny.cache) return 1;
  tiny.cache->add_event_sink(&(*pub)->sink());
  // The connection is made in the background: insert prompts until a batch arrives.
  std::vector<zmq::message_t> frames;
  for (int i = 0; i < 50 && frames.empty(); ++i) {
    const std::vector<Token> prompt = {i, 1, 2, 3, 4, 5, 6, 7, 8};
    auto a = tiny.cache->admit(prompt);
    if (!a) return std::fprintf(stderr, "admit\n"), 1;
    auto pages = tiny.cache->alloc_pages(a->lock, 2);
    if (!pages) return std::fprintf(stderr, "alloc\n"), 1;
    if (!tiny.cache->insert(a->lock, std::span(prompt).first(8), *pages, {}))
      return std::fprintf(stderr, "insert\n"), 1;
    (void)tiny.cache->release(a->lock);
    if (!(*pub)->flush(std::chrono::seconds(5))) return std::fprintf(stderr, "flush\n"), 1;
    (void)zmq::recv_multipart(sub, std::back_inserter(frames));
  }
  tiny.cache->remove_event_sink(&(*pub)->sink());
  if (frames.size() != 3 || frames[0].to_string() != "kv@consumer@tiny" || frames[1].size() != 8)
    return std::fprintf(stderr, "no [topic, seq, payload] message arrived\n"), 1;
  // The payload is a msgpack array of 3: [ts, events, data_parallel_rank] (0x93).
  if (frames[2].size() < 2 || static_cast<const unsigned char*>(frames[2].data())[0] != 0x93)
    return std::fprintf(stderr, "the payload is not a 3-element batch\n"), 1;
  std::printf("consumer events: a batch of %zu bytes arrived on %s\n", frames[2].size(),
              pc.topic.c_str());
  return 0;
}
