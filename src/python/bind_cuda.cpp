// The `cuda` submodule: the CUDA transfer engine over an engine's own device tensors.
//
// A PyTorch engine owns its KV pool and state pool as CUDA tensors. DeviceLayout.from_tensors
// describes them to the engine without a copy: any object with the torch tensor attributes
// (data_ptr, shape, stride, element_size, is_cuda, device) or a __cuda_array_interface__
// (CuPy, Numba, torch) is read as (pointer, shape, strides, item size); the dimension
// `item_dim` indexes pages (or snapshot slots), every dimension after it must be C-contiguous
// (one item's segment is contiguous), the dimensions before it may have any strides (each of
// their index combinations is one strided segment: a [2, layers, pages, page_size, kv_heads,
// head_dim] pool is 2 * layers segments). Several tensors (per-layer K and V, conv and
// recurrent state) add their segments in order. The layout keeps the tensors alive, the
// engine keeps its layouts and host pools alive.
//
// The compute stream is an int (torch.cuda.current_stream().cuda_stream; 0, PyTorch's default
// stream, is the legacy default stream) or an object with a cuda_stream attribute; the engine
// checks it is a live stream of its device inside its own context guard. The module links the
// CUDA runtime statically; streams and device pointers are driver objects of the process's
// primary context, shared with torch's own runtime. A PyTorch built for another CUDA major
// version than this module draws a warning at engine creation: this module's static runtime
// then needs the newer driver (docs/cuda.md, "Driver floor").
#include <cuda_runtime_api.h>
#include <pybind11/stl.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "arena_view.hpp"
#include "arrays.hpp"
#include "bindings.hpp"
#include "errors.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"
#include "radixtier/cuda/pinned_host_pool.hpp"
#include "records.hpp"

