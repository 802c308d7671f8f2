#include "errors.hpp"

#include <array>
#include <string>

namespace radixtier::python {

namespace {

constexpr std::size_t kCodes = 8;  // ErrorCode::kOk .. kDeviceLost
/// The exception class of each code (index 0, kOk, is the base class). Owned by the module
/// for the life of the process, as every CPython extension keeps its exception types.
std::array<PyObject*, kCodes> g_types{};

PyObject* make_type(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("radixtier.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

}  // namespace

void register_errors(py::module_& m) {
  PyObject* base = make_type(m, "Error", PyExc_RuntimeError,
                             "An error reported by radixtier; .code is the ErrorCode and the "
                             "message is the library's Status message.");
  g_types[0] = base;
  struct Sub {
    ErrorCode code;
    const char* name;
    PyObject* extra_base;
    const char* doc;
  };
  const Sub subs[] = {
      {ErrorCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
       "Bad input; the cache's state is unchanged."},
      {ErrorCode::kNotFound, "NotFoundError", PyExc_LookupError, "Unknown handle or id."},
      {ErrorCode::kOutOfMemory, "OutOfMemoryError", nullptr,
       "A tier is full and nothing can be evicted."},
      {ErrorCode::kTransferFailed, "TransferFailedError", nullptr,
       "The engine refused a copy (its message says why): release and admit again."},
      {ErrorCode::kPending, "PendingError", nullptr, "An async operation has not finished."},
      {ErrorCode::kFailedPrecondition, "FailedPreconditionError", nullptr,
       "The call is valid but not in this state."},
      {ErrorCode::kDeviceLost, "DeviceLostError", nullptr,
       "The GPU context is lost (a sticky CUDA error): restart the process."},
  };
  py::object code_enum = m.attr("ErrorCode");
  py::setattr(py::handle(base), "code", code_enum.attr("OK"));
  for (const Sub& s : subs) {
    py::tuple bases = s.extra_base != nullptr
                          ? py::make_tuple(py::handle(base), py::handle(s.extra_base))
                          : py::make_tuple(py::handle(base));
    PyObject* type = make_type(m, s.name, bases.ptr(), s.doc);
    py::setattr(py::handle(type), "code", py::cast(s.code));
    g_types[static_cast<std::size_t>(s.code)] = type;
  }
}

void raise(const Status& status) {
  const auto index = static_cast<std::size_t>(status.code());
  PyObject* type = index < kCodes && g_types[index] != nullptr ? g_types[index] : g_types[0];
  PyErr_SetString(type, status.message().c_str());
  throw py::error_already_set();
}

void raise_invalid(const std::string& message) {
  raise(invalid_argument(message));
}

}  // namespace radixtier::python
