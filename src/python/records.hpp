// Plain result structs in Python (Admission, CacheStats, NodeInfo...): read-only attributes,
// a readable __repr__ ("Admission(lock=3, cached_tokens=64, ...)") and a dict view
// (to_dict(); a nested record becomes a nested dict), all from one list of fields.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

#include "radixtier/status.hpp"

namespace radixtier::python {

namespace py = pybind11;

/// "name=value" for a repr: enums by name (Residency.GPU), everything else by repr().
std::string repr_field(const std::string& name, const py::handle& value);
/// The value for to_dict(): a record's own to_dict(), else the value.
py::object dict_value(const py::handle& value);

template <class T>
class Record {
 public:
  template <class... Extra>
  Record(py::handle scope, const char* name, const Extra&... extra) : cls_(scope, name, extra...) {}

  template <class M, class... Extra>
  Record& field(const char* name, const M T::*member, const Extra&... extra) {
    cls_.def_readonly(name, member, extra...);
    fields_.emplace_back(name);
    return *this;
  }
  template <class Getter, class... Extra>
  Record& property(const char* name, Getter&& getter, const Extra&... extra) {
    cls_.def_property_readonly(name, std::forward<Getter>(getter), extra...);
    fields_.emplace_back(name);
    return *this;
  }

  /// Adds __repr__ and to_dict(). `counters`: the repr lists the nonzero fields only and
  /// says how many others are 0 (a struct of 40 counters stays one readable line).
  py::class_<T>& done(bool counters = false) {
    cls_.def(
        "to_dict",
        [fields = fields_](const py::object& self) {
          py::dict d;
          for (const std::string& f : fields) d[py::str(f)] = dict_value(self.attr(f.c_str()));
          return d;
        },
        "The fields as a dict (nested records as nested dicts).");
    cls_.def("__repr__", [fields = fields_, counters](const py::object& self) {
      std::string out = std::string(py::str(py::type::of(self).attr("__name__"))) + "(";
      std::size_t shown = 0, zeros = 0;
      for (const std::string& f : fields) {
        const py::object v = self.attr(f.c_str());
        if (counters && py::int_(v).cast<long long>() == 0) {
          ++zeros;
          continue;
        }
        out += (shown++ > 0 ? ", " : "") + repr_field(f, v);
      }
      if (zeros > 0)
        out += (shown > 0 ? "; " : "") + std::string(shown > 0 ? "the other " : "all ") +
               std::to_string(zeros) + " are 0";
      return out + ")";
    });
    return cls_;
  }

 private:
  py::class_<T> cls_;
  std::vector<std::string> fields_;
};

/// An engine's health() in Python: ok, or the error that stopped it (the CUDA engine:
/// DEVICE_LOST with the CUDA error). True when ok.
struct EngineHealth {
  bool ok = true;
  ErrorCode code = ErrorCode::kOk;
  std::string message;
};

inline EngineHealth health_of(const Status& s) {
  return EngineHealth{s.is_ok(), s.code(), s.is_ok() ? std::string() : s.message()};
}

}  // namespace radixtier::python