namespace radixtier::python {

namespace {

constexpr std::size_t kMaxSegments = 1u << 16;

/// A device tensor as the engine needs it.
struct TensorDesc {
  std::uintptr_t ptr = 0;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  ///< bytes
  std::size_t itemsize = 0;
  int device = -1;  ///< -1: not reported
};

std::string shape_str(const std::vector<std::int64_t>& v) {
  std::ostringstream os;
  os << "(";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << (v.size() == 1 ? ",)" : ")");
  return os.str();
}

TensorDesc describe(py::handle t, const std::string& what) {
  TensorDesc d;
  if (py::hasattr(t, "data_ptr") && py::hasattr(t, "element_size") && py::hasattr(t, "is_cuda")) {
    if (!t.attr("is_cuda").cast<bool>()) {
      raise_invalid(what + ": a CPU tensor; the CUDA engine's pools must be CUDA tensors");
    }
    d.ptr = t.attr("data_ptr")().cast<std::uintptr_t>();
    d.itemsize = t.attr("element_size")().cast<std::size_t>();
    d.shape = py::cast<std::vector<std::int64_t>>(t.attr("shape"));
    for (std::int64_t s : py::cast<std::vector<std::int64_t>>(t.attr("stride")()))
      d.strides.push_back(s * static_cast<std::int64_t>(d.itemsize));
    py::object dev = t.attr("device");
    if (py::hasattr(dev, "index") && !dev.attr("index").is_none())
      d.device = dev.attr("index").cast<int>();
    return d;
  }
  if (py::hasattr(t, "__cuda_array_interface__")) {
    py::dict cai = t.attr("__cuda_array_interface__");
    d.shape = py::cast<std::vector<std::int64_t>>(cai["shape"]);
    const std::string typestr = py::str(cai["typestr"]);
    if (typestr.size() < 3) raise_invalid(what + ": bad typestr '" + typestr + "'");
    d.itemsize = std::stoul(typestr.substr(2));
    py::tuple data = cai["data"];
    d.ptr = data[0].cast<std::uintptr_t>();
    if (data[1].cast<bool>())
      raise_invalid(what + ": read-only device memory; promotions write into the pools");
    if (cai.contains("strides") && !cai["strides"].is_none()) {
      d.strides = py::cast<std::vector<std::int64_t>>(cai["strides"]);
    } else {
      d.strides.assign(d.shape.size(), 0);
      std::int64_t s = static_cast<std::int64_t>(d.itemsize);
      for (std::size_t i = d.shape.size(); i > 0; --i) {
        d.strides[i - 1] = s;
        s *= d.shape[i - 1];
      }
    }
    return d;
  }
  throw py::type_error(what +
                       ": expected a CUDA tensor (torch) or an object with "
                       "__cuda_array_interface__, got " +
                       std::string(py::str(py::type::of(t))));
}

/// The strided segments of one tensor whose dimension `item_dim` indexes the items.
void append_segments(const TensorDesc& d, std::size_t item_dim, const std::string& what,
                     std::vector<cuda::StridedSegment>& out, std::int64_t& items) {
  const std::size_t n = d.shape.size();
  if (d.strides.size() != n) raise_invalid(what + ": strides and shape differ in length");
  if (item_dim >= n) {
    raise_invalid(what + ": item_dim " + std::to_string(item_dim) + " but the tensor has shape " +
                  shape_str(d.shape));
  }
  if (d.ptr == 0) raise_invalid(what + ": null data pointer");
  if (d.itemsize == 0) raise_invalid(what + ": zero item size");
  for (std::int64_t s : d.shape)
    if (s <= 0) raise_invalid(what + ": empty tensor of shape " + shape_str(d.shape));
  if (items >= 0 && d.shape[item_dim] != items) {
    raise_invalid(what + ": " + std::to_string(d.shape[item_dim]) + " items along dim " +
                  std::to_string(item_dim) + ", the layout's other tensors have " +
                  std::to_string(items));
  }
  items = d.shape[item_dim];
  // One item's part must be contiguous: the dimensions after item_dim are C-ordered.
  std::int64_t inner = static_cast<std::int64_t>(d.itemsize);
  for (std::size_t j = n; j > item_dim + 1; --j) {
    const std::size_t k = j - 1;
    if (d.shape[k] != 1 && d.strides[k] != inner) {
      raise_invalid(what + ": dimensions after item_dim must be contiguous (shape " +
                    shape_str(d.shape) + ", byte strides " + shape_str(d.strides) + ")");
    }
    inner *= d.shape[k];
  }
  const std::int64_t item_stride = d.strides[item_dim];
  if (items > 1 && item_stride < inner) {
    raise_invalid(what + ": items overlap or run backwards (item stride " +
                  std::to_string(item_stride) + " bytes, item part " + std::to_string(inner) +
                  " bytes)");
  }
  std::size_t count = 1;
  for (std::size_t k = 0; k < item_dim; ++k) count *= static_cast<std::size_t>(d.shape[k]);
  if (out.size() + count > kMaxSegments)
    raise_invalid(what + ": more than " + std::to_string(kMaxSegments) + " segments");
  std::vector<std::int64_t> idx(item_dim, 0);
  for (std::size_t c = 0; c < count; ++c) {
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < item_dim; ++k) {
      if (d.strides[k] < 0) raise_invalid(what + ": negative strides are not supported");
      offset += idx[k] * d.strides[k];
    }
    out.push_back({d.ptr + static_cast<std::uintptr_t>(offset),
                   static_cast<std::size_t>(item_stride), static_cast<std::size_t>(inner)});
    for (std::size_t k = item_dim; k > 0; --k) {  // next index combination, last fastest
      if (++idx[k - 1] < d.shape[k - 1]) break;
      idx[k - 1] = 0;
    }
  }
}

struct PyDeviceLayout {
  cuda::DeviceLayout layout;
  py::list sources;  ///< the tensors, kept alive while the layout (and an engine) lives
  int device = -1;   ///< the tensors' device when they reported one
};

/// Segment c of a layout of `layers` layers (tensors [2, layers, ...] or per-layer K lists then
/// V lists) belongs to layer c % layers.
void set_layers(cuda::DeviceLayout& layout, std::int64_t layers) {
  if (layers == 0) return;
  const auto n = count_from<std::uint32_t>(layers, "layers");
  if (layout.segments.size() % n != 0) {
    raise_invalid("DeviceLayout: " + std::to_string(layout.segments.size()) +
                  " segments are not a multiple of layers = " + std::to_string(n));
  }
  for (std::size_t c = 0; c < layout.segments.size(); ++c)
    layout.segment_layers.push_back(static_cast<std::uint32_t>(c % n));
}

PyDeviceLayout from_tensors(const py::object& tensors, std::int64_t item_dim, std::int64_t layers) {
  PyDeviceLayout out;
  py::list list;
  if (py::isinstance<py::list>(tensors) || py::isinstance<py::tuple>(tensors)) {
    for (py::handle t : tensors) list.append(t);
  } else {
    list.append(tensors);
  }
  if (list.empty()) raise_invalid("DeviceLayout.from_tensors: no tensors");
  const auto dim = count_from<std::size_t>(item_dim, "item_dim");
  std::int64_t items = -1;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string what = "tensors[" + std::to_string(i) + "]";
    const TensorDesc d = describe(list[i], what);
    if (d.device >= 0) {
      if (out.device >= 0 && out.device != d.device) {
        raise_invalid(what + ": on device " + std::to_string(d.device) + ", the others on device " +
                      std::to_string(out.device));
      }
      out.device = d.device;
    }
    append_segments(d, dim, what, out.layout.segments, items);
  }
  out.layout.items = static_cast<std::uint32_t>(count_from<std::uint32_t>(items, "items"));
  set_layers(out.layout, layers);
  check(out.layout.validate("DeviceLayout"));
  out.sources = list;
  return out;
}

