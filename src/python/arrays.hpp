// Ids and tokens across the boundary, without a Python object per element.
//
// In: a 1-D integer buffer (numpy array, array.array, memoryview; int32 tokens are used in
// place, contiguous int64 prompts too by admit(), which reads int64 natively, other integer
// types are converted in one C++ loop), a CPU torch tensor of int32 or
// int64 (read in place through data_ptr(), any stride), or, off the hot path, a sequence of
// Python ints. Out: numpy int64 arrays (torch.from_numpy() shares them).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "errors.hpp"
#include "radixtier/ids.hpp"

namespace radixtier::python {

namespace py = pybind11;

/// A read-only view of a 1-D integer array held by a Python object.
class IntArray {
 public:
  /// `what` names the argument in error messages ("tokens", "pages").
  IntArray(py::handle obj, const char* what);
  IntArray(const IntArray&) = delete;
  IntArray& operator=(const IntArray&) = delete;
  ~IntArray();

  std::size_t size() const { return size_; }
  /// Element i as int64 (the source may be any integer type and stride); -1 for a uint64
  /// above int64's range (text() names it exactly).
  std::int64_t at(std::size_t i) const;
  /// Element i in decimal, for error messages.
  std::string text(std::size_t i) const;
  /// Converts every element into out[0, size()) (one type dispatch, then one tight loop);
  /// returns the index of the first element outside [lo, hi] (nothing after it is written),
  /// or size() when all fit.
  std::size_t convert(std::int64_t lo, std::int64_t hi, std::int64_t* out) const;
  std::size_t convert(std::int64_t lo, std::int64_t hi, std::int32_t* out) const;
  std::size_t convert(std::int64_t lo, std::int64_t hi, std::uint32_t* out) const;
  /// The elements when the source is contiguous int32 (tokens used in place), else empty.
  std::span<const std::int32_t> int32_span() const;
  /// The elements when the source is contiguous int64, else empty.
  std::span<const std::int64_t> int64_span() const;

 private:
  enum class Kind : std::uint8_t { kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64 };
  template <class Out>
  std::size_t convert_any(std::int64_t lo, std::int64_t hi, Out* out) const;
  void from_buffer(py::handle obj, const char* what);
  void from_tensor(py::handle obj, const char* what);
  void from_sequence(py::handle obj, const char* what);

  Py_buffer view_{};
  bool has_view_ = false;
  py::object keep_;                  // the torch tensor read in place
  py::object keep_storage_;          // and its storage (another thread may set_ the tensor)
  std::vector<std::int64_t> owned_;  // a converted sequence
  const char* data_ = nullptr;
  std::size_t size_ = 0;
  std::ptrdiff_t stride_ = 0;  // bytes
  Kind kind_ = Kind::kI64;
};

/// Tokens (int32) from any integer array: in place when the source is contiguous int32,
/// else narrowed in one pass (range check included) into a buffer the thread keeps between
/// calls. A fresh buffer per call cost more than the narrowing: a 32k-token prompt's 128 KiB
/// is zero-filled by vector::resize, and glibc maps a block that large anew (page faults on
/// first touch) and unmaps it on free, every call.
class TokenArg {
 public:
  /// `wide_ok`: a contiguous int64 source is left as it is (wide(); span() is then empty),
  /// for a call that reads int64 tokens natively (PrefixCache::admit).
  TokenArg(py::handle obj, const char* what = "tokens", bool wide_ok = false);
  ~TokenArg();
  TokenArg(const TokenArg&) = delete;
  TokenArg& operator=(const TokenArg&) = delete;
  std::span<const Token> span() const { return span_; }
  std::span<const std::int64_t> wide() const { return wide_; }

  /// An uninitialized token buffer, reused (per thread, so the GIL-free calls of several
  /// threads never share one; nested TokenArgs each take their own).
  struct Scratch {
    std::unique_ptr<Token[]> data;
    std::size_t capacity = 0;
  };

 private:
  IntArray array_;
  Scratch scratch_;
  std::span<const Token> span_;
  std::span<const std::int64_t> wide_;
};

/// Strong ids of one space (u32 values, the invalid value excluded) from an integer array.
template <class Id>
std::vector<Id> ids_from(py::handle obj, const char* what) {
  IntArray a(obj, what);
  std::vector<std::uint32_t> values(a.size());
  const std::size_t bad = a.convert(0, std::int64_t{Id::kInvalid} - 1, values.data());
  if (bad < a.size()) {
    raise_invalid(std::string(what) + "[" + std::to_string(bad) + "] = " + a.text(bad) +
                  " is not a valid id");
  }
  std::vector<Id> out;
  out.reserve(values.size());
  for (std::uint32_t v : values) out.emplace_back(v);
  return out;
}

/// A stream handle from the `stream` argument of a call: an int (or an object whose
/// `cuda_stream` is one) in [0, 2^64). TypeError for another type, InvalidArgumentError for
/// an int out of range. None is the caller's to handle first.
std::uintptr_t stream_handle_from(py::handle stream);

/// One id from a Python int.
template <class Id>
Id id_from(std::int64_t v, const char* what) {
  if (v < 0 || v >= static_cast<std::int64_t>(Id::kInvalid))
    raise_invalid(std::string(what) + " = " + std::to_string(v) + " is not a valid id");
  return Id(static_cast<std::uint32_t>(v));
}

/// A numpy int64 array of the ids' values.
template <class Id>
py::array_t<std::int64_t> to_array(std::span<const Id> ids) {
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(ids.size()));
  std::int64_t* p = out.mutable_data();
  for (std::size_t i = 0; i < ids.size(); ++i) p[i] = ids[i].value();
  return out;
}

/// An unsigned count or size from a Python int, naming the field when it is out of range.
template <class T>
T count_from(std::int64_t v, const char* what) {
  if (v < 0 || static_cast<std::uint64_t>(v) > std::numeric_limits<T>::max()) {
    raise_invalid(std::string(what) + ": " + std::to_string(v) + " is not in [0, " +
                  std::to_string(std::numeric_limits<T>::max()) + "]");
  }
  return static_cast<T>(v);
}

}  // namespace radixtier::python
