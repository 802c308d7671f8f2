#include "arrays.hpp"

#include <pybind11/stl.h>

#include <cstring>
#include <type_traits>

#include "../cache/vector_clones.hpp"

namespace radixtier::python {

namespace {

bool is_torch_tensor(py::handle obj) {
  // torch.Tensor without importing torch: its C base class is torch._C._TensorBase
  // (torch._C.TensorBase from torch 2.1 on).
  for (PyTypeObject* t = Py_TYPE(obj.ptr()); t != nullptr; t = t->tp_base) {
    if (std::strcmp(t->tp_name, "torch._C._TensorBase") == 0 ||
        std::strcmp(t->tp_name, "torch._C.TensorBase") == 0)
      return true;
  }
  return false;
}

// int64 sources (torch's and numpy's default integer type) are the common case: these two
// narrowing passes get AVX2 / AVX-512 clones (vector_clones.hpp), so a 32k-token int64
// prompt converts in a few microseconds.

/// out[i] = src[i] as int32; nonzero when some value did not fit.
RADIXTIER_VECTOR_CLONES std::uint64_t narrow_to_i32(const std::int64_t* __restrict src,
                                                    std::int32_t* __restrict out, std::size_t n) {
  std::uint64_t lost = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto v = static_cast<std::int32_t>(src[i]);
    out[i] = v;
    lost |= static_cast<std::uint64_t>(static_cast<std::int64_t>(v) ^ src[i]);
  }
  return lost;
}

/// out[i] = src[i] as uint32; nonzero when some value did not fit.
RADIXTIER_VECTOR_CLONES std::uint64_t narrow_to_u32(const std::int64_t* __restrict src,
                                                    std::uint32_t* __restrict out, std::size_t n) {
  std::uint64_t lost = 0;
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = static_cast<std::uint32_t>(src[i]);
    lost |= static_cast<std::uint64_t>(src[i]) >> 32;
  }
  return lost;
}

template <class X>
constexpr bool negative(X x) {
  if constexpr (std::is_signed_v<X>) {
    return x < 0;
  } else {
    return false;
  }
}

/// torch.int32 and torch.int64, looked up once torch is loaded (dtype objects live as long
/// as torch, which is never unloaded).
struct TorchDtypes {
  PyObject* i32 = nullptr;
  PyObject* i64 = nullptr;
};
const TorchDtypes& torch_dtypes() {
  static const TorchDtypes d = [] {
    py::module_ torch = py::module_::import("torch");
    return TorchDtypes{py::object(torch.attr("int32")).release().ptr(),
                       py::object(torch.attr("int64")).release().ptr()};
  }();
  return d;
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
  // A few attribute reads through the C API with interned names (no numpy() round trip, no
  // temporary strings): this is the hot path of an engine that keeps token ids in tensors.
  struct Names {
    PyObject *device, *type, *dtype, *shape, *stride, *data_ptr, *storage;
  };
  static const Names n{
      PyUnicode_InternFromString("device"),         PyUnicode_InternFromString("type"),
      PyUnicode_InternFromString("dtype"),          PyUnicode_InternFromString("shape"),
      PyUnicode_InternFromString("stride"),         PyUnicode_InternFromString("data_ptr"),
      PyUnicode_InternFromString("untyped_storage")};
  auto steal = [](PyObject* r) {
    if (r == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(r);
  };
  PyObject* o = obj.ptr();
  // Only a CPU tensor's memory is the host's: a CUDA, meta (no memory at all) or other
  // device's pointer would be read as if it were.
  const py::object device_type =
      steal(PyObject_GetAttr(steal(PyObject_GetAttr(o, n.device)).ptr(), n.type));
  if (PyUnicode_Check(device_type.ptr()) == 0 ||
      PyUnicode_CompareWithASCIIString(device_type.ptr(), "cpu") != 0) {
    const std::string type = py::str(device_type);
    raise_invalid(std::string(what) + ": a " + (type == "cuda" ? "CUDA" : type) +
                  " tensor; ids and tokens are read on the host (pass a CPU tensor)");
  }
  // The storage first, then the address in it: the calls read it with the GIL released,
  // while another thread may point the tensor at other memory (set_) and drop the last
  // reference to this storage, which this one keeps alive. (Resizing the tensor meanwhile,
  // which reallocates inside the storage, is a race as it is for any torch op reading it.)
  // untyped_storage() from torch 2.0 on, storage() before it.
  static PyObject* const storage = [&] {
    if (PyObject_HasAttr(o, n.storage) != 0) return n.storage;
    return PyUnicode_InternFromString("storage");
  }();
  py::object kept_storage = steal(PyObject_CallMethodNoArgs(o, storage));
  const py::object dtype = steal(PyObject_GetAttr(o, n.dtype));
  const TorchDtypes& d = torch_dtypes();
  if (dtype.ptr() == d.i32) {
    kind_ = Kind::kI32;
  } else if (dtype.ptr() == d.i64) {
    kind_ = Kind::kI64;
  } else {
    raise_invalid(std::string(what) + ": expected a torch.int32 or torch.int64 tensor, got " +
                  std::string(py::str(dtype)));
  }
  const py::object shape = steal(PyObject_GetAttr(o, n.shape));
  if (!PyTuple_Check(shape.ptr()) || PyTuple_GET_SIZE(shape.ptr()) != 1) {
    raise_invalid(std::string(what) + ": expected a 1-D tensor, got shape " +
                  std::string(py::str(shape)));
  }
  const py::object stride = steal(PyObject_CallMethodNoArgs(o, n.stride));
  const py::object ptr = steal(PyObject_CallMethodNoArgs(o, n.data_ptr));
  const Py_ssize_t count = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape.ptr(), 0));
  const Py_ssize_t step = PyLong_AsSsize_t(PyTuple_GET_ITEM(stride.ptr(), 0));
  const unsigned long long address = PyLong_AsUnsignedLongLong(ptr.ptr());
  if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  keep_ = py::reinterpret_borrow<py::object>(obj);
  keep_storage_ = std::move(kept_storage);
  size_ = static_cast<std::size_t>(count);
  stride_ = static_cast<std::ptrdiff_t>(step) * (kind_ == Kind::kI32 ? 4 : 8);
  data_ = reinterpret_cast<const char*>(static_cast<std::uintptr_t>(address));
}

