// HostArenas (the four byte arenas, zero-copy views), HostTransferEngine, Ticket.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arena_view.hpp"
#include "arrays.hpp"
#include "bindings.hpp"
#include "errors.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"
#include "records.hpp"

namespace radixtier::python {

namespace {

ArenaView view_of(py::object owner, std::span<std::byte> first_item, std::size_t items,
                  std::size_t item_bytes, const char* name) {
  return ArenaView{first_item.data(), items, item_bytes, name, std::move(owner)};
}

template <class Id>
ArenaView arena(py::object self, std::uint32_t items, std::size_t item_bytes,
                std::span<std::byte> (HostArenas::*item)(Id), const char* name) {
  HostArenas& a = self.cast<HostArenas&>();
  std::span<std::byte> first = items > 0 ? (a.*item)(Id(0)) : std::span<std::byte>();
  return view_of(std::move(self), first, items, item_bytes, name);
}

/// Drops a Ticket with the GIL released: a pending one waits for its copy, and the thread
/// that finishes the copy (a delayed ticket resumed, an engine callback) may be Python's.
struct GilFreeTicketDelete {
  void operator()(Ticket* t) const {
    if (t == nullptr) return;
    if (PyGILState_Check() != 0 && t->valid()) {
      py::gil_scoped_release nogil;
      delete t;
    } else {
      delete t;
    }
  }
};
using TicketHolder = std::unique_ptr<Ticket, GilFreeTicketDelete>;

/// An int64 array of shape [n, width] (None: no rows), row-major.
py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> rows_of(const py::object& obj,
                                                                             py::ssize_t width,
                                                                             const char* what,
                                                                             const char* shape) {
  // Integers that fit int64 only: a cast would truncate floats, parse strings into ids and
  // wrap a uint64 above 2^63 to a negative id.
  const py::array raw = py::array::ensure(obj);
  const char kind = raw ? raw.dtype().kind() : '?';
  bool fits = raw && (raw.size() == 0 || kind == 'i' || kind == 'u');
  if (fits && kind == 'u' && raw.itemsize() == 8 && raw.size() > 0) {
    const auto wide =
        py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>::ensure(raw);
    fits = wide && *std::max_element(wide.data(), wide.data() + wide.size()) <=
                       static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  }
  if (!fits) {
    raise_invalid(std::string(what) + ": expected an array of shape " + shape +
                  " of integers that fit int64, got " +
                  (raw ? "dtype " + std::string(py::str(raw.dtype())) : std::string("no array")));
  }
  auto arr = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(raw);
  if (!arr || arr.ndim() != 2 || arr.shape(1) != width) {
    raise_invalid(std::string(what) + ": expected an integer array of shape " + shape);
  }
  return arr;
}

/// A batch from int64 arrays: pages [n, 2] (gpu, host) pairs, snapshots likewise; slot_pieces
/// [n, 4] (slot, offset, page, to_slot) rows of a device-to-device batch.
TransferBatch batch_from(Direction dir, const py::object& pages, const py::object& snapshots,
                         const py::object& slot_pieces) {
  TransferBatch b;
  b.direction = dir;
  auto pairs = [](const py::object& obj, const char* what) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> out;
    if (obj.is_none()) return out;
    auto arr = rows_of(obj, 2, what, "[n, 2]");
    const std::int64_t* p = arr.data();
    for (py::ssize_t i = 0; i < arr.shape(0); ++i) {
      out.emplace_back(count_from<std::uint32_t>(p[2 * i], what),
                       count_from<std::uint32_t>(p[2 * i + 1], what));
    }
    return out;
  };
  for (auto [g, h] : pairs(pages, "pages")) b.pages.push_back({GpuPageId(g), HostPageId(h)});
  for (auto [g, h] : pairs(snapshots, "snapshots"))
    b.snapshots.push_back({GpuSlotId(g), HostSlotId(h)});
  if (!slot_pieces.is_none()) {
    auto arr = rows_of(slot_pieces, 4, "slot_pieces", "[n, 4] (slot, offset, page, to_slot)");
    const std::int64_t* p = arr.data();
    for (py::ssize_t i = 0; i < arr.shape(0); ++i) {
      const std::int64_t* row = p + 4 * i;
      if (row[3] != 0 && row[3] != 1) raise_invalid("slot_pieces: to_slot must be 0 or 1");
      b.slot_pieces.push_back({GpuSlotId(count_from<std::uint32_t>(row[0], "slot_pieces")),
                               count_from<std::size_t>(row[1], "slot_pieces"),
                               GpuPageId(count_from<std::uint32_t>(row[2], "slot_pieces")),
                               row[3] == 1});
    }
  }
  return b;
}

}  // namespace

