// Enums and the validated CacheConfig.
#include <pybind11/stl.h>

#include <sstream>
#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#include "errors.hpp"
#include "radixtier/config.hpp"

namespace radixtier::python {

namespace {

py::dict to_dict(const CacheConfig& c) {
  py::dict d;
  d["page_size"] = c.page_size;
  d["gpu_pages"] = c.gpu_pages;
  d["host_pages"] = c.host_pages;
  d["gpu_snapshot_slots"] = c.gpu_snapshot_slots;
  d["host_snapshot_slots"] = c.host_snapshot_slots;
  d["page_bytes"] = c.page_bytes;
  d["snapshot_bytes"] = c.snapshot_bytes;
  d["slice_pages"] = c.slice_pages;
  d["write_policy"] = c.write_policy;
  d["snapshot_eviction"] = c.snapshot_eviction;
  d["load_back_min_tokens"] = c.load_back_min_tokens;
  d["max_snapshots_per_path"] = c.max_snapshots_per_path;
  d["host_pin_share"] = c.host_pin_share;
  return d;
}

CacheConfig make_config(std::int64_t page_size, std::int64_t gpu_pages, std::int64_t host_pages,
                        std::int64_t gpu_snapshot_slots, std::int64_t host_snapshot_slots,
                        std::int64_t page_bytes, std::int64_t snapshot_bytes,
                        std::int64_t slice_pages, WritePolicy write_policy,
                        SnapshotEviction snapshot_eviction, std::int64_t load_back_min_tokens,
                        std::int64_t max_snapshots_per_path, double host_pin_share) {
  CacheConfig c;
  c.page_size = count_from<std::uint32_t>(page_size, "CacheConfig.page_size");
  c.gpu_pages = count_from<std::uint32_t>(gpu_pages, "CacheConfig.gpu_pages");
  c.host_pages = count_from<std::uint32_t>(host_pages, "CacheConfig.host_pages");
  c.gpu_snapshot_slots =
      count_from<std::uint32_t>(gpu_snapshot_slots, "CacheConfig.gpu_snapshot_slots");
  c.host_snapshot_slots =
      count_from<std::uint32_t>(host_snapshot_slots, "CacheConfig.host_snapshot_slots");
  c.page_bytes = count_from<std::size_t>(page_bytes, "CacheConfig.page_bytes");
  c.snapshot_bytes = count_from<std::size_t>(snapshot_bytes, "CacheConfig.snapshot_bytes");
  c.slice_pages = count_from<std::uint32_t>(slice_pages, "CacheConfig.slice_pages");
  c.write_policy = write_policy;
  c.snapshot_eviction = snapshot_eviction;
  c.load_back_min_tokens =
      count_from<std::uint32_t>(load_back_min_tokens, "CacheConfig.load_back_min_tokens");
  c.max_snapshots_per_path =
      count_from<std::uint32_t>(max_snapshots_per_path, "CacheConfig.max_snapshots_per_path");
  c.host_pin_share = host_pin_share;
  check(c.validate());
  return c;
}

}  // namespace

void bind_config(py::module_& m) {
  py::enum_<ErrorCode>(m, "ErrorCode", "The code of a radixtier Status (Error.code).")
      .value("OK", ErrorCode::kOk)
      .value("INVALID_ARGUMENT", ErrorCode::kInvalidArgument)
      .value("NOT_FOUND", ErrorCode::kNotFound)
      .value("OUT_OF_MEMORY", ErrorCode::kOutOfMemory)
      .value("TRANSFER_FAILED", ErrorCode::kTransferFailed)
      .value("PENDING", ErrorCode::kPending)
      .value("FAILED_PRECONDITION", ErrorCode::kFailedPrecondition)
      .value("DEVICE_LOST", ErrorCode::kDeviceLost);
  py::enum_<WritePolicy>(m, "WritePolicy", "When a GPU copy reaches host memory.")
      .value("WRITE_BACK", WritePolicy::kWriteBack)
      .value("WRITE_THROUGH", WritePolicy::kWriteThrough);
  py::enum_<SnapshotEviction>(m, "SnapshotEviction",
                              "How victims are ordered and the host tier is split.")
      .value("COST_AWARE", SnapshotEviction::kCostAware)
      .value("LRU", SnapshotEviction::kLru)
      .value("UTILITY", SnapshotEviction::kUtility);
  py::enum_<TransferState>(m, "TransferState")
      .value("PENDING", TransferState::kPending)
      .value("DONE", TransferState::kDone)
      .value("FAILED", TransferState::kFailed);
  py::enum_<Direction>(m, "Direction")
      .value("DEVICE_TO_HOST", Direction::kDeviceToHost)
      .value("HOST_TO_DEVICE", Direction::kHostToDevice)
      .value("DEVICE_TO_DEVICE", Direction::kDeviceToDevice);

  const CacheConfig d;
  py::class_<CacheConfig>(m, "CacheConfig",
                          "The cache's one config struct. Validated when built (an "
                          "InvalidArgumentError names the bad field) and immutable: "
                          "replace(**changes) returns a new, validated one.")
      .def(py::init(&make_config), py::kw_only(), py::arg("page_size") = d.page_size,
           py::arg("gpu_pages") = d.gpu_pages, py::arg("host_pages") = d.host_pages,
           py::arg("gpu_snapshot_slots") = d.gpu_snapshot_slots,
           py::arg("host_snapshot_slots") = d.host_snapshot_slots,
           py::arg("page_bytes") = d.page_bytes, py::arg("snapshot_bytes") = d.snapshot_bytes,
           py::arg("slice_pages") = d.slice_pages, py::arg("write_policy") = d.write_policy,
           py::arg("snapshot_eviction") = d.snapshot_eviction,
           py::arg("load_back_min_tokens") = d.load_back_min_tokens,
           py::arg("max_snapshots_per_path") = d.max_snapshots_per_path,
           py::arg("host_pin_share") = d.host_pin_share)
      .def_readonly("page_size", &CacheConfig::page_size, "tokens per page")
      .def_readonly("gpu_pages", &CacheConfig::gpu_pages, "GPU KV pool, in pages")
      .def_readonly("host_pages", &CacheConfig::host_pages, "host KV pool, in pages")
      .def_readonly("gpu_snapshot_slots", &CacheConfig::gpu_snapshot_slots)
      .def_readonly("host_snapshot_slots", &CacheConfig::host_snapshot_slots)
      .def_readonly("page_bytes", &CacheConfig::page_bytes,
                    "bytes of one page, all attention layers, K and V")
      .def_readonly("snapshot_bytes", &CacheConfig::snapshot_bytes,
                    "bytes of one snapshot of the full recurrent state")
      .def_readonly("slice_pages", &CacheConfig::slice_pages, "at most this many pages per copy")
      .def_readonly("write_policy", &CacheConfig::write_policy)
      .def_readonly("snapshot_eviction", &CacheConfig::snapshot_eviction)
      .def_readonly("load_back_min_tokens", &CacheConfig::load_back_min_tokens,
                    "admit loads back only when that resumes this many tokens deeper than the "
                    "GPU alone would (0: always)")
      .def_readonly("max_snapshots_per_path", &CacheConfig::max_snapshots_per_path,
                    "at most this many snapshots on one root-to-leaf path (0: no cap)")
      .def_readonly("host_pin_share", &CacheConfig::host_pin_share,
                    "share of the host pool pins may hold, in [0, 1]")
      .def_property_readonly("slice_bytes", &CacheConfig::slice_bytes)
      .def_property_readonly("snapshot_pages", &CacheConfig::snapshot_pages,
                             "host (and GPU) pages one snapshot spans")
      .def_property_readonly(
          "host_pool_pages", &CacheConfig::host_pool_pages,
          "pages of the one host pool: host_pages + host_snapshot_slots * snapshot_pages (the "
          "size, in pages, of the CUDA engine's pinned host_kv pool)")
      .def("to_dict", &to_dict)
      .def(
          "replace",
          [](const CacheConfig& c, const py::kwargs& changes) {
            py::dict fields = to_dict(c);
            for (auto [k, v] : changes) {
              if (!fields.contains(k))
                throw py::type_error("CacheConfig.replace: unknown field '" +
                                     std::string(py::str(k)) + "'");
              fields[k] = v;
            }
            return py::type::of<CacheConfig>()(**fields).cast<CacheConfig>();
          },
          "A copy with the given fields changed, validated.")
      .def(
          "__eq__",
          [](const CacheConfig& a, const CacheConfig& b) { return to_dict(a).equal(to_dict(b)); },
          py::is_operator())
      // Immutable, so hashable (a dict key, a set member), and picklable: an engine hands
      // its config to the processes of its tensor-parallel ranks.
      .def("__hash__",
           [](const CacheConfig& c) {
             py::list values;
             for (auto [k, v] : to_dict(c)) values.append(py::make_tuple(k, v));
             return py::hash(py::tuple(values));
           })
      .def(py::pickle([](const CacheConfig& c) { return to_dict(c); },
                      [](const py::dict& fields) {
                        return py::type::of<CacheConfig>()(**fields).cast<CacheConfig>();
                      }))
      .def("__repr__", [](const CacheConfig& c) {
        std::ostringstream os;
        os << "CacheConfig(page_size=" << c.page_size << ", gpu_pages=" << c.gpu_pages
           << ", host_pages=" << c.host_pages << ", gpu_snapshot_slots=" << c.gpu_snapshot_slots
           << ", host_snapshot_slots=" << c.host_snapshot_slots << ", page_bytes=" << c.page_bytes
           << ", snapshot_bytes=" << c.snapshot_bytes << ", slice_pages=" << c.slice_pages
           << ", write_policy=" << to_string(c.write_policy)
           << ", snapshot_eviction=" << to_string(c.snapshot_eviction)
           << ", load_back_min_tokens=" << c.load_back_min_tokens
           << ", max_snapshots_per_path=" << c.max_snapshots_per_path << ")";
        return os.str();
      });
}

}  // namespace radixtier::python
