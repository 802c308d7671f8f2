// The cache's observers in Python: block_hash (a router's side of the hash scheme), the ZMQ
// event publisher and the Prometheus metrics server. Each keeps its PrefixCache alive and
// detaches from it in close() (or when collected).
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#include "errors.hpp"
#include "radixtier/cache/block_hash.hpp"
#ifdef RADIXTIER_PYTHON_EVENTS
#include "radixtier/events/zmq_publisher.hpp"
#endif
#ifdef RADIXTIER_PYTHON_METRICS
#include "radixtier/metrics/cache_metrics.hpp"
#endif

namespace radixtier::python {

namespace {
#ifdef RADIXTIER_PYTHON_EVENTS
/// The enum value spelled `s`, or a ValueError naming `what` and the accepted spellings.
template <class E>
E choice(const char* what, const std::string& s,
         std::initializer_list<std::pair<const char*, E>> options) {
  std::string accepted;
  for (const auto& [name, value] : options) {
    if (s == name) return value;
    accepted += std::string(accepted.empty() ? "" : " or ") + "'" + name + "'";
  }
  raise_invalid(std::string(what) + ": '" + s + "' is not " + accepted);
}

class PyEventPublisher {
 public:
  PyEventPublisher(py::object cache, const ZmqPublisherConfig& config)
      : cache_(std::move(cache)), pub_(unwrap(ZmqPublisher::create(config))) {
    with_cache(cache_, [&](PrefixCache& c) { c.add_event_sink(&pub_->sink()); });
  }
  ~PyEventPublisher() { close(); }
  void close() {
    if (!pub_) return;
    with_cache(cache_, [&](PrefixCache& c) { c.remove_event_sink(&pub_->sink()); });
    py::gil_scoped_release nogil;
    pub_.reset();
  }
  ZmqPublisher& pub() {
    if (!pub_) throw py::value_error("EventPublisher is closed");
    return *pub_;
  }

 private:
  py::object cache_;
  std::unique_ptr<ZmqPublisher> pub_;
};
#endif

#ifdef RADIXTIER_PYTHON_METRICS
class PyMetricsServer {
 public:
  PyMetricsServer(py::object cache, const std::string& bind) : cache_(std::move(cache)) {
    Status failed;
    with_cache(cache_, [&](PrefixCache& c) {
      auto r = MetricsServer::create(c, bind);
      if (r) {
        server_ = std::move(r).value();
      } else {
        failed = r.status();
      }
    });
    if (!failed.is_ok()) raise(failed);
  }
  ~PyMetricsServer() { close(); }
  void update() {
    if (server_) with_cache(cache_, [&](PrefixCache&) { server_->update(); });
  }
  void close() {
    if (server_) with_cache(cache_, [&](PrefixCache&) { server_.reset(); });
  }
  int port() const { return server_ ? server_->port() : 0; }