void bind_arena_view(py::module_& m) {
  py::class_<ArenaView>(m, "ArenaView", py::buffer_protocol(),
                        "A pool of items (pages or snapshot slots) as a writable uint8 buffer "
                        "[items, item_bytes]: np.asarray(view), torch.frombuffer(view, ...) or "
                        "radixtier.as_tensor(view, dtype, shape) share the cache's bytes.")
      .def_buffer([](ArenaView& v) {
        return py::buffer_info(
            v.data, 1, py::format_descriptor<std::uint8_t>::format(), 2,
            {static_cast<py::ssize_t>(v.items), static_cast<py::ssize_t>(v.item_bytes)},
            {static_cast<py::ssize_t>(v.item_bytes), py::ssize_t{1}},
            /*readonly=*/false);
      })
      .def_readonly("items", &ArenaView::items)
      .def_readonly("item_bytes", &ArenaView::item_bytes)
      .def_property_readonly("nbytes", [](const ArenaView& v) { return v.items * v.item_bytes; })
      .def_property_readonly("name", [](const ArenaView& v) { return std::string(v.name); })
      .def_property_readonly(
          "address", [](const ArenaView& v) { return reinterpret_cast<std::uintptr_t>(v.data); },
          "address of item 0 (for engines that take raw pointers)")
      .def_readonly("owner", &ArenaView::owner)
      .def("__len__", [](const ArenaView& v) { return v.items; })
      .def("__repr__", [](const ArenaView& v) {
        return "<ArenaView " + std::string(v.name) + ": " + std::to_string(v.items) + " x " +
               std::to_string(v.item_bytes) + " bytes>";
      });
}

StreamHandle stream_for(py::handle engine, const py::object& stream) {
#ifdef RADIXTIER_PYTHON_CUDA
  if (cuda_engine_of(engine) != nullptr) return cuda_call_stream(engine, stream);
#endif
  (void)engine;
  if (stream.is_none()) return nullptr;
  // An engine without streams ignores the stream, but not a malformed argument.
  return reinterpret_cast<StreamHandle>(stream_handle_from(stream));
}

TransferEngine* host_engine_of(py::handle obj) {
  if (!py::isinstance<HostTransferEngine>(obj)) return nullptr;
  return &obj.cast<HostTransferEngine&>();
}