void IntArray::from_sequence(py::handle obj, const char* what) {
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) ||
      PyBytes_Check(obj.ptr()) != 0) {
    throw py::type_error(std::string(what) +
                         ": expected a 1-D integer array (numpy, torch) or a sequence of ints, "
                         "got " +
                         std::string(py::str(py::type::of(obj))));
  }
  // Element by element, so a bad one is named (a float, a str, an int beyond 64 bits) with
  // the InvalidArgumentError every other bad id gets.
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  const std::size_t n = seq.size();
  owned_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const py::object item = seq[i];
    // ints and numpy integers; not bools (refused in arrays too) nor floats
    PyObject* index = PyBool_Check(item.ptr()) != 0 ? nullptr : PyNumber_Index(item.ptr());
    if (index == nullptr) {
      // Only "not an integer" is the caller's input; anything else (an interrupt, no memory)
      // goes on as it is.
      if (PyErr_Occurred() != nullptr) {
        if (PyErr_ExceptionMatches(PyExc_TypeError) == 0) throw py::error_already_set();
        PyErr_Clear();
      }
      raise_invalid(std::string(what) + "[" + std::to_string(i) + "]: expected an int, got " +
                    std::string(py::str(py::type::of(item).attr("__name__"))));
    }
    int overflow = 0;
    owned_[i] = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow != 0) {
      raise_invalid(std::string(what) + "[" + std::to_string(i) +
                    "] = " + std::string(py::str(item)) + " does not fit 64 bits");
    }
  }
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

std::string IntArray::text(std::size_t i) const {
  if (kind_ == Kind::kU64) {
    std::uint64_t v;
    std::memcpy(&v, data_ + static_cast<std::ptrdiff_t>(i) * stride_, sizeof v);
    return std::to_string(v);
  }
  return std::to_string(at(i));
}

std::uintptr_t stream_handle_from(py::handle stream) {
  const py::object v = py::hasattr(stream, "cuda_stream")
                           ? py::object(stream.attr("cuda_stream"))
                           : py::reinterpret_borrow<py::object>(stream);
  PyObject* index = PyBool_Check(v.ptr()) != 0 ? nullptr : PyNumber_Index(v.ptr());
  if (index == nullptr) {
    if (PyErr_Occurred() != nullptr) {
      if (PyErr_ExceptionMatches(PyExc_TypeError) == 0) throw py::error_already_set();
      PyErr_Clear();
    }
    throw py::type_error(
        "stream must be an int, an object with cuda_stream (torch.cuda.Stream) or None, got " +
        std::string(py::str(py::type::of(stream))));
  }
  const unsigned long long h = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (PyErr_Occurred() != nullptr) {
    PyErr_Clear();
    raise_invalid("stream = " + std::string(py::repr(v)) + ": a handle is an int in [0, 2^64)");
  }
  static_assert(sizeof(unsigned long long) == sizeof(std::uintptr_t));
  return static_cast<std::uintptr_t>(h);
}

