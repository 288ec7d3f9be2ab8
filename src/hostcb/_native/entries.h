// hostcb native engine: the kinds of host-function entries that the
// handlers run, as hostcb/_engine/entries.py names them (the same kinds,
// the same fields in the same order; set_entry_kinds checks that they
// agree).  Each kind is a NamedTuple: the handlers tell the kinds apart by
// their type (a pointer comparison) and read the fields by position, with
// no attribute lookup per tap or call.
//
// Tap entries (module.cc: RunTap, BuildLine):
//   ArrayTap(func, second)                  func(arrays[0], second)
//   PrintLineTap(write_lines, pieces, fallback, array_text)
//                                           a print's line made in C
//                                           from `pieces`, else `fallback`
//                                           (an ArrayTap); array_text:
//                                           None, or (check, threshold,
//                                           numbers) for array2string's
//                                           text
//   ArraysTap(run)                          run(arrays, device)
// Call entries (call.cc: RunCall):
//   CallRunner(run, host_function)          run(arrays, device_ordinal)
//   DirectCall(func, on_failure, pending, run)
//                                           func(array) while `pending` is
//                                           empty, else run(arrays, ordinal)
#pragma once

#include <Python.h>

namespace hostcb {

enum EntryKind : int {
  kArrayTap = 0,
  kPrintLineTap,
  kArraysTap,
  kCallRunner,
  kDirectCall,
  kEntryKinds,
};

// The fields of each kind, by position.
namespace array_tap {
constexpr Py_ssize_t kFunc = 0, kSecond = 1;
}
namespace print_line_tap {
constexpr Py_ssize_t kWriteLines = 0, kPieces = 1, kFallback = 2,
                     kArrayText = 3;
}
namespace arrays_tap {
constexpr Py_ssize_t kRun = 0;
}
namespace call_runner {
constexpr Py_ssize_t kRun = 0;
}
namespace direct_call {
constexpr Py_ssize_t kFunc = 0, kOnFailure = 1, kPending = 2, kRun = 3;
}

// The Python type of each kind (module.cc: set_entry_kinds; strong
// references), nullptr until Python hands them in.
extern PyTypeObject* g_entry_types[kEntryKinds];

// Whether `entry` is of kind `kind` (not a subclass: an exact type).
inline bool IsKind(PyObject* entry, EntryKind kind) {
  return Py_TYPE(entry) == g_entry_types[kind];
}

}  // namespace hostcb