PyDeviceLayout from_segments(
    const std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>>& segments,
    std::int64_t items, std::int64_t layers) {
  PyDeviceLayout out;
  for (auto [base, stride, bytes] : segments)
    out.layout.segments.push_back({static_cast<std::uintptr_t>(base),
                                   static_cast<std::size_t>(stride),
                                   static_cast<std::size_t>(bytes)});
  out.layout.items = count_from<std::uint32_t>(items, "items");
  set_layers(out.layout, layers);
  check(out.layout.validate("DeviceLayout"));
  return out;
}

struct PyPinnedPool {
  cuda::PinnedHostPool pool;
  std::size_t item_bytes = 0;
  int device = 0;  ///< the GPU whose primary context registered the pool
};

/// torch, when it is imported and has a usable CUDA device, else None.
py::object torch_with_cuda() {
  py::module_ sys = py::module_::import("sys");
  py::object torch;
  if (sys.attr("modules").contains("torch")) {
    torch = sys.attr("modules")["torch"];
  } else {
    try {
      torch = py::module_::import("torch");
    } catch (const py::error_already_set&) {
      return py::none();
    }
  }
  if (!torch.attr("cuda").attr("is_available")().cast<bool>()) return py::none();
  return torch;
}

/// A device argument: an int >= 0, "cuda" / "cuda:N", an object with `type` and `index`
/// (torch.device), or None: torch's current CUDA device (an error naming `what` when torch
/// has no CUDA device). A device without an index is the current one too.
int device_from(const py::object& d, const std::string& what) {
  auto current = [&]() -> int {
    py::object torch = torch_with_cuda();
    if (torch.is_none()) {
      raise(Status(ErrorCode::kFailedPrecondition,
                   what + ": no device given and torch.cuda is not available (torch missing, no "
                          "CUDA device visible, or a CPU-only build): pass device=N, the GPU that "
                          "copies to and from this memory"));
    }
    return torch.attr("cuda").attr("current_device")().cast<int>();
  };
  if (d.is_none()) return current();
  if (py::isinstance<py::bool_>(d)) throw py::type_error(what + ": device must be an int");
  if (py::isinstance<py::int_>(d)) {
    const auto v = d.cast<std::int64_t>();
    if (v < 0 || v > 1 << 20)
      raise_invalid(what + ": device = " + std::to_string(v) + " is not >= 0");
    return static_cast<int>(v);
  }
  std::string type;
  py::object index = py::none();
  if (py::isinstance<py::str>(d)) {
    const std::string text = d.cast<std::string>();
    const auto colon = text.find(':');
    type = text.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string n = text.substr(colon + 1);
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 6)
        raise_invalid(what + ": device '" + text + "' is not 'cuda' or 'cuda:N'");
      index = py::int_(std::stoi(n));
    }
  } else if (py::hasattr(d, "type") && py::hasattr(d, "index")) {
    type = py::str(d.attr("type"));
    index = d.attr("index");
  } else {
    throw py::type_error(what + ": device must be an int, 'cuda:N' or a torch.device, got " +
                         std::string(py::str(py::type::of(d))));
  }
  if (type != "cuda") raise_invalid(what + ": device of type '" + type + "', not a CUDA device");
  return index.is_none() ? current() : device_from(index, what);
}

