// The snapshot placement policies of radixtier::scheduler, for engines with their own
// scheduler: which page boundaries of a prefill keep a snapshot (docs/snapshot-policies.md).
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#include "errors.hpp"
#include "radixtier/scheduler/snapshot_policy.hpp"

namespace radixtier::python {

void bind_policy(py::module_& m) {
  using sched::SnapshotPolicy;
  using sched::SnapshotQuery;

  py::class_<SnapshotQuery>(m, "SnapshotQuery",
                            "What a scheduler knows when it asks whether to keep a snapshot.")
      .def(
          py::init([](std::int64_t boundary, std::int64_t prompt_tokens, std::int64_t cached_tokens,
                      std::int64_t branch_tokens, bool last_prompt_chunk, bool at_finish,
                      std::int64_t snapshot_bytes, std::int64_t kv_bytes_per_token,
                      std::int64_t page_size, std::int64_t chunk_tokens) {
            SnapshotQuery q;
            q.boundary = count_from<std::size_t>(boundary, "boundary");
            q.prompt_tokens = count_from<std::size_t>(prompt_tokens, "prompt_tokens");
            q.cached_tokens = count_from<std::size_t>(cached_tokens, "cached_tokens");
            q.branch_tokens = count_from<std::size_t>(branch_tokens, "branch_tokens");
            q.last_prompt_chunk = last_prompt_chunk;
            q.at_finish = at_finish;
            q.snapshot_bytes = count_from<std::size_t>(snapshot_bytes, "snapshot_bytes");
            q.kv_bytes_per_token =
                count_from<std::size_t>(kv_bytes_per_token, "kv_bytes_per_token");
            q.page_size = count_from<std::uint32_t>(page_size, "page_size");
            q.chunk_tokens = count_from<std::size_t>(chunk_tokens, "chunk_tokens");
            return q;
          }),
          py::kw_only(), py::arg("boundary") = 0, py::arg("prompt_tokens") = 0,
          py::arg("cached_tokens") = 0, py::arg("branch_tokens") = 0,
          py::arg("last_prompt_chunk") = false, py::arg("at_finish") = false,
          py::arg("snapshot_bytes") = 0, py::arg("kv_bytes_per_token") = 0,
          py::arg("page_size") = 0, py::arg("chunk_tokens") = 0)
      .def_readwrite("boundary", &SnapshotQuery::boundary)
      .def_readwrite("prompt_tokens", &SnapshotQuery::prompt_tokens)
      .def_readwrite("cached_tokens", &SnapshotQuery::cached_tokens)
      .def_readwrite("branch_tokens", &SnapshotQuery::branch_tokens)
      .def_readwrite("last_prompt_chunk", &SnapshotQuery::last_prompt_chunk)
      .def_readwrite("at_finish", &SnapshotQuery::at_finish)
      .def_readwrite("snapshot_bytes", &SnapshotQuery::snapshot_bytes)
      .def_readwrite("kv_bytes_per_token", &SnapshotQuery::kv_bytes_per_token)
      .def_readwrite("page_size", &SnapshotQuery::page_size)
      .def_readwrite("chunk_tokens", &SnapshotQuery::chunk_tokens)
      .def_readwrite("alignment", &SnapshotQuery::alignment)
      .def_readwrite("keep_finish", &SnapshotQuery::keep_finish)
      .def_readwrite("host_free_bytes", &SnapshotQuery::host_free_bytes);

  py::class_<SnapshotPolicy>(m, "SnapshotPolicy",
                             "Snapshot placement: end-only | every-chunk | interval:N | "
                             "budgeted[:BYTES], each optionally +tail and/or +branch.")
      .def(py::init([](const std::string& text) { return unwrap(SnapshotPolicy::parse(text)); }),
           py::arg("text"))
      .def_static("parse",
                  [](const std::string& text) { return unwrap(SnapshotPolicy::parse(text)); })
      .def_property_readonly("name", &SnapshotPolicy::name)
      .def_property_readonly("tail", &SnapshotPolicy::tail)
      .def_property_readonly("branch", &SnapshotPolicy::branch)
      .def(
          "validate",
          [](const SnapshotPolicy& p, std::int64_t page_size) {
            check(p.validate(count_from<std::uint32_t>(page_size, "page_size")));
          },
          py::arg("page_size"))
      .def("keep", &SnapshotPolicy::keep, py::arg("query"))
      .def(
          "next_cut",
          [](const SnapshotPolicy& p, std::int64_t done, std::optional<SnapshotQuery> query) {
            return p.next_cut(query.value_or(SnapshotQuery{}),
                              count_from<std::size_t>(done, "done"));
          },
          py::arg("done"), py::arg("query") = py::none(),
          "The next boundary > done where a chunk must end for the query's prompt (None: chunk "
          "ends).")
      .def("plan", &SnapshotPolicy::plan, py::arg("query"))
      .def_static("tail_boundary", &SnapshotPolicy::tail_boundary, py::arg("query"))
      .def_static("branch_boundary", &SnapshotPolicy::branch_boundary, py::arg("query"))
      .def(
          "__eq__", [](const SnapshotPolicy& a, const SnapshotPolicy& b) { return a == b; },
          py::is_operator())
      .def("__repr__",
           [](const SnapshotPolicy& p) { return "SnapshotPolicy('" + p.name() + "')"; });
}

}  // namespace radixtier::python
