// hostcb native engine: what module.cc and call.cc share on the Python side
// (the CPython and NumPy C APIs; NumPy's API table is imported once, in
// module.cc's PyInit__engine).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL hostcb_numpy_api
#ifndef HOSTCB_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include <cstdint>
#include <cstdlib>

#include "engine.h"

namespace hostcb {

// Whether the interpreter is shutting down (safe without the GIL).
inline bool PythonIsFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// NumPy dtype of each XLA dtype code (references owned here), set by
// set_dtypes; nullptr for the dtypes Python cannot receive.
extern PyArray_Descr* g_descr[kMaxDtype];

// Arrays of at least this many bytes get 64-byte aligned data of their own
// (see NewArray); smaller ones a 64-byte aligned slot of a shared slab.
constexpr int64_t kAlignedArrayBytes = 1024;
constexpr int64_t kArrayAlignment = 64;
// The size of a slab of small arrays' slots (16 slots of 64 bytes): a
// slab lives until the last array in it dies, so an array kept alone holds
// at most this much (a tap function that keeps one array in 64 would hold
// 64 times more with 4 KiB slabs).
constexpr int64_t kSlabBytes = kAlignedArrayBytes;

// The slab that small arrays are cut from now (guarded by the GIL): its
// owner (a uint8 NumPy array a little larger than kSlabBytes, which owns
// the memory and is the arrays' base, so that an array over a slot can be
// made writeable again, as legacy's could) and its free range.
struct Slab {
  PyObject* owner = nullptr;
  char* next = nullptr;
  char* end = nullptr;
};
inline Slab g_slab;

// A fresh 64-byte aligned slot of `nbytes` (0 < nbytes < kSlabBytes) in
// *data, and a new reference to the slab that owns it; nullptr with a
// Python error set.  Each slot is handed out once: an array over it is its
// memory's only user, as with memory of its own (a jax.Array made of it
// may take it without a copy and its value never changes).  Needs the GIL.
inline PyObject* SlabSlot(int64_t nbytes, char** data) {
  const int64_t size = (nbytes + kArrayAlignment - 1) & ~(kArrayAlignment - 1);
  if (g_slab.owner == nullptr || g_slab.end - g_slab.next < size) {
    npy_intp raw_size = static_cast<npy_intp>(kSlabBytes + kArrayAlignment);
    PyObject* owner = PyArray_SimpleNew(1, &raw_size, NPY_UINT8);
    if (owner == nullptr) return nullptr;
    auto address = reinterpret_cast<uintptr_t>(
        PyArray_DATA(reinterpret_cast<PyArrayObject*>(owner)));
    Py_XDECREF(g_slab.owner);  // its arrays keep it alive
    g_slab.owner = owner;
    g_slab.next = reinterpret_cast<char*>((address + kArrayAlignment - 1) &
                                          ~uintptr_t(kArrayAlignment - 1));
    g_slab.end = g_slab.next + kSlabBytes;
  }
  *data = g_slab.next;
  g_slab.next += size;
  Py_INCREF(g_slab.owner);
  return g_slab.owner;
}

// A new C-contiguous NumPy array of XLA dtype `dtype` and shape `dims`
// (uninitialised), or nullptr with a Python error set; with `data`, an
// array over those bytes (16-byte aligned; the caller keeps them alive
// through the array's base).  Needs the GIL.
//
// Without `data`, the data is 64-byte aligned, so that JAX's CPU client can
// take it as a jax.Array without a copy (hostcb._jax_internals.host_arrays):
// an array of kAlignedArrayBytes or more is a view into a fresh uint8
// array a little larger (its `base`, which owns the memory); a smaller one
// (not empty) a view of a fresh slot of the current slab (its `base` the
// slab's uint8 array, see SlabSlot), which costs no allocation of its own.
inline PyObject* NewArray(int32_t dtype, int32_t rank, const int64_t* dims,
                          void* data = nullptr) {
  PyArray_Descr* descr =
      dtype >= 0 && dtype < kMaxDtype ? g_descr[dtype] : nullptr;
  if (rank > NPY_MAXDIMS || descr == nullptr) {
    PyErr_Format(PyExc_ValueError,
                 "hostcb: cannot make a NumPy array of XLA dtype %d, rank %d",
                 static_cast<int>(dtype), static_cast<int>(rank));
    return nullptr;
  }
  npy_intp shape[NPY_MAXDIMS];
  int64_t nbytes = PyDataType_ELSIZE(descr);
  for (int k = 0; k < rank; ++k) {
    shape[k] = static_cast<npy_intp>(dims[k]);
    nbytes *= dims[k];
  }
  if (data != nullptr || nbytes == 0) {
    Py_INCREF(descr);  // PyArray_NewFromDescr steals it
    return PyArray_NewFromDescr(&PyArray_Type, descr, rank, shape, nullptr,
                                data, data ? NPY_ARRAY_CARRAY : 0, nullptr);
  }
  if (nbytes < kAlignedArrayBytes) {
    char* slot = nullptr;
    PyObject* owner = SlabSlot(nbytes, &slot);
    if (owner == nullptr) return nullptr;
    Py_INCREF(descr);  // PyArray_NewFromDescr steals it
    PyObject* a =
        PyArray_NewFromDescr(&PyArray_Type, descr, rank, shape, nullptr, slot,
                             NPY_ARRAY_CARRAY, nullptr);
    if (a == nullptr) {
      Py_DECREF(owner);
      return nullptr;
    }
    // Steals `owner`, which now lives as long as the array (and its views).
    if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(a), owner) < 0) {
      Py_DECREF(a);
      return nullptr;
    }
    return a;
  }
  npy_intp raw_size = static_cast<npy_intp>(nbytes + kArrayAlignment);
  PyObject* raw = PyArray_SimpleNew(1, &raw_size, NPY_UINT8);
  if (raw == nullptr) return nullptr;
  auto address = reinterpret_cast<uintptr_t>(
      PyArray_DATA(reinterpret_cast<PyArrayObject*>(raw)));
  auto* aligned = reinterpret_cast<char*>((address + kArrayAlignment - 1) &
                                          ~uintptr_t(kArrayAlignment - 1));
  Py_INCREF(descr);  // PyArray_NewFromDescr steals it
  PyObject* a = PyArray_NewFromDescr(&PyArray_Type, descr, rank, shape, nullptr,
                                     aligned, NPY_ARRAY_CARRAY, nullptr);
  if (a == nullptr) {
    Py_DECREF(raw);
    return nullptr;
  }
  // Steals `raw`, which now lives as long as the array (and its views).
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(a), raw) < 0) {
    Py_DECREF(a);
    return nullptr;
  }
  return a;
}

// The pending Python exception, normalized and with its traceback set, as
// a new reference (nullptr if none); the error indicator is cleared.
inline PyObject* TakeException() {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value != nullptr && tb != nullptr) PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value;
#endif
}

// The XLA dtype code of a NumPy array's dtype (set_dtypes' table), or -1.
inline int DtypeCode(PyArrayObject* a) {
  for (int code = 0; code < kMaxDtype; ++code) {
    if (g_descr[code] != nullptr &&
        PyArray_EquivTypes(PyArray_DESCR(a), g_descr[code])) {
      return code;
    }
  }
  return -1;
}

// Entry `id` of a registry table that Python indexes by target id (a list
// with None where nothing is registered): a borrowed reference, or nullptr.
inline PyObject* TableEntry(PyObject* table, int64_t id) {
  if (id <= 0 || id >= PyList_GET_SIZE(table)) return nullptr;
  PyObject* entry = PyList_GET_ITEM(table, id);
  return entry == Py_None ? nullptr : entry;
}

}  // namespace hostcb
