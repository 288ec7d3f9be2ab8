// hostcb native engine: hostcb_call, the XLA FFI handler of `call` (CPU).
//
// attrs: target_id (int64).  Operands: an optional XLA token first, then
// the arrays.  Results: the token, if one came in, then the call's results.
//
// It runs the call on the device thread that executes the custom call:
// takes the GIL, copies each operand into a fresh read-only NumPy array
// (the one copy: the host function may keep it), calls the call's runner,
// registered by Python (set_call_server) in a list indexed by target id, as
// runner(arrays, device_ordinal), and copies the arrays it returns (exact
// dtypes and shapes, checked again here) into the result buffers.  A runner
// that raises fails the computation with the text that Python's formatter
// makes of the exception.
//
// hostcb_call_one is the same handler for a call whose result is one array
// (the common case): its runner returns the host function's result as it
// is, and the handler checks it here (an exact NumPy array of the result's
// dtype and shape is copied at once); anything else goes to Python's
// checker(target_id, result), which converts it as a tuple or raises the
// error that legacy raised.  So the usual call costs no Python check.
//
// Why on the device thread and not through the device's consumer thread:
// a call waits for its results anyway, so a hand-off would only add two
// thread switches; and a call made by jitted code that a tap function runs
// must not wait for the consumer that is running that very tap function.
// Program order with the device's taps: before taking the GIL the handler
// waits until the device's consumer has run every tap queued before the
// call (Queue::WaitForEarlierRecords), unless it runs on that consumer's
// thread or while that consumer runs a tap function that dispatched a
// computation (jitted code: the call belongs to that function).
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "pyarrays.h"

namespace ffi = xla::ffi;

