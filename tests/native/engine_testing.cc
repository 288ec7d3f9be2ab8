// hostcb native engine, test build only: the functions that tests call to
// drive the simulated CUDA driver (cuda_fake.cc) and to inject faults,
// added to hostcb._native._engine by PyInit__engine (module.cc) where
// setup.py builds with HOSTCB_TEST_BUILD=1 (`make install`).  Neither this
// file nor cuda_fake.cc is in a production build (wheels, `pip install .`).
//
// The tests of the GPU back end's host side call the handlers' bodies
// (TapOnStream, CallOnStream) through _cuda_test_tap and _cuda_test_call,
// with NumPy arrays standing for GPU buffers, on simulated streams.
#include <string>
#include <vector>

#include "cuda_api.h"
#include "cuda_fake.h"
#include "pyarrays.h"

#ifndef HOSTCB_TEST_BUILD
#error "engine_testing.cc belongs to the test build only (HOSTCB_TEST_BUILD)"
#endif

namespace ffi = xla::ffi;

namespace hostcb {
namespace {

// ------------------------------------------------------- fault injection
PyObject* Py_fail_next_allocations(PyObject*, PyObject* arg) {
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  FailNextAllocations(n);
  Py_RETURN_NONE;
}

// Counts a fallback of hostcb_tap as the handler does, with `reason` (kept
// for the process's life).
PyObject* Py_note_tap_fallback(PyObject*, PyObject* arg) {
  const char* reason = PyUnicode_AsUTF8(arg);
  if (reason == nullptr) return nullptr;
  NoteTapFallback((new std::string(reason))->c_str());  // leaked on purpose
  Py_RETURN_NONE;
}

PyObject* Py_gpu_words_refused(PyObject*, PyObject* arg) {
  const long code = PyLong_AsLong(arg);
  if (PyErr_Occurred()) return nullptr;
  SetGpuWordsRefused(static_cast<int>(code));
  Py_RETURN_NONE;
}

// ------------------------------------------------------ simulated driver
PyObject* Py_use_fake_cuda(PyObject*, PyObject*) {
  cuda::UseFakeCuda();
  Py_RETURN_NONE;
}

void* StreamArg(PyObject* handle) {
  void* s = PyLong_AsVoidPtr(handle);
  if (s == nullptr && !PyErr_Occurred()) {
    PyErr_SetString(PyExc_ValueError, "hostcb: not a simulated stream");
  }
  return s;
}

PyObject* Py_fake_stream(PyObject*, PyObject*) {
  return PyLong_FromVoidPtr(cuda::NewFakeStream());
}

PyObject* Py_fake_pause(PyObject*, PyObject* args) {
  PyObject* handle;
  int paused;
  if (!PyArg_ParseTuple(args, "Op", &handle, &paused)) return nullptr;
  void* s = StreamArg(handle);
  if (s == nullptr) return nullptr;
  cuda::PauseFakeStream(s, paused != 0);
  Py_RETURN_NONE;
}

PyObject* Py_fake_pending(PyObject*, PyObject* handle) {
  void* s = StreamArg(handle);
  if (s == nullptr) return nullptr;
  return PyLong_FromSize_t(cuda::FakeStreamPending(s));
}

PyObject* Py_fake_sync(PyObject*, PyObject* handle) {
  void* s = StreamArg(handle);
  if (s == nullptr) return nullptr;
  const cuda::Api* api = cuda::Current();
  cuda::CUresult r = 0;
  Py_BEGIN_ALLOW_THREADS r = api->StreamSynchronize(s);
  Py_END_ALLOW_THREADS if (r != 0) {
    PyErr_SetString(PyExc_TimeoutError, cuda::ErrorName(r).c_str());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* Py_fake_counters(PyObject*, PyObject*) {
  const cuda::FakeCounters c = cuda::GetFakeCounters();
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "copies",
                       (unsigned long long)c.copies, "host_functions",
                       (unsigned long long)c.host_functions, "word_writes",
                       (unsigned long long)c.word_writes, "synchronizations",
                       (unsigned long long)c.synchronizations, "registrations",
                       (unsigned long long)c.registrations, "registered_bytes",
                       (unsigned long long)c.registered_bytes,
                       "unregistrations", (unsigned long long)c.unregistrations,
                       "pinned_allocations",
                       (unsigned long long)c.pinned_allocations);
}

PyObject* Py_fake_fail(PyObject*, PyObject* args) {
  const char* op;
  int count, code;
  if (!PyArg_ParseTuple(args, "sii", &op, &count, &code)) return nullptr;
  const std::string name = op;
  cuda::FakeOp which;
  if (name == "copy")
    which = cuda::FakeOp::kCopy;
  else if (name == "host_function")
    which = cuda::FakeOp::kHostFunc;
  else if (name == "register")
    which = cuda::FakeOp::kRegister;
  else if (name == "unregister")
    which = cuda::FakeOp::kUnregister;
  else if (name == "alloc")
    which = cuda::FakeOp::kAlloc;
  else if (name == "write_value")
    which = cuda::FakeOp::kWriteValue;
  else {
    PyErr_Format(PyExc_ValueError,
                 "hostcb: expected one of 'copy', 'host_function', "
                 "'register', 'unregister', 'alloc', 'write_value'; got %R",
                 PyTuple_GET_ITEM(args, 0));
    return nullptr;
  }
  cuda::FailFake(which, count, code);
  Py_RETURN_NONE;
}

// FFI buffers over C-contiguous NumPy arrays ("GPU memory" for the
// simulated driver).  Keeps what the buffers point into.
struct Buffers {
  std::vector<XLA_FFI_Buffer> bufs;
  std::vector<std::vector<int64_t>> dims;
  std::vector<void*> ptrs;

  bool Add(PyObject* item, bool writable) {
    if (!PyArray_Check(item) ||
        !PyArray_ISCARRAY_RO(reinterpret_cast<PyArrayObject*>(item)) ||
        (writable &&
         !PyArray_ISWRITEABLE(reinterpret_cast<PyArrayObject*>(item)))) {
      PyErr_SetString(PyExc_TypeError,
                      "hostcb: expected C-contiguous NumPy arrays");
      return false;
    }
    auto* a = reinterpret_cast<PyArrayObject*>(item);
    const int code = DtypeCode(a);
    if (code < 0) {
      PyErr_SetString(PyExc_TypeError, "hostcb: a dtype the engine lacks");
      return false;
    }
    std::vector<int64_t> d(PyArray_NDIM(a));
    for (int k = 0; k < PyArray_NDIM(a); ++k) d[k] = PyArray_DIM(a, k);
    dims.push_back(std::move(d));
    XLA_FFI_Buffer b{};
    b.struct_size = sizeof(XLA_FFI_Buffer);
    b.dtype = static_cast<XLA_FFI_DataType>(code);
    b.data = PyArray_DATA(a);
    b.rank = PyArray_NDIM(a);
    bufs.push_back(b);
    return true;
  }

  void** Pointers() {
    ptrs.clear();
    for (size_t i = 0; i < bufs.size(); ++i) {
      bufs[i].dims = dims[i].data();
      ptrs.push_back(&bufs[i]);
    }
    return ptrs.data();
  }
};

bool AddAll(Buffers* b, PyObject* seq, bool writable) {
  PyObject* fast =
      PySequence_Fast(seq, "hostcb: expected a sequence of arrays");
  if (fast == nullptr) return false;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(fast); ++i) {
    ok = b->Add(PySequence_Fast_GET_ITEM(fast, i), writable);
  }
  Py_DECREF(fast);
  return ok;
}

PyObject* Raise(const ffi::Error& e) {
  PyErr_SetString(PyExc_RuntimeError, e.message().c_str());
  return nullptr;
}

// _cuda_test_tap(stream, ordinal, target_id, arrays): the CUDA hostcb_tap
// handler's body, run on a simulated stream (GIL released).
PyObject* Py_cuda_test_tap(PyObject*, PyObject* args) {
  PyObject *handle, *arrays;
  int ordinal;
  long long tid;
  if (!PyArg_ParseTuple(args, "OiLO", &handle, &ordinal, &tid, &arrays)) {
    return nullptr;
  }
  void* s = StreamArg(handle);
  if (s == nullptr) return nullptr;
  Buffers in;
  if (!AddAll(&in, arrays, false)) return nullptr;
  std::vector<XLA_FFI_ArgType> types(in.bufs.size(), XLA_FFI_ArgType_BUFFER);
  XLA_FFI_Args a{};
  a.struct_size = sizeof(XLA_FFI_Args);
  a.size = static_cast<int64_t>(in.bufs.size());
  a.types = types.data();
  a.args = in.Pointers();
  ffi::Error e = ffi::Error::Success();
  Py_BEGIN_ALLOW_THREADS e = TapOnStream(s, ordinal, tid, &a, 0);
  Py_END_ALLOW_THREADS if (e.failure()) return Raise(e);
  Py_RETURN_NONE;
}

// _cuda_test_call(stream, ordinal, target_id, arrays, outs, one_array):
// the CUDA hostcb_call(_one) handler's body on a simulated stream; writes
// the results into the arrays `outs` once the stream has run.
PyObject* Py_cuda_test_call(PyObject*, PyObject* args) {
  PyObject *handle, *arrays, *outs;
  int ordinal, one;
  long long tid;
  if (!PyArg_ParseTuple(args, "OiLOOp", &handle, &ordinal, &tid, &arrays, &outs,
                        &one)) {
    return nullptr;
  }
  void* s = StreamArg(handle);
  if (s == nullptr) return nullptr;
  Buffers in, out;
  if (!AddAll(&in, arrays, false) || !AddAll(&out, outs, true)) return nullptr;
  std::vector<XLA_FFI_ArgType> at(in.bufs.size(), XLA_FFI_ArgType_BUFFER);
  std::vector<XLA_FFI_RetType> rt(out.bufs.size(), XLA_FFI_RetType_BUFFER);
  XLA_FFI_Args a{};
  a.struct_size = sizeof(XLA_FFI_Args);
  a.size = static_cast<int64_t>(in.bufs.size());
  a.types = at.data();
  a.args = in.Pointers();
  XLA_FFI_Rets r{};
  r.struct_size = sizeof(XLA_FFI_Rets);
  r.size = static_cast<int64_t>(out.bufs.size());
  r.types = rt.data();
  r.rets = out.Pointers();
  ffi::Error e = ffi::Error::Success();
  Py_BEGIN_ALLOW_THREADS e =
      CallOnStream(one != 0, s, ordinal, tid, &a, 0, &r, 0);
  Py_END_ALLOW_THREADS if (e.failure()) return Raise(e);
  Py_RETURN_NONE;
}

PyMethodDef kTestMethods[] = {
    {"_fail_next_allocations", Py_fail_next_allocations, METH_O,
     "_fail_next_allocations(n): run_batch fails to allocate the arrays of "
     "the next n taps, as if out of memory."},
    {"_note_tap_fallback", Py_note_tap_fallback, METH_O,
     "_note_tap_fallback(reason): counts a tap that took XLA FFI's generic "
     "decoding, for the given reason."},
    {"_gpu_words_refused", Py_gpu_words_refused, METH_O,
     "_gpu_words_refused(code): as if the driver had refused ready "
     "words with CUDA error `code` (0: words again)."},
    {"_use_fake_cuda", Py_use_fake_cuda, METH_NOARGS,
     "The GPU back end uses the simulated driver from now on."},
    {"_fake_stream", Py_fake_stream, METH_NOARGS,
     "A new simulated stream (an int handle)."},
    {"_fake_pause", Py_fake_pause, METH_VARARGS,
     "_fake_pause(stream, paused) holds back or lets run its work."},
    {"_fake_pending", Py_fake_pending, METH_O,
     "Operations of the stream not yet finished."},
    {"_fake_sync", Py_fake_sync, METH_O,
     "Waits (at most 60 s, then TimeoutError) until the stream has "
     "run everything enqueued on it."},
    {"_fake_counters", Py_fake_counters, METH_NOARGS,
     "What the simulated driver was asked to do."},
    {"_fake_fail", Py_fake_fail, METH_VARARGS,
     "_fake_fail(op, count, code): the next `count` operations of "
     "kind op ('copy', 'host_function', 'register', 'unregister', "
     "'alloc', 'write_value') fail with "
     "CUDA error `code`."},
    {"_cuda_test_tap", Py_cuda_test_tap, METH_VARARGS,
     "_cuda_test_tap(stream, ordinal, target_id, arrays)."},
    {"_cuda_test_call", Py_cuda_test_call, METH_VARARGS,
     "_cuda_test_call(stream, ordinal, target_id, arrays, outs, "
     "one_array)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int AddTestFunctions(PyObject* module) {
  return PyModule_AddFunctions(module, kTestMethods);
}

}  // namespace hostcb