template <class Out>
std::size_t IntArray::convert_any(std::int64_t lo, std::int64_t hi, Out* out) const {
  auto run = [&]<class T>(T) -> std::size_t {
    auto fits = [&](T v) {
      if constexpr (std::is_same_v<T, std::uint64_t>) {
        if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
      }
      const auto w = static_cast<std::int64_t>(v);
      return w >= lo && w <= hi;
    };
    if (stride_ == static_cast<std::ptrdiff_t>(sizeof(T)) &&
        reinterpret_cast<std::uintptr_t>(data_) % alignof(T) == 0) {
      // Contiguous: one branch-free, vectorizable pass (narrow, then check that the value
      // survives the round trip), a second over the narrowed values only when [lo, hi] is
      // narrower than Out; the slow scan below only runs to name a bad element.
      const T* src = reinterpret_cast<const T*>(data_);
      std::make_unsigned_t<T> lost = 0;
      if constexpr (std::is_same_v<T, std::int64_t> && std::is_same_v<Out, std::int32_t>) {
        lost = narrow_to_i32(src, out, size_);
      } else if constexpr (std::is_same_v<T, std::int64_t> && std::is_same_v<Out, std::uint32_t>) {
        lost = narrow_to_u32(src, out, size_);
      } else {
        for (std::size_t i = 0; i < size_; ++i) {
          const Out o = static_cast<Out>(src[i]);
          out[i] = o;
          lost |= static_cast<std::make_unsigned_t<T>>(static_cast<T>(o) ^ src[i]);
          // A negative source that narrowed to an unsigned Out, or the reverse, flips sign.
          if constexpr (std::is_signed_v<T> != std::is_signed_v<Out>)
            lost |= negative(src[i]) != negative(o) ? 1u : 0u;
        }
      }
      bool ok = lost == 0;
      if (ok && (lo > static_cast<std::int64_t>(std::numeric_limits<Out>::min()) ||
                 hi < static_cast<std::int64_t>(std::numeric_limits<Out>::max()))) {
        bool outside = false;
        for (std::size_t i = 0; i < size_; ++i)
          outside |=
              static_cast<std::int64_t>(out[i]) < lo || static_cast<std::int64_t>(out[i]) > hi;
        ok = !outside;
      }
      if (ok) return size_;
    }
    for (std::size_t i = 0; i < size_; ++i) {
      T v;
      std::memcpy(&v, data_ + static_cast<std::ptrdiff_t>(i) * stride_, sizeof v);
      if (!fits(v)) return i;
      out[i] = static_cast<Out>(v);
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

namespace {
/// The source as a span of T when it is contiguous T, else empty.
template <class T>
std::span<const T> contiguous(const char* data, std::size_t size, std::ptrdiff_t stride,
                              bool right_kind) {
  if (!right_kind || (stride != sizeof(T) && size > 1) || size == 0 ||
      reinterpret_cast<std::uintptr_t>(data) % alignof(T) != 0)
    return {};
  return {reinterpret_cast<const T*>(data), size};
}
}  // namespace

std::span<const std::int32_t> IntArray::int32_span() const {
  return contiguous<std::int32_t>(data_, size_, stride_, kind_ == Kind::kI32);
}

std::span<const std::int64_t> IntArray::int64_span() const {
  return contiguous<std::int64_t>(data_, size_, stride_, kind_ == Kind::kI64);
}

namespace {
/// The thread's spare token buffers (one per TokenArg alive at once: usually one).
std::vector<TokenArg::Scratch>& spare_scratch() {
  thread_local std::vector<TokenArg::Scratch> spare;
  return spare;
}
}  // namespace

TokenArg::TokenArg(py::handle obj, const char* what, bool wide_ok) : array_(obj, what) {
  if (auto s = array_.int32_span(); !s.empty()) {
    span_ = s;
    return;
  }
  if (auto w = array_.int64_span(); wide_ok && !w.empty()) {
    wide_ = w;
    return;
  }
  const std::size_t n = array_.size();
  if (auto& spare = spare_scratch(); !spare.empty()) {
    scratch_ = std::move(spare.back());
    spare.pop_back();
  }
  if (scratch_.capacity < n) {
    scratch_.data.reset(new Token[n]);  // default-initialized: no zero-fill pass
    scratch_.capacity = n;
  }
  const std::size_t bad = array_.convert(std::numeric_limits<Token>::min(),
                                         std::numeric_limits<Token>::max(), scratch_.data.get());
  if (bad < n) {
    raise_invalid(std::string(what) + "[" + std::to_string(bad) + "] = " + array_.text(bad) +
                  " does not fit a 32-bit token id");
  }
  span_ = {scratch_.data.get(), n};
}

TokenArg::~TokenArg() {
  // Kept for the next call on this thread; a buffer grown past 16M tokens is let go.
  if (scratch_.data && scratch_.capacity <= (std::size_t{1} << 24))
    spare_scratch().push_back(std::move(scratch_));
}

}  // namespace radixtier::python