namespace hostcb {

// What Python set with set_call_server (strong references), guarded by the
// GIL: the runners (a list indexed by target id), checker(target_id,
// result), formatter(exc).
PyObject* g_call_runners = nullptr;
PyObject* g_call_checker = nullptr;
PyObject* g_call_formatter = nullptr;

// The runners that this thread is running, innermost first (a call's host
// function may run jitted code that makes another call on the same
// thread): what RunningCallRunners reports, so that Python can tell
// whether the thread runs the host function of an io_callback/
// pure_callback without marking each call itself.
namespace {
struct RunningCall {
  PyObject* runner;
  const RunningCall* outer;
};
thread_local const RunningCall* tl_running_call = nullptr;
}  // namespace

PyObject* RunningCallRunners() {
  Py_ssize_t n = 0;
  for (const RunningCall* c = tl_running_call; c != nullptr; c = c->outer) ++n;
  PyObject* t = PyTuple_New(n);
  if (t == nullptr) return nullptr;
  Py_ssize_t k = 0;
  for (const RunningCall* c = tl_running_call; c != nullptr; c = c->outer) {
    Py_INCREF(c->runner);
    PyTuple_SET_ITEM(t, k++, c->runner);
  }
  return t;
}

namespace {

ffi::Error Failure(std::string message) {
  return ffi::Error(ffi::ErrorCode::kInternal, std::move(message));
}

// The current Python exception as text (and cleared): what Python's
// formatter makes of it (XLA's own wording and the traceback), else its str.
std::string TakePythonError() {
  PyObject* exc = TakeException();
  std::string text;
  if (exc != nullptr && g_call_formatter != nullptr) {
    if (PyObject* s = PyObject_CallOneArg(g_call_formatter, exc)) {
      if (const char* u = PyUnicode_AsUTF8(s)) text = u;
      Py_DECREF(s);
    }
    PyErr_Clear();
  }
  if (text.empty()) {
    text = "hostcb: the call's host function failed";
    if (exc != nullptr) {
      if (PyObject* s = PyObject_Str(exc)) {
        if (const char* u = PyUnicode_AsUTF8(s)) text += std::string(": ") + u;
        Py_DECREF(s);
      }
    }
    PyErr_Clear();
  }
  Py_XDECREF(exc);
  return text;
}

// Fresh read-only arrays with the bytes of the non-token operands.
PyObject* OperandArrays(const XLA_FFI_Args* args, size_t first) {
  Py_ssize_t n = 0;
  for (size_t i = first; i < static_cast<size_t>(args->size); ++i) {
    auto* b = static_cast<const XLA_FFI_Buffer*>(args->args[i]);
    if (args->types[i] != XLA_FFI_ArgType_BUFFER) {
      PyErr_SetString(PyExc_ValueError, "hostcb: operands must be buffers");
      return nullptr;
    }
    if (b->dtype != XLA_FFI_DataType_TOKEN) ++n;
  }
  PyObject* arrays = PyTuple_New(n);
  if (arrays == nullptr) return nullptr;
  Py_ssize_t k = 0;
  for (size_t i = first; i < static_cast<size_t>(args->size); ++i) {
    auto* b = static_cast<const XLA_FFI_Buffer*>(args->args[i]);
    if (b->dtype == XLA_FFI_DataType_TOKEN) continue;
    PyObject* a = NewArray(b->dtype, static_cast<int32_t>(b->rank), b->dims);
    if (a == nullptr) {
      Py_DECREF(arrays);
      return nullptr;
    }
    auto* arr = reinterpret_cast<PyArrayObject*>(a);
    if (const uint64_t nbytes = BufferBytes(b)) {
      std::memcpy(PyArray_DATA(arr), b->data, nbytes);
    }
    PyArray_CLEARFLAGS(arr, NPY_ARRAY_WRITEABLE);
    PyTuple_SET_ITEM(arrays, k++, a);
  }
  return arrays;
}

// Checks the server's results against the non-token result buffers, then
// copies them in (nothing is written unless all of them fit).
ffi::Error CopyResults(PyObject* results, const XLA_FFI_Rets* rets,
                       size_t first) {
  PyObject* seq = PySequence_Fast(results, "");
  if (seq == nullptr) {
    PyErr_Clear();
    return Failure("hostcb: the call server must return a sequence of arrays");
  }
  std::vector<std::pair<XLA_FFI_Buffer*, PyArrayObject*>> todo;
  std::string error;
  Py_ssize_t k = 0;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (size_t i = first; i < static_cast<size_t>(rets->size) && error.empty();
       ++i) {
    auto* b = static_cast<XLA_FFI_Buffer*>(rets->rets[i]);
    if (rets->types[i] != XLA_FFI_RetType_BUFFER) {
      error = "hostcb: results must be buffers";
      break;
    }
    if (b->dtype == XLA_FFI_DataType_TOKEN) continue;
    if (k >= n) {
      error = "hostcb: the call returned too few results";
      break;
    }
    PyObject* item = PySequence_Fast_GET_ITEM(seq, k);
    PyArray_Descr* want =
        b->dtype >= 0 && b->dtype < kMaxDtype ? g_descr[b->dtype] : nullptr;
    auto* a = reinterpret_cast<PyArrayObject*>(item);
    bool ok = want != nullptr && PyArray_Check(item) &&
              PyArray_EquivTypes(PyArray_DESCR(a), want) &&
              PyArray_NDIM(a) == static_cast<int>(b->rank);
    for (int d = 0; ok && d < PyArray_NDIM(a); ++d) {
      ok = PyArray_DIM(a, d) == b->dims[d];
    }
    if (!ok) {
      error = "hostcb: result " + std::to_string(k) +
              " of the call does not have the dtype and shape of the "
              "call's result_shape";
      break;
    }
    PyArrayObject* c = PyArray_GETCONTIGUOUS(a);  // new reference
    if (c == nullptr) {
      error = TakePythonError();
      break;
    }
    todo.emplace_back(b, c);
    ++k;
  }
  if (error.empty() && k != n)
    error = "hostcb: the call returned too many results";
  if (error.empty()) {
    for (auto& [b, c] : todo) {
      if (const uint64_t nbytes = BufferBytes(b)) {
        std::memcpy(b->data, PyArray_DATA(c), nbytes);
      }
    }
  }
  for (auto& bc : todo) Py_DECREF(bc.second);
  Py_DECREF(seq);
  return error.empty() ? ffi::Error::Success() : Failure(std::move(error));
}

// The one result buffer of a hostcb_call_one call.
XLA_FFI_Buffer* OneResult(const XLA_FFI_Rets* rets, size_t first) {
  for (size_t i = first; i < static_cast<size_t>(rets->size); ++i) {
    if (rets->types[i] != XLA_FFI_RetType_BUFFER) return nullptr;
    auto* b = static_cast<XLA_FFI_Buffer*>(rets->rets[i]);
    if (b->dtype != XLA_FFI_DataType_TOKEN) return b;
  }
  return nullptr;
}

// Copies `result` into the one result buffer if it is exactly a NumPy
// array of its dtype and shape; false (nothing written) otherwise.
bool CopyExactArray(PyObject* result, const XLA_FFI_Rets* rets, size_t first) {
  if (!PyArray_CheckExact(result)) return false;
  XLA_FFI_Buffer* b = OneResult(rets, first);
  if (b == nullptr || b->dtype < 0 || b->dtype >= kMaxDtype) return false;
  auto* a = reinterpret_cast<PyArrayObject*>(result);
  PyArray_Descr* want = g_descr[b->dtype];
  if (want == nullptr || PyArray_NDIM(a) != static_cast<int>(b->rank) ||
      !PyArray_ISCARRAY_RO(a)) {
    return false;
  }
  for (int d = 0; d < PyArray_NDIM(a); ++d) {
    if (PyArray_DIM(a, d) != b->dims[d]) return false;
  }
  if (PyArray_DESCR(a) != want && !PyArray_EquivTypes(PyArray_DESCR(a), want)) {
    return false;
  }
  if (const uint64_t nbytes = BufferBytes(b)) {
    std::memcpy(b->data, PyArray_DATA(a), nbytes);
  }
  return true;
}

// With the GIL held.
template <bool kOneArray>
ffi::Error RunCall(int32_t device, int64_t target_id, const XLA_FFI_Args* args,
                   size_t first_arg, const XLA_FFI_Rets* rets,
                   size_t first_ret) {
  if (g_call_runners == nullptr) {
    return Failure("hostcb: no call server is set (engine not started)");
  }
  PyObject* runner = TableEntry(g_call_runners, target_id);  // borrowed
  if (runner == nullptr) {
    return Failure("hostcb: no call is registered with target id " +
                   std::to_string(target_id));
  }
  PyObject* arrays = OperandArrays(args, first_arg);
  if (arrays == nullptr) return Failure(TakePythonError());
  PyObject* out = nullptr;
  if (PyObject* dev = PyLong_FromLong(device)) {
    PyObject* argv[2] = {arrays, dev};
    Py_INCREF(runner);  // the registry may change while it runs
    const RunningCall running{runner, tl_running_call};
    tl_running_call = &running;
    out = PyObject_Vectorcall(runner, argv, 2, nullptr);
    tl_running_call = running.outer;
    Py_DECREF(runner);
    Py_DECREF(dev);
  }
  Py_DECREF(arrays);
  if (out == nullptr) return Failure(TakePythonError());
  if (kOneArray) {
    if (CopyExactArray(out, rets, first_ret)) {  // the usual case
      Py_DECREF(out);
      return ffi::Error::Success();
    }
    // Anything else: Python converts it or fails.
    PyObject* checked = nullptr;
    if (PyObject* tid = PyLong_FromLongLong(target_id)) {
      PyObject* argv[2] = {tid, out};
      checked = PyObject_Vectorcall(g_call_checker, argv, 2, nullptr);
      Py_DECREF(tid);
    }
    Py_DECREF(out);
    if (checked == nullptr) return Failure(TakePythonError());
    out = checked;
  }
  ffi::Error e = CopyResults(out, rets, first_ret);
  Py_DECREF(out);
  return e;
}

// Takes the GIL on this thread.  An XLA thread that has no Python thread
// state gets one, kept for the life of the thread (one extra
// PyGILState_Ensure that is never released): creating and deleting one per
// call would cost more than the rest of the call.
PyGILState_STATE AcquireGil() {
  thread_local bool kept = false;
  if (!kept && PyGILState_GetThisThreadState() == nullptr) {
    kept = true;
    PyGILState_STATE g = PyGILState_Ensure();
    PyGILState_Ensure();  // the reference that keeps the thread state
    return g;
  }
  return PyGILState_Ensure();
}

template <bool kOneArray>
ffi::Error CallImpl(int32_t device, int64_t target_id, ffi::RemainingArgs args,
                    ffi::RemainingRets rets) {
  RawArgs ra(args);
  RawRets rr(rets);
  return CallOnHost(kOneArray, device, target_id, ra.raw(), ra.first(),
                    rr.raw(), rr.first());
}

}  // namespace

ffi::Error CallOnHost(bool one_array, int32_t device, int64_t target_id,
                      const XLA_FFI_Args* args, size_t first_arg,
                      const XLA_FFI_Rets* rets, size_t first_ret) {
  if (PythonIsFinalizing()) {
    return ffi::Error(ffi::ErrorCode::kCancelled,
                      "hostcb: a call ran while Python was shutting down");
  }
  Queue* q = FindQueue(device);
  if (q != nullptr && q != tl_consumer_queue) q->WaitForEarlierRecords();
  PyGILState_STATE gil = AcquireGil();
  ffi::Error e =
      one_array
          ? RunCall<true>(device, target_id, args, first_arg, rets, first_ret)
          : RunCall<false>(device, target_id, args, first_arg, rets, first_ret);
  PyGILState_Release(gil);
  return e;
}

}  // namespace hostcb

namespace hostcb {
namespace {
// The binding of both call handlers.
auto CallBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::DeviceOrdinal>()
      .Attr<int64_t>("target_id")
      .RemainingArgs()
      .RemainingRets();
}
}  // namespace
}  // namespace hostcb

XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbCall, hostcb::CallImpl<false>,
                              hostcb::CallBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbCallOne, hostcb::CallImpl<true>,
                              hostcb::CallBinding());
