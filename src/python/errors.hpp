// Status -> Python exceptions. Every error the library reports as a Status becomes an
// exception carrying the Status message, of a class chosen by its code:
//
//   radixtier.Error (RuntimeError)                     base of all; .code is the ErrorCode
//     InvalidArgumentError (also ValueError)           bad input, the cache is unchanged
//     NotFoundError (also LookupError)                 unknown lock, ticket or id
//     OutOfMemoryError                                 a tier is full, nothing evictable
//     TransferFailedError                              a copy failed: release, admit again
//     PendingError                                     an async operation is not done yet
//     FailedPreconditionError                          valid call, wrong state
//
// raise() and check() need the GIL: callers release it around the library call, keep the
// Status, and convert it once the GIL is back.
#pragma once

#include <pybind11/pybind11.h>

#include <utility>

#include "radixtier/status.hpp"

namespace radixtier::python {

namespace py = pybind11;

/// Creates the exception classes in `m` (once per process).
void register_errors(py::module_& m);

/// Sets the Python exception for `status` (not ok) and throws py::error_already_set.
[[noreturn]] void raise(const Status& status);

inline void check(const Status& status) {
  if (!status.is_ok()) raise(status);
}

template <class T>
T unwrap(Result<T>&& result) {
  if (!result.is_ok()) raise(result.status());
  return std::move(result).value();
}

/// Raises InvalidArgumentError with `message`.
[[noreturn]] void raise_invalid(const std::string& message);

}  // namespace radixtier::python