 private:
  py::object cache_;
  std::unique_ptr<MetricsServer> server_;
};
#endif
}  // namespace

void bind_observers(py::module_& m) {
  m.def(
      "block_hash",
      [](std::uint64_t parent, const py::object& tokens) {
        TokenArg t(tokens);
        return block_hash(parent, t.span());
      },
      py::arg("parent"), py::arg("page"),
      "XXH64 (seed 0) of parent (8 bytes LE) + the page's tokens (int32 LE each).");
  m.def(
      "block_hashes",
      [](const py::object& tokens, std::uint32_t page_size) {
        TokenArg t(tokens);
        return block_hashes(t.span(), page_size);
      },
      py::arg("tokens"), py::arg("page_size"), "The chained hash of every whole page.");
#ifdef RADIXTIER_PYTHON_EVENTS
  py::class_<PyEventPublisher>(
      m, "EventPublisher",
      "The cache's KV events over ZMQ PUB as vLLM's ZmqEventPublisher sends them "
      "(docs/events-and-metrics.md).")
      .def(py::init([](py::object cache, std::string endpoint, std::string replay_endpoint,
                       std::string topic, std::size_t queue_capacity,
                       const std::string& wire_format, const std::string& replay_format,
                       int data_parallel_rank, const std::string& namespace_field,
                       std::map<std::uint32_t, std::string> namespace_names,
                       std::string snapshot_endpoint, std::string snapshot_replay_endpoint,
                       std::string snapshot_topic, const std::string& media) {
             ZmqPublisherConfig c;
             c.endpoint = std::move(endpoint);
             c.replay_endpoint = std::move(replay_endpoint);
             c.topic = std::move(topic);
             c.queue_capacity = queue_capacity;
             c.wire_format = choice<WireFormat>("wire_format", wire_format,
                                                {{"vllm-current", WireFormat::kVllmCurrent},
                                                 {"vllm-legacy", WireFormat::kVllmLegacy}});
             c.replay_format =
                 choice<ReplayFormat>("replay_format", replay_format,
                                      {{"topic-seq-payload", ReplayFormat::kTopicSeqPayload},
                                       {"seq-payload", ReplayFormat::kSeqPayload}});
             c.data_parallel_rank = data_parallel_rank;
             c.namespace_field =
                 choice<NamespaceField>("namespace_field", namespace_field,
                                        {{"lora-name", NamespaceField::kLoraName},
                                         {"cache-salt", NamespaceField::kCacheSalt}});
             c.namespace_names = std::move(namespace_names);
             c.snapshot_endpoint = std::move(snapshot_endpoint);
             c.snapshot_replay_endpoint = std::move(snapshot_replay_endpoint);
             c.snapshot_topic = std::move(snapshot_topic);
             c.media = choice<MediaFilter>(
                 "media", media, {{"all", MediaFilter::kAll}, {"gpu", MediaFilter::kGpuOnly}});
             return std::make_unique<PyEventPublisher>(std::move(cache), c);
           }),
           py::arg("cache"), py::arg("endpoint") = "tcp://*:5557", py::arg("replay_endpoint") = "",
           py::arg("topic") = "kv-events", py::arg("queue_capacity") = std::size_t{1} << 16,
           py::kw_only(), py::arg("wire_format") = "vllm-current",
           py::arg("replay_format") = "topic-seq-payload", py::arg("data_parallel_rank") = 0,
           py::arg("namespace_field") = "lora-name",
           py::arg("namespace_names") = std::map<std::uint32_t, std::string>{},
           py::arg("snapshot_endpoint") = "", py::arg("snapshot_replay_endpoint") = "",
           py::arg("snapshot_topic") = "kv-snapshots", py::arg("media") = "all",
           "endpoint is bound when it holds '*' or '::' or is ipc:// or inproc://, connected "
           "otherwise (vLLM's rule). wire_format: 'vllm-current' (events as tagged maps) or "
           "'vllm-legacy' (arrays). replay_format: 'topic-seq-payload' or 'seq-payload'. "
           "namespace_field: 'lora-name' or 'cache-salt'; namespace_names: {id: name} (an "
           "unnamed namespace is 'ns-<id>'). snapshot_endpoint: a second PUB socket with "
           "every event, the snapshot events included ('' : none). media: 'all' or 'gpu' (GPU "
           "events only, for Dynamo builds before mid-2026).")
      .def_property_readonly("endpoint", [](PyEventPublisher& p) { return p.pub().endpoint(); })
      .def_property_readonly("replay_endpoint",
                             [](PyEventPublisher& p) { return p.pub().replay_endpoint(); })
      .def_property_readonly("snapshot_endpoint",
                             [](PyEventPublisher& p) { return p.pub().snapshot_endpoint(); })
      .def_property_readonly("snapshot_replay_endpoint",
                             [](PyEventPublisher& p) { return p.pub().snapshot_replay_endpoint(); })
      .def_property_readonly("batches", [](PyEventPublisher& p) { return p.pub().batches(); })
      .def_property_readonly("snapshot_batches",
                             [](PyEventPublisher& p) { return p.pub().snapshot_batches(); })
      .def_property_readonly("dropped", [](PyEventPublisher& p) { return p.pub().dropped(); })
      .def_property_readonly("restarts", [](PyEventPublisher& p) { return p.pub().restarts(); })
      .def(
          "flush",
          [](PyEventPublisher& p, double timeout_s) {
            if (!(timeout_s >= 0)) raise_invalid("flush: timeout_s must be >= 0 seconds");
            ZmqPublisher& z = p.pub();
            // A wait longer than a year (inf included) is a wait until done.
            constexpr double kLongest = 365.0 * 24 * 3600;
            const auto ms = std::chrono::milliseconds(
                static_cast<std::int64_t>(std::min(timeout_s, kLongest) * 1000));
            py::gil_scoped_release nogil;
            return z.flush(ms);
          },
          py::arg("timeout_s") = 10.0,
          "Waits until every queued event is published, at most timeout_s seconds (inf: no "
          "limit); False when some are still queued.")
      .def("close", &PyEventPublisher::close, "Detaches from the cache and stops publishing.");
  m.attr("HAVE_EVENTS") = true;
#else
  m.attr("HAVE_EVENTS") = false;
#endif
#ifdef RADIXTIER_PYTHON_METRICS
  py::class_<PyMetricsServer>(m, "MetricsServer",
                              "The cache's Prometheus metrics over HTTP at /metrics.")
      .def(py::init<py::object, std::string>(), py::arg("cache"), py::arg("bind") = "127.0.0.1:0")
      .def_property_readonly("port", &PyMetricsServer::port)
      .def("update", &PyMetricsServer::update,
           "Copies stats() and occupancy() into the metrics (call once per scheduler step).")
      .def("close", &PyMetricsServer::close);
  m.attr("HAVE_METRICS") = true;
#else
  m.attr("HAVE_METRICS") = false;
#endif
}

}  // namespace radixtier::python