/// numa_node: None -> the device's node; -1 -> no binding; N -> node N, which must exist.
int numa_from(const py::object& n) {
  if (n.is_none()) return cuda::PinnedHostPool::kNumaOfDevice;
  if (py::isinstance<py::bool_>(n) || !py::isinstance<py::int_>(n))
    throw py::type_error("PinnedHostPool: numa_node must be an int or None");
  const auto v = n.cast<std::int64_t>();
  if (v == -1) return cuda::PinnedHostPool::kNoNuma;
  if (v < 0 || v > 1 << 16)
    raise_invalid("PinnedHostPool: numa_node = " + std::to_string(v) +
                  " (None: the device's node, -1: no binding, or a node id >= 0)");
  const std::filesystem::path sys = "/sys/devices/system/node";
  std::error_code ec;
  if (std::filesystem::is_directory(sys, ec) &&
      !std::filesystem::is_directory(sys / ("node" + std::to_string(v)), ec)) {
    std::string nodes;
    for (const auto& e : std::filesystem::directory_iterator(sys, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("node", 0) == 0 && name.size() > 4 &&
          name.find_first_not_of("0123456789", 4) == std::string::npos)
        nodes += (nodes.empty() ? "" : ", ") + name.substr(4);
    }
    raise_invalid("PinnedHostPool: NUMA node " + std::to_string(v) +
                  " does not exist on this machine (nodes: " + nodes + ")");
  }
  return static_cast<int>(v);
}

cudaStream_t stream_from(const py::object& s) {
  if (s.is_none()) return nullptr;
  return reinterpret_cast<cudaStream_t>(stream_handle_from(s));
}

/// A per-call stream: the given one, or (None) torch's current stream on `device` when torch
/// has CUDA, else the engine's default compute stream (nullptr). A handle of 0 (what torch
/// reports for its default stream) is the legacy default stream, cudaStreamLegacy: in a
/// TransferBatch nullptr would mean the engine's compute stream instead.
cudaStream_t call_stream(const py::object& s, int device) {
  py::object v = s;
  if (v.is_none()) {
    py::object torch = torch_with_cuda();
    if (torch.is_none()) return nullptr;
    v = torch.attr("cuda").attr("current_stream")(device);
  }
  const cudaStream_t h = stream_from(v);
  return h != nullptr ? h : cudaStreamLegacy;
}

/// Warns when the PyTorch of this process was built for another CUDA major version than this
/// module's static runtime (which then needs that major's driver).
void warn_on_cuda_major_mismatch() {
  py::module_ sys = py::module_::import("sys");
  if (!sys.attr("modules").contains("torch")) return;
  py::object version = sys.attr("modules")["torch"].attr("version").attr("cuda");
  if (version.is_none()) return;
  const std::string torch_cuda = py::str(version);
  int runtime = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  const std::string mine = std::to_string(runtime / 1000);
  if (torch_cuda.substr(0, torch_cuda.find('.')) == mine) return;
  py::module_::import("warnings")
      .attr("warn")("radixtier's CUDA engine links CUDA runtime " + std::to_string(runtime / 1000) +
                    "." + std::to_string(runtime % 1000 / 10) + " statically, PyTorch uses CUDA " +
                    torch_cuda + ": the NVIDIA driver must be >= " + cuda::driver_floor(runtime) +
                    ". Build radixtier with the CUDA major version of this PyTorch "
                    "(docs/cuda.md, Driver floor).");
}

/// The CUDA engine as the module holds it. Forwards the TransferEngine interface.
class PyCudaEngine final : public TransferEngine {
 public:
  explicit PyCudaEngine(std::unique_ptr<cuda::CudaTransferEngine> e) : engine_(std::move(e)) {}
  Result<Ticket> submit(TransferBatch batch) override { return engine_->submit(std::move(batch)); }
  TransferState poll(TicketId id) override { return engine_->poll(id); }
  TransferState wait(TicketId id) override { return engine_->wait(id); }
  void release(TicketId id) override { engine_->release(id); }
  std::size_t slice_pages() const override { return engine_->slice_pages(); }
  EngineCapacity capacity() const override { return engine_->capacity(); }
  HostPages* host_memory() override { return engine_->host_memory(); }
  // Through the base class: whatever the CUDA engine implements of the interface's stream
  // calls (a device wait) is what the cache gets, never the host-waiting default.
  Status stream_wait(TicketId id, StreamHandle stream,
                     std::optional<std::uint32_t> layer) override {
    return static_cast<TransferEngine&>(*engine_).stream_wait(id, stream, layer);
  }
  bool waits_on_device() const override {
    return static_cast<const TransferEngine&>(*engine_).waits_on_device();
  }