void bind_host(py::module_& m) {
  bind_arena_view(m);

  py::class_<HostArenas>(m, "HostArenas",
                         "The four byte arenas of the host engine, sized by a CacheConfig: the "
                         "\"GPU\" KV pool and snapshot slots a CPU model computes in, and the "
                         "host tier the cache demotes to. Each is an ArenaView (zero-copy).")
      .def(py::init([](const CacheConfig& c) {
             check(c.validate());
             return std::make_unique<HostArenas>(c);
           }),
           py::arg("config"))
      .def_property_readonly(
          "gpu_kv",
          [](py::object self) {
            auto& a = self.cast<HostArenas&>();
            return arena<GpuPageId>(self, a.gpu_pages(), a.page_bytes(), &HostArenas::gpu_page,
                                    "gpu_kv");
          },
          "GPU KV pages: [gpu_pages, page_bytes]")
      .def_property_readonly(
          "host_kv",
          [](py::object self) {
            auto& a = self.cast<HostArenas&>();
            return arena<HostPageId>(self, a.host_pages(), a.page_bytes(), &HostArenas::host_page,
                                     "host_kv");
          },
          "host KV pages: [host_pages, page_bytes]")
      .def_property_readonly(
          "gpu_snapshots",
          [](py::object self) {
            auto& a = self.cast<HostArenas&>();
            return arena<GpuSlotId>(self, a.gpu_slots(), a.snapshot_bytes(),
                                    &HostArenas::gpu_snapshot, "gpu_snapshots");
          },
          "GPU snapshot slots: [gpu_snapshot_slots, snapshot_bytes]")
      .def_property_readonly(
          "host_snapshots",
          [](py::object self) {
            auto& a = self.cast<HostArenas&>();
            return arena<HostSlotId>(self, a.host_slots(), a.snapshot_bytes(),
                                     &HostArenas::host_snapshot, "host_snapshots");
          },
          "host snapshot slots: [host_snapshot_slots, snapshot_bytes]")
      .def_property_readonly("page_bytes", &HostArenas::page_bytes)
      .def_property_readonly("snapshot_bytes", &HostArenas::snapshot_bytes)
      .def_property_readonly("gpu_pages", &HostArenas::gpu_pages)
      .def_property_readonly("host_pages", &HostArenas::host_pages)
      .def_property_readonly("gpu_snapshot_slots", &HostArenas::gpu_slots)
      .def_property_readonly("host_snapshot_slots", &HostArenas::host_slots);

  Record<HostEngineStats>(m, "HostEngineStats", "The host engine's counters.")
      .field("batches", &HostEngineStats::batches)
      .field("slices", &HostEngineStats::slices)
      .field("bytes_d2h", &HostEngineStats::bytes_d2h)
      .field("bytes_h2d", &HostEngineStats::bytes_h2d)
      .field("bytes_d2d", &HostEngineStats::bytes_d2d)
      .field("failed", &HostEngineStats::failed)
      .field("staging_bytes", &HostEngineStats::staging_bytes)
      .done(/*counters=*/true);

  Record<EngineHealth>(m, "EngineHealth",
                       "An engine's health(): ok, or the error that stopped it for good (the "
                       "CUDA engine: DEVICE_LOST with the CUDA error; restart the process). "
                       "True when ok.")
      .field("ok", &EngineHealth::ok)
      .field("code", &EngineHealth::code, "ErrorCode.OK, or DEVICE_LOST")
      .field("message", &EngineHealth::message, "the error, \"\" when ok")
      .done()
      .def("__bool__", [](const EngineHealth& h) { return h.ok; });

  py::class_<Ticket, TicketHolder>(
      m, "Ticket", "Handle of one submitted batch. Dropping a pending ticket waits for it.")
      .def_property_readonly("id", [](const Ticket& t) { return t.id().value(); })
      .def_property_readonly("valid", &Ticket::valid)
      .def("poll", &Ticket::poll)
      .def("wait", &Ticket::wait, py::call_guard<py::gil_scoped_release>())
      .def("reset", &Ticket::reset, py::call_guard<py::gil_scoped_release>());

  py::class_<TransferEngine>(m, "TransferEngine", "The async copy interface of the engines.")
      .def_property_readonly("slice_pages", &TransferEngine::slice_pages)
      .def(
          "submit",
          [](py::object self, Direction dir, const py::object& pages, const py::object& snapshots,
             const py::object& slot_pieces, const py::object& stream, const py::object& after) {
            TransferEngine& e = self.cast<TransferEngine&>();
            TransferBatch b = batch_from(dir, pages, snapshots, slot_pieces);
            b.stream = stream_for(self, stream);
            if (!after.is_none()) {
              for (TicketId t : ids_from<TicketId>(after, "after")) b.after.push_back(t);
            }
            Result<Ticket> t = [&] {
              py::gil_scoped_release nogil;
              return e.submit(std::move(b));
            }();
            return TicketHolder(new Ticket(unwrap(std::move(t))));
          },
          py::arg("direction"), py::arg("pages") = py::none(), py::arg("snapshots") = py::none(),
          py::arg("slot_pieces") = py::none(), py::kw_only(), py::arg("stream") = py::none(),
          py::arg("after") = py::none(), py::keep_alive<0, 1>(),
          "Copies (gpu, host) page pairs and snapshot-slot pairs in one direction, sliced; "
          "or, DEVICE_TO_DEVICE, slot_pieces rows (slot, offset, page, to_slot): bytes [offset, "
          "offset + n) of a GPU snapshot slot to GPU page `page` (to_slot 0) or back (1), n = "
          "min(page_bytes, snapshot_bytes - offset). stream: the caller's stream the copy is "
          "ordered after (the CUDA engine; None: torch.cuda.current_stream(); an engine "
          "without streams ignores it); after: ticket ids whose copies land first. Returns a "
          "Ticket. Not for ids a PrefixCache manages (it submits its own).")
      .def(
          "stream_wait",
          [](py::object self, std::int64_t ticket, const py::object& stream,
             std::optional<std::int64_t> layer) {
            TransferEngine& e = self.cast<TransferEngine&>();
            const TicketId id = id_from<TicketId>(ticket, "ticket");
            const StreamHandle s = stream_for(self, stream);
            std::optional<std::uint32_t> l;
            if (layer) l = count_from<std::uint32_t>(*layer, "layer");
            // The error is raised with the GIL back (raising without it crashes).
            const Status st = [&] {
              py::gil_scoped_release nogil;
              return e.stream_wait(id, s, l);
            }();
            check(st);
          },
          py::arg("ticket"), py::arg("stream") = py::none(), py::arg("layer") = py::none(),
          "Makes `stream` wait for a ticket's copies (with `layer`: the KV of the layers up to "
          "it). An engine with streams waits on the device; the host engine waits on the host "
          "(it has no streams). TransferFailedError when the copy failed.")
      .def_property_readonly("waits_on_device", &TransferEngine::waits_on_device,
                             "True when stream_wait orders on the device (no host wait)")
      .def(
          "poll",
          [](TransferEngine& e, std::int64_t id) {
            return e.poll(id_from<TicketId>(id, "ticket"));
          },
          py::arg("ticket"))
      .def(
          "wait",
          [](TransferEngine& e, std::int64_t id) {
            const TicketId t = id_from<TicketId>(id, "ticket");
            py::gil_scoped_release nogil;
            return e.wait(t);
          },
          py::arg("ticket"));

  py::class_<HostTransferEngine, TransferEngine> engine(
      m, "HostTransferEngine",
      "Byte-exact copies between the HostArenas' tiers, sliced, on a worker thread (THREADED) "
      "or when the caller says (MANUAL); with fault injection.");
  py::enum_<HostTransferEngine::Mode>(engine, "Mode")
      .value("THREADED", HostTransferEngine::Mode::kThreaded)
      .value("MANUAL", HostTransferEngine::Mode::kManual);
  engine
      .def(py::init([](HostArenas& a, std::int64_t slice_pages, HostTransferEngine::Mode mode) {
             return std::make_unique<HostTransferEngine>(
                 a, count_from<std::uint32_t>(slice_pages, "slice_pages"), mode);
           }),
           py::arg("arenas"), py::arg("slice_pages") = 128,
           py::arg("mode") = HostTransferEngine::Mode::kThreaded, py::keep_alive<1, 2>())
      .def_property_readonly(
          "arenas", [](HostTransferEngine& e) -> HostArenas& { return e.memory(); },
          py::return_value_policy::reference_internal)
      .def(
          "fail_ticket",
          [](HostTransferEngine& e, std::int64_t id) {
            e.fail_ticket(id_from<TicketId>(id, "ticket"));
          },
          py::arg("ticket"))
      .def(
          "fail_nth_submission",
          [](HostTransferEngine& e, std::int64_t n) {
            e.fail_nth_submission(count_from<std::uint64_t>(n, "n"));
          },
          py::arg("n"), "The n-th submit() from now (0 = the next) fails when it runs.")
      .def(
          "delay_ticket",
          [](HostTransferEngine& e, std::int64_t id) {
            e.delay_ticket(id_from<TicketId>(id, "ticket"));
          },
          py::arg("ticket"))
      .def(
          "resume",
          [](HostTransferEngine& e, std::int64_t id) { e.resume(id_from<TicketId>(id, "ticket")); },
          py::arg("ticket"))
      .def("pending",
           [](const HostTransferEngine& e) {
             std::vector<std::uint32_t> ids;
             for (TicketId t : e.pending()) ids.push_back(t.value());
             return ids;
           })
      .def(
          "complete",
          [](HostTransferEngine& e, std::int64_t id) {
            const TicketId t = id_from<TicketId>(id, "ticket");
            py::gil_scoped_release nogil;
            return e.complete(t);
          },
          py::arg("ticket"), "MANUAL mode: runs a pending ticket now.")
      .def(
          "health", [](const HostTransferEngine&) { return EngineHealth{}; },
          "Always ok: host memory has no device to lose (the CUDA engine's health() can "
          "report DEVICE_LOST).")
      .def("stats", &HostTransferEngine::stats);
}

}  // namespace radixtier::python
