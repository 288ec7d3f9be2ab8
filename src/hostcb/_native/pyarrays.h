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

// Arrays of at least this many bytes get 64-byte aligned data (see
// NewArray); smaller ones NumPy's own allocation.
constexpr int64_t kAlignedArrayBytes = 1024;
constexpr int64_t kArrayAlignment = 64;

// A new C-contiguous NumPy array of XLA dtype `dtype` and shape `dims`
// (uninitialised), or nullptr with a Python error set; with `data`, an
// array over those bytes (16-byte aligned; the caller keeps them alive
// through the array's base).  Needs the GIL.
//
// Without `data`, the data of an array of kAlignedArrayBytes or more is
// 64-byte aligned: the array is a view into a fresh uint8 array a little
// larger (its `base`, which owns the memory), so that JAX's CPU client can
// take it as a jax.Array without a copy (hostcb.jax_internals.host_arrays).
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
  if (data != nullptr || nbytes < kAlignedArrayBytes) {
    Py_INCREF(descr);  // PyArray_NewFromDescr steals it
    return PyArray_NewFromDescr(&PyArray_Type, descr, rank, shape, nullptr,
                                data, data ? NPY_ARRAY_CARRAY : 0, nullptr);
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

// Entry `id` of a registry table that Python indexes by target id (a list
// with None where nothing is registered): a borrowed reference, or nullptr.
inline PyObject* TableEntry(PyObject* table, int64_t id) {
  if (id <= 0 || id >= PyList_GET_SIZE(table)) return nullptr;
  PyObject* entry = PyList_GET_ITEM(table, id);
  return entry == Py_None ? nullptr : entry;
}

}  // namespace hostcb