  cuda::CudaTransferEngine& engine() { return *engine_; }

 private:
  std::unique_ptr<cuda::CudaTransferEngine> engine_;
};

std::unique_ptr<PyCudaEngine> make_engine(
    const PyDeviceLayout& gpu_kv, const PyDeviceLayout* gpu_snapshots, PyPinnedPool* host_kv,
    PyPinnedPool* host_snapshots, std::int64_t slice_pages, int device, cuda::CopyMethod d2h,
    cuda::CopyMethod h2d, const py::object& compute_stream, bool demote_after_compute,
    bool promote_after_compute, int kernel_blocks, std::int64_t promote_layer_groups,
    std::int64_t slices_in_flight, std::int64_t kernel_below_piece_bytes, cuda::CopyMethod d2d,
    int d2d_kernel_blocks) {
  cuda::CudaPools pools;
  pools.gpu_kv = gpu_kv.layout;
  if (gpu_snapshots != nullptr) pools.gpu_snapshots = gpu_snapshots->layout;
  for (const PyDeviceLayout* l : {&gpu_kv, gpu_snapshots}) {
    if (l != nullptr && l->device >= 0 && l->device != device) {
      raise_invalid("CudaTransferEngine: a pool's tensors are on device " +
                    std::to_string(l->device) + ", the engine on device " + std::to_string(device));
    }
  }
  const std::size_t page_bytes = pools.gpu_kv.item_bytes();
  const std::size_t snapshot_bytes =
      gpu_snapshots != nullptr ? pools.gpu_snapshots.item_bytes() : 0;
  auto host = [device](PyPinnedPool* p, std::size_t item, const char* what, std::byte*& base,
                       std::uint32_t& count, std::size_t& chunk) {
    if (p == nullptr) return;
    if (item == 0) raise_invalid(std::string(what) + ": given but the device pool is empty");
    if (p->device != device) {
      raise_invalid(std::string(what) + ": pinned for device " + std::to_string(p->device) +
                    " (its context and NUMA node), the engine is on device " +
                    std::to_string(device) +
                    ": make it with PinnedHostPool(..., device=" + std::to_string(device) + ")");
    }
    if (p->item_bytes != item) {
      raise_invalid(std::string(what) + ": items of " + std::to_string(p->item_bytes) +
                    " bytes, the device pool's are " + std::to_string(item));
    }
    base = p->pool.data();
    count = count_from<std::uint32_t>(static_cast<std::int64_t>(p->pool.bytes() / item), what);
    chunk = p->pool.register_chunk_bytes();
  };
  host(host_kv, page_bytes, "host_kv", pools.host_kv, pools.host_pages, pools.host_kv_chunk_bytes);
  host(host_snapshots, snapshot_bytes, "host_snapshots", pools.host_snapshots, pools.host_slots,
       pools.host_snapshot_chunk_bytes);

  cuda::CudaEngineOptions o;
  o.device = device;
  o.slice_pages = count_from<std::uint32_t>(slice_pages, "slice_pages");
  o.d2h = d2h;
  o.h2d = h2d;
  o.compute_stream = call_stream(compute_stream, device);
  o.demote_after_compute = demote_after_compute;
  o.promote_after_compute = promote_after_compute;
  o.kernel_blocks = kernel_blocks;
  o.d2d = d2d;
  o.d2d_kernel_blocks = d2d_kernel_blocks;
  o.promote_layer_groups = count_from<std::uint32_t>(promote_layer_groups, "promote_layer_groups");
  o.slices_in_flight = count_from<std::size_t>(slices_in_flight, "slices_in_flight");
  o.kernel_below_piece_bytes =
      count_from<std::size_t>(kernel_below_piece_bytes, "kernel_below_piece_bytes");
  warn_on_cuda_major_mismatch();

  Result<std::unique_ptr<cuda::CudaTransferEngine>> made = [&] {
    py::gil_scoped_release nogil;
    return cuda::CudaTransferEngine::create(std::move(pools), o);
  }();
  return std::make_unique<PyCudaEngine>(unwrap(std::move(made)));
}

}  // namespace

