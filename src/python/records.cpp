#include "records.hpp"

namespace radixtier::python {

std::string repr_field(const std::string& name, const py::handle& value) {
  // A pybind11 enum's type has __members__; its str() is "Residency.GPU".
  const bool is_enum = py::hasattr(py::type::of(value), "__members__");
  return name + "=" + std::string(is_enum ? py::str(value) : py::repr(value));
}

py::object dict_value(const py::handle& value) {
  if (py::hasattr(value, "to_dict")) return value.attr("to_dict")();
  return py::reinterpret_borrow<py::object>(value);
}

}  // namespace radixtier::python
