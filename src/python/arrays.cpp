#include "arrays.hpp"

#include <pybind11/stl.h>

#include <cstring>
#include <type_traits>

namespace radixtier::python {

namespace {

bool is_torch_tensor(py::handle obj) {
  // torch.Tensor without importing torch: its type lives in module "torch" and has data_ptr.
  PyTypeObject* t = Py_TYPE(obj.ptr());
  for (; t != nullptr; t = t->tp_base) {
    if (std::strcmp(t->tp_name, "torch._C._TensorBase") == 0 ||
        std::strcmp(t->tp_name, "torch._C.TensorBase") == 0 ||
        std::strcmp(t->tp_name, "Tensor") == 0)
      return py::hasattr(obj, "data_ptr") && py::hasattr(obj, "is_cuda");
  }
  return false;
}

}  // namespace

IntArray::IntArray(py::handle obj, const char* what) {
  if (PyObject_CheckBuffer(obj.ptr()) != 0 && !PyBytes_Check(obj.ptr())) {
    from_buffer(obj, what);
  } else if (is_torch_tensor(obj)) {
    from_tensor(obj, what);
  } else {
    from_sequence(obj, what);
  }
}

IntArray::~IntArray() {
  if (has_view_) PyBuffer_Release(&view_);
}

void IntArray::from_buffer(py::handle obj, const char* what) {
  if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
  has_view_ = true;
  if (view_.ndim != 1) {
    raise_invalid(std::string(what) + ": expected a 1-D array, got " + std::to_string(view_.ndim) +
                  " dimensions");
  }
  const std::string fmt = view_.format != nullptr ? view_.format : "B";
  // Native-order integer formats only ('=' / '@' prefixes allowed).
  std::string f = fmt;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  const auto size = view_.itemsize;
  const bool is_signed = f == "b" || f == "h" || f == "i" || f == "l" || f == "q" || f == "n";
  const bool is_unsigned = f == "B" || f == "H" || f == "I" || f == "L" || f == "Q" || f == "N";
  if (f.size() != 1 || (!is_signed && !is_unsigned)) {
    raise_invalid(std::string(what) + ": expected an integer array, got format '" + fmt + "'");
  }
  switch (size) {
    case 1:
      kind_ = is_signed ? Kind::kI8 : Kind::kU8;
      break;
    case 2:
      kind_ = is_signed ? Kind::kI16 : Kind::kU16;
      break;
    case 4:
      kind_ = is_signed ? Kind::kI32 : Kind::kU32;
      break;
    case 8:
      kind_ = is_signed ? Kind::kI64 : Kind::kU64;
      break;
    default:
      raise_invalid(std::string(what) + ": unsupported integer size " + std::to_string(size));
  }
  data_ = static_cast<const char*>(view_.buf);
  size_ = static_cast<std::size_t>(view_.shape[0]);
  stride_ = view_.strides != nullptr ? view_.strides[0] : size;
}

void IntArray::from_tensor(py::handle obj, const char* what) {
  if (obj.attr("is_cuda").cast<bool>()) {
    raise_invalid(std::string(what) +
                  ": a CUDA tensor; ids and tokens are read on the host (pass a CPU tensor)");
  }
  const auto dim = obj.attr("dim")().cast<std::int64_t>();
  if (dim != 1) {
    raise_invalid(std::string(what) + ": expected a 1-D tensor, got " + std::to_string(dim) +
                  " dimensions");
  }
  const std::string dtype = py::str(obj.attr("dtype"));
  if (dtype == "torch.int32") {
    kind_ = Kind::kI32;
  } else if (dtype == "torch.int64") {
    kind_ = Kind::kI64;
  } else {
    raise_invalid(std::string(what) + ": expected a torch.int32 or torch.int64 tensor, got " +
                  dtype);
  }
  keep_ = py::reinterpret_borrow<py::object>(obj);
  size_ = obj.attr("numel")().cast<std::size_t>();
  const auto elem = obj.attr("element_size")().cast<std::ptrdiff_t>();
  stride_ = size_ == 0 ? elem : obj.attr("stride")(0).cast<std::ptrdiff_t>() * elem;
  data_ = reinterpret_cast<const char*>(obj.attr("data_ptr")().cast<std::uintptr_t>());
}

void IntArray::from_sequence(py::handle obj, const char* what) {
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj)) {
    throw py::type_error(std::string(what) +
                         ": expected a 1-D integer array (numpy, torch) or a sequence of ints, "
                         "got " +
                         std::string(py::str(py::type::of(obj))));
  }
  owned_ = py::cast<std::vector<std::int64_t>>(obj);
  kind_ = Kind::kI64;
  data_ = reinterpret_cast<const char*>(owned_.data());
  size_ = owned_.size();
  stride_ = sizeof(std::int64_t);
}