StreamHandle cuda_call_stream(py::handle engine, const py::object& stream) {
  auto& e = engine.cast<PyCudaEngine&>();
  return call_stream(stream, e.engine().options().device);
}

TransferEngine* cuda_engine_of(py::handle obj) {
  if (!py::isinstance<PyCudaEngine>(obj)) return nullptr;
  return &obj.cast<PyCudaEngine&>();
}

void bind_cuda(py::module_& m) {
  py::enum_<cuda::CopyMethod>(m, "CopyMethod")
      .value("AUTO", cuda::CopyMethod::kAuto)
      .value("DMA_BATCH", cuda::CopyMethod::kDmaBatch)
      .value("ZERO_COPY_KERNEL", cuda::CopyMethod::kZeroCopyKernel);

  py::class_<PyDeviceLayout>(m, "DeviceLayout",
                             "A device pool (KV pages or snapshot slots) as strided segments.")
      .def_static("from_tensors", &from_tensors, py::arg("tensors"), py::arg("item_dim") = 0,
                  py::arg("layers") = 0,
                  "Describes one tensor or a list of tensors whose dimension item_dim indexes "
                  "the items; validated (contiguous items, same item count, no overlap). "
                  "layers > 0: segment c belongs to layer c % layers (a [2, layers, pages, ...] "
                  "pool, or per-layer K tensors then V tensors), so promotions go layer by "
                  "layer (stream_wait_layer).")
      .def_static("from_segments", &from_segments, py::arg("segments"), py::arg("items"),
                  py::arg("layers") = 0,
                  "Raw (base, item_stride, bytes) segments, for engines without tensors.")
      .def_property_readonly("items", [](const PyDeviceLayout& l) { return l.layout.items; })
      .def_property_readonly("item_bytes",
                             [](const PyDeviceLayout& l) { return l.layout.item_bytes(); })
      .def_property_readonly("device", [](const PyDeviceLayout& l) { return l.device; })
      .def_property_readonly("layers", [](const PyDeviceLayout& l) { return l.layout.layers(); })
      .def_property_readonly(
          "segments",
          [](const PyDeviceLayout& l) {
            std::vector<std::tuple<std::uintptr_t, std::size_t, std::size_t>> out;
            for (const auto& s : l.layout.segments)
              out.emplace_back(s.base, s.item_stride, s.bytes);
            return out;
          })
      .def_readonly("sources", &PyDeviceLayout::sources);

  py::class_<PyPinnedPool>(m, "PinnedHostPool",
                           "Pinned (page-locked, mapped) host memory for the host tier.")
      .def(
          py::init([](std::int64_t bytes, std::int64_t item_bytes, const py::object& device,
                      const py::object& numa_node, bool numa_strict, bool mapped, bool huge_pages) {
            cuda::PinnedHostPool::Options o;
            o.mapped = mapped;
            o.huge_pages = huge_pages;
            const auto b = count_from<std::size_t>(bytes, "bytes");
            const auto item = count_from<std::size_t>(item_bytes, "item_bytes");
            if (b == 0) raise_invalid("PinnedHostPool: bytes must be > 0");
            if (item == 0) raise_invalid("PinnedHostPool: item_bytes must be > 0");
            o.numa_node = numa_from(numa_node);
            o.numa_strict = numa_strict;
            if (numa_strict && o.numa_node == cuda::PinnedHostPool::kNoNuma)
              raise_invalid("PinnedHostPool: numa_strict=True with numa_node=-1 (no binding)");
            o.device = device_from(device, "PinnedHostPool");
            Result<cuda::PinnedHostPool> made = [&] {
              py::gil_scoped_release nogil;
              return cuda::PinnedHostPool::create(b, item, o);
            }();
            return std::make_unique<PyPinnedPool>(
                PyPinnedPool{unwrap(std::move(made)), item, o.device});
          }),
          py::arg("bytes"), py::arg("item_bytes"), py::kw_only(), py::arg("device") = py::none(),
          py::arg("numa_node") = py::none(), py::arg("numa_strict") = false,
          py::arg("mapped") = true, py::arg("huge_pages") = true,
          "Maps, touches and pins `bytes` bytes in chunks aligned to `item_bytes`. device: the "
          "GPU that copies to and from the pool (an int, 'cuda:N' or a torch.device; None: "
          "torch's current device, an error without torch.cuda): only its primary context is "
          "retained. numa_node: None binds the memory to that GPU's NUMA node, -1 binds none, "
          "N binds node N (MPOL_PREFERRED; numa_strict=True: MPOL_BIND, an error when the "
          "node is full or the binding fails).")
      .def_property_readonly("bytes", [](const PyPinnedPool& p) { return p.pool.bytes(); })
      .def_readonly("item_bytes", &PyPinnedPool::item_bytes)
      .def_readonly("device", &PyPinnedPool::device, "the GPU whose context registered it")
      .def_property_readonly(
          "numa_node",
          [](const PyPinnedPool& p) -> py::object {
            const int n = p.pool.numa_node();
            return n >= 0 ? py::object(py::int_(n)) : py::object(py::none());
          },
          "the NUMA node the memory is bound to, or None (none asked, none known, refused)")
      .def_property_readonly("register_chunk_bytes",
                             [](const PyPinnedPool& p) { return p.pool.register_chunk_bytes(); })
      .def_property_readonly("view", [](py::object self) {
        auto& p = self.cast<PyPinnedPool&>();
        return ArenaView{p.pool.data(), p.pool.bytes() / p.item_bytes, p.item_bytes, "pinned",
                         self};
      });

  py::class_<PyCudaEngine, TransferEngine>(
      m, "CudaTransferEngine",
      "TransferEngine on a GPU: copies between the engine's device pools and pinned host pools "
      "on its own streams, ordered after the compute stream.")
      .def(py::init([](const PyDeviceLayout& gpu_kv, const PyDeviceLayout* gpu_snapshots,
                       PyPinnedPool* host_kv, PyPinnedPool* host_snapshots,
                       std::int64_t slice_pages, const py::object& device, cuda::CopyMethod d2h,
                       cuda::CopyMethod h2d, const py::object& compute_stream,
                       bool demote_after_compute, bool promote_after_compute, int kernel_blocks,
                       std::int64_t promote_layer_groups, std::int64_t slices_in_flight,
                       std::int64_t kernel_below_piece_bytes, cuda::CopyMethod d2d,
                       int d2d_kernel_blocks) {
             // device None: the pools' device, else torch's current one, else 0.
             int dev = gpu_kv.device;
             if (!device.is_none()) {
               dev = device_from(device, "CudaTransferEngine");
             } else if (dev < 0) {
               dev = torch_with_cuda().is_none() ? 0 : device_from(device, "CudaTransferEngine");
             }
             return make_engine(gpu_kv, gpu_snapshots, host_kv, host_snapshots, slice_pages, dev,
                                d2h, h2d, compute_stream, demote_after_compute,
                                promote_after_compute, kernel_blocks, promote_layer_groups,
                                slices_in_flight, kernel_below_piece_bytes, d2d, d2d_kernel_blocks);
           }),
           py::arg("gpu_kv"), py::arg("gpu_snapshots") = py::none(),
           py::arg("host_kv") = py::none(), py::arg("host_snapshots") = py::none(), py::kw_only(),
           py::arg("slice_pages") = 128, py::arg("device") = py::none(),
           py::arg("d2h") = cuda::CopyMethod::kAuto, py::arg("h2d") = cuda::CopyMethod::kAuto,
           py::arg("compute_stream") = py::none(), py::arg("demote_after_compute") = true,
           py::arg("promote_after_compute") = true, py::arg("kernel_blocks") = 0,
           py::arg("promote_layer_groups") = 0, py::arg("slices_in_flight") = 2,
           py::arg("kernel_below_piece_bytes") = 32 << 10, py::arg("d2d") = cuda::CopyMethod::kAuto,
           py::arg("d2d_kernel_blocks") = 0, py::keep_alive<1, 2>(), py::keep_alive<1, 3>(),
           py::keep_alive<1, 4>(), py::keep_alive<1, 5>())
      .def_property_readonly("page_bytes", [](PyCudaEngine& e) { return e.engine().page_bytes(); })
      .def_property_readonly("snapshot_bytes",
                             [](PyCudaEngine& e) { return e.engine().snapshot_bytes(); })
      .def_property_readonly(
          "streams",
          [](PyCudaEngine& e) {
            return py::make_tuple(
                reinterpret_cast<std::uintptr_t>(e.engine().stream(Direction::kDeviceToHost)),
                reinterpret_cast<std::uintptr_t>(e.engine().stream(Direction::kHostToDevice)));
          },
          "(device-to-host, host-to-device) copy streams as ints")
      .def(
          "stream_wait",
          [](PyCudaEngine& e, std::int64_t ticket, const py::object& stream,
             std::optional<std::int64_t> layer) {
            const TicketId id = id_from<TicketId>(ticket, "ticket");
            const cudaStream_t s = call_stream(stream, e.engine().options().device);
            std::optional<std::uint32_t> l;
            if (layer) l = count_from<std::uint32_t>(*layer, "layer");
            // The error is raised with the GIL back (raising without it crashes).
            const Status st = [&] {
              py::gil_scoped_release nogil;
              return l ? e.engine().stream_wait_layer(id, *l, s) : e.engine().stream_wait(id, s);
            }();
            check(st);
          },
          py::arg("ticket"), py::arg("stream") = py::none(), py::arg("layer") = py::none(),
          "Makes `stream` (None: torch.cuda.current_stream() of the engine's device; 0: the "
          "legacy default stream) wait on the GPU for a ticket's copies, or with `layer` for "
          "the pages of the layers up to it (no host wait).")
      .def(
          "health", [](PyCudaEngine& e) { return health_of(e.engine().health()); },
          "EngineHealth: ok, or DEVICE_LOST with the CUDA error once a sticky error was seen "
          "(the context is gone: restart the process).")
      .def_property_readonly("device", [](PyCudaEngine& e) { return e.engine().options().device; })
      .def(
          "stream_wait_layer",
          [](PyCudaEngine& e, std::int64_t ticket, std::int64_t layer, const py::object& stream) {
            const TicketId id = id_from<TicketId>(ticket, "ticket");
            const auto l = count_from<std::uint32_t>(layer, "layer");
            const cudaStream_t s = call_stream(stream, e.engine().options().device);
            const Status st = [&] {
              py::gil_scoped_release nogil;
              return e.engine().stream_wait_layer(id, l, s);
            }();
            check(st);
          },
          py::arg("ticket"), py::arg("layer"), py::arg("stream") = py::none(),
          "Makes `stream` wait on the GPU for the pages of the layers up to `layer` (and the "
          "snapshots) of a promotion: call it in each attention layer before it reads the KV.")
      .def_property_readonly("layers", [](PyCudaEngine& e) { return e.engine().layers(); })
      .def("inject_error_on_next_submit",
           [](PyCudaEngine& e) { e.engine().inject_error_on_next_submit(); })
      .def("stats", [](PyCudaEngine& e) {
        const cuda::CudaEngineStats s = e.engine().stats();
        py::dict d;
        d["batches"] = s.batches;
        d["slices"] = s.slices;
        d["pieces"] = s.pieces;
        d["kernel_launches"] = s.kernel_launches;
        d["auto_kernel_slices"] = s.auto_kernel_slices;
        d["auto_dma_slices"] = s.auto_dma_slices;
        d["layer_events"] = s.layer_events;
        d["urgent_feeds"] = s.urgent_feeds;
        d["refused_captures"] = s.refused_captures;
        d["refused_stream_waits"] = s.refused_stream_waits;
        d["d2d_launches"] = s.d2d_launches;
        d["d2d_dma_runs"] = s.d2d_dma_runs;
        d["after_waits"] = s.after_waits;
        d["layer_groups"] = s.layer_groups;
        d["dma_batch_fallback"] = s.dma_batch_fallback;
        d["kernel_fallback"] = s.kernel_fallback;
        d["fatal"] = s.fatal;
        d["bytes_d2h"] = s.bytes_d2h;
        d["bytes_h2d"] = s.bytes_h2d;
        d["bytes_d2d"] = s.bytes_d2d;
        d["failed"] = s.failed;
        d["last_error"] = s.last_error;
        return d;
      });
}

}  // namespace radixtier::python
