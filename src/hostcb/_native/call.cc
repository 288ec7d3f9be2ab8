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
// The entries are of the kinds of entries.h (hostcb/_engine/entries.py):
// a CallRunner(run, host_function), or a DirectCall: for a call of one
// array to one array whose host function takes no device, Python
// registers DirectCall(func, on_failure, pending, run).  The handler then
// calls func(array)
// itself, with no Python frame, tuple or device number between; when func
// raises, on_failure(exc) (None: nothing) records the failure first (as
// legacy, it also reaches the next barrier_wait).  `pending` is the dict of
// the device queues of the taps that go through XLA's Python callbacks:
// while it is not empty, such taps may be queued before the call and the
// handler calls run(arrays, device_ordinal) instead, the runner that
// drains them first and does the same work.
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

#include "entries.h"
#include "pyarrays.h"

namespace ffi = xla::ffi;

namespace hostcb {

// What Python set with set_call_server (strong references), guarded by the
// GIL: the call entries (a list indexed by target id),
// checker(target_id, result), formatter(exc).
PyObject* g_call_runners = nullptr;
PyObject* g_call_checker = nullptr;
PyObject* g_call_formatter = nullptr;

// The call entries that this thread is running, innermost
// first (a call's host function may run jitted code that makes another
// call on the same thread): what RunningCallRunners reports, so that
// Python can tell whether the thread runs the host function of an
// io_callback/pure_callback without marking each call itself.
namespace {
struct RunningCall {
  PyObject* entry;
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
    Py_INCREF(c->entry);
    PyTuple_SET_ITEM(t, k++, c->entry);
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

// A fresh read-only array with the bytes of buffer `b`.
PyObject* OperandArray(const XLA_FFI_Buffer* b) {
  PyObject* a = NewArray(b->dtype, static_cast<int32_t>(b->rank), b->dims);
  if (a == nullptr) return nullptr;
  auto* arr = reinterpret_cast<PyArrayObject*>(a);
  if (const uint64_t nbytes = BufferBytes(b)) {
    std::memcpy(PyArray_DATA(arr), b->data, nbytes);
  }
  PyArray_CLEARFLAGS(arr, NPY_ARRAY_WRITEABLE);
  return a;
}

// The one non-token operand, if every operand is a buffer and exactly one
// is not a token; else nullptr (OperandArrays then says what is wrong).
const XLA_FFI_Buffer* OneOperand(const XLA_FFI_Args* args, size_t first) {
  const XLA_FFI_Buffer* one = nullptr;
  for (size_t i = first; i < static_cast<size_t>(args->size); ++i) {
    if (args->types[i] != XLA_FFI_ArgType_BUFFER) return nullptr;
    auto* b = static_cast<const XLA_FFI_Buffer*>(args->args[i]);
    if (b->dtype == XLA_FFI_DataType_TOKEN) continue;
    if (one != nullptr) return nullptr;
    one = b;
  }
  return one;
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
    PyObject* a = OperandArray(b);
    if (a == nullptr) {
      Py_DECREF(arrays);
      return nullptr;
    }
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

// Puts back `exc` (a new reference, stolen) as the current exception.
void RestoreException(PyObject* exc) {
#if PY_VERSION_HEX >= 0x030C0000
  PyErr_SetRaisedException(exc);
#else
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(exc));
  Py_INCREF(type);
  PyErr_Restore(type, exc, PyException_GetTraceback(exc));
#endif
}

// Runs a direct entry's host function on a fresh read-only array of
// `operand`: its result (a new reference), or nullptr with the Python
// error set.  When it raised, on_failure(exc) (unless None) sees the
// exception first, as the Python runner's `except` did; should on_failure
// raise, its exception (with the host function's as its context) is the
// one that fails the call, as a raise in that `except` would be.
PyObject* RunDirect(PyObject* entry, const XLA_FFI_Buffer* operand) {
  PyObject* a = OperandArray(operand);
  if (a == nullptr) return nullptr;
  Py_INCREF(entry);  // the registry may change while it runs
  const RunningCall running{entry, tl_running_call};
  tl_running_call = &running;
  PyObject* out =
      PyObject_CallOneArg(PyTuple_GET_ITEM(entry, direct_call::kFunc), a);
  Py_DECREF(a);
  PyObject* on_failure = PyTuple_GET_ITEM(entry, direct_call::kOnFailure);
  if (out == nullptr && on_failure != Py_None) {
    // (Python turns a NULL result without an exception into a SystemError:
    // an exception is set here.)
    PyObject* exc = TakeException();
    if (PyObject* r = PyObject_CallOneArg(on_failure, exc)) {
      Py_DECREF(r);
      RestoreException(exc);
    } else {
      PyObject* raised = TakeException();
      PyException_SetContext(raised, exc);  // steals exc
      RestoreException(raised);
    }
  }
  tl_running_call = running.outer;
  Py_DECREF(entry);
  return out;
}

// With the GIL held.
template <bool kOneArray>
ffi::Error RunCall(int32_t device, int64_t target_id, const XLA_FFI_Args* args,
                   size_t first_arg, const XLA_FFI_Rets* rets,
                   size_t first_ret) {
  if (g_call_runners == nullptr) {
    return Failure("hostcb: no call server is set (engine not started)");
  }
  PyObject* entry = TableEntry(g_call_runners, target_id);  // borrowed
  if (entry == nullptr) {
    return Failure("hostcb: no call is registered with target id " +
                   std::to_string(target_id));
  }
  PyObject* out = nullptr;
  PyObject* run = nullptr;  // run(arrays, device_ordinal), borrowed
  if (IsKind(entry, kDirectCall)) {
    PyObject* pending = PyTuple_GET_ITEM(entry, direct_call::kPending);
    const XLA_FFI_Buffer* operand = nullptr;
    if (kOneArray && PyDict_CheckExact(pending) &&
        PyDict_GET_SIZE(pending) == 0) {
      operand = OneOperand(args, first_arg);
    }
    if (operand != nullptr) {
      out = RunDirect(entry, operand);
    } else {  // taps queued through Python callbacks: the runner drains
      run = PyTuple_GET_ITEM(entry, direct_call::kRun);
    }
  } else if (IsKind(entry, kCallRunner)) {
    run = PyTuple_GET_ITEM(entry, call_runner::kRun);
  } else {
    return Failure("hostcb: the entry of call target id " +
                   std::to_string(target_id) +
                   " is of no kind that the engine runs "
                   "(hostcb._engine.entries)");
  }
  if (run != nullptr) {
    PyObject* arrays = OperandArrays(args, first_arg);
    if (arrays == nullptr) return Failure(TakePythonError());
    if (PyObject* dev = PyLong_FromLong(device)) {
      PyObject* argv[2] = {arrays, dev};
      Py_INCREF(entry);  // the registry may change while it runs
      const RunningCall running{entry, tl_running_call};
      tl_running_call = &running;
      out = PyObject_Vectorcall(run, argv, 2, nullptr);
      tl_running_call = running.outer;
      Py_DECREF(entry);
      Py_DECREF(dev);
    }
    Py_DECREF(arrays);
  }
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