std::int64_t IntArray::at(std::size_t i) const {
  const char* p = data_ + static_cast<std::ptrdiff_t>(i) * stride_;
  auto load = [p]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (kind_) {
    case Kind::kI8:
      return load(std::int8_t{});
    case Kind::kU8:
      return load(std::uint8_t{});
    case Kind::kI16:
      return load(std::int16_t{});
    case Kind::kU16:
      return load(std::uint16_t{});
    case Kind::kI32:
      return load(std::int32_t{});
    case Kind::kU32:
      return load(std::uint32_t{});
    case Kind::kI64:
      return load(std::int64_t{});
    case Kind::kU64: {
      const std::uint64_t v = load(std::uint64_t{});
      return v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
                 ? -1
                 : static_cast<std::int64_t>(v);
    }
  }
  return -1;
}

template <class Out>
std::size_t IntArray::convert_any(std::int64_t lo, std::int64_t hi, Out* out) const {
  auto run = [&]<class T>(T) -> std::size_t {
    for (std::size_t i = 0; i < size_; ++i) {
      T v;
      std::memcpy(&v, data_ + static_cast<std::ptrdiff_t>(i) * stride_, sizeof v);
      // Compare in the wider of the two types; unsigned 64-bit values above int64 max fail.
      if constexpr (std::is_same_v<T, std::uint64_t>) {
        if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return i;
      }
      const auto w = static_cast<std::int64_t>(v);
      if (w < lo || w > hi) return i;
      out[i] = static_cast<Out>(w);
    }
    return size_;
  };
  switch (kind_) {
    case Kind::kI8:
      return run(std::int8_t{});
    case Kind::kU8:
      return run(std::uint8_t{});
    case Kind::kI16:
      return run(std::int16_t{});
    case Kind::kU16:
      return run(std::uint16_t{});
    case Kind::kI32:
      return run(std::int32_t{});
    case Kind::kU32:
      return run(std::uint32_t{});
    case Kind::kI64:
      return run(std::int64_t{});
    case Kind::kU64:
      return run(std::uint64_t{});
  }
  return 0;
}

std::size_t IntArray::convert(std::int64_t lo, std::int64_t hi, std::int64_t* out) const {
  return convert_any(lo, hi, out);
}
std::size_t IntArray::convert(std::int64_t lo, std::int64_t hi, std::int32_t* out) const {
  return convert_any(lo, hi, out);
}
std::size_t IntArray::convert(std::int64_t lo, std::int64_t hi, std::uint32_t* out) const {
  return convert_any(lo, hi, out);
}

std::span<const std::int32_t> IntArray::int32_span() const {
  if (kind_ != Kind::kI32 || (stride_ != sizeof(std::int32_t) && size_ > 1) || size_ == 0 ||
      reinterpret_cast<std::uintptr_t>(data_) % alignof(std::int32_t) != 0)
    return {};
  return {reinterpret_cast<const std::int32_t*>(data_), size_};
}

TokenArg::TokenArg(py::handle obj, const char* what) : array_(obj, what) {
  if (auto s = array_.int32_span(); !s.empty()) {
    span_ = s;
    return;
  }
  owned_.resize(array_.size());
  const std::size_t bad = array_.convert(std::numeric_limits<Token>::min(),
                                         std::numeric_limits<Token>::max(), owned_.data());
  if (bad < owned_.size()) {
    raise_invalid(std::string(what) + "[" + std::to_string(bad) +
                  "] = " + std::to_string(array_.at(bad)) + " does not fit a 32-bit token id");
  }
  span_ = owned_;
}

}  // namespace radixtier::python
