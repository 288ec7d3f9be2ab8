// hostcb native tap engine: the CPython module hostcb._native._engine.
//
// The host side of the queues in queue.h: consumers take batches of records
// out as NumPy arrays, put barrier markers, complete calls.  Plain CPython C
// API and NumPy C API.
//
// Copy semantics: take_batch makes ONE copy of each operand, out of the
// ring into a fresh NumPy array that Python owns (callbacks may keep it);
// the ring bytes are freed as soon as the batch is copied.  Memory is thus
// bounded by the ring capacity plus one batch (take_batch's max_bytes,
// default the capacity): within 2x the queue size.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine.h"

namespace hostcb {
namespace {

// NumPy dtype of each XLA dtype code (new references), set by set_dtypes.
PyArray_Descr* g_descr[kMaxDtype];

// Copies of this many bytes or more in one batch run without the GIL.
constexpr uint64_t kCopyWithoutGil = 1 << 20;

// ------------------------------------------------------------ CallHandle
// The consumer's side of a pending `call`: complete(results) or fail(msg)
// exactly once; a handle destroyed unanswered fails the call, so the device
// never waits forever.
struct CallHandle {
  PyObject_HEAD
  CallSlot* slot;  // nullptr once answered
  int32_t device;
};

void FinishSlot(CallSlot* slot, bool failed, std::string error) {
  std::lock_guard<std::mutex> lock(slot->mu);
  slot->failed = failed;
  slot->error = std::move(error);
  slot->done = true;
  slot->cv.notify_one();
  // The handler may return and destroy the slot as soon as mu is released.
}

void CallHandle_dealloc(PyObject* self) {
  auto* h = reinterpret_cast<CallHandle*>(self);
  if (h->slot) {
    FinishSlot(h->slot, true,
               "hostcb: the host callback of this call was never answered");
    h->slot = nullptr;
  }
  Py_TYPE(self)->tp_free(self);
}

bool CheckPending(CallHandle* h) {
  if (h->slot) return true;
  PyErr_SetString(PyExc_RuntimeError, "hostcb: this call was already answered");
  return false;
}

PyObject* CallHandle_complete(PyObject* self, PyObject* arg) {
  auto* h = reinterpret_cast<CallHandle*>(self);
  if (!CheckPending(h)) return nullptr;
  PyObject* seq = PySequence_Fast(arg, "complete() takes a sequence of arrays");
  if (!seq) return nullptr;
  std::vector<ResultSpec>& specs = h->slot->results;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n != static_cast<Py_ssize_t>(specs.size())) {
    PyErr_Format(PyExc_ValueError, "hostcb: the call expects %zd results, got %zd",
                 static_cast<Py_ssize_t>(specs.size()), n);
    Py_DECREF(seq);
    return nullptr;
  }
  // Check everything before writing anything.
  std::vector<PyArrayObject*> arrays;
  uint64_t total = 0;
  bool ok = true;
  for (Py_ssize_t i = 0; i < n && ok; ++i) {
    const ResultSpec& s = specs[i];
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    PyArray_Descr* want = g_descr[s.dtype];
    if (!PyArray_Check(item) || want == nullptr ||
        !PyArray_EquivTypes(PyArray_DESCR(reinterpret_cast<PyArrayObject*>(item)), want)) {
      PyErr_Format(PyExc_ValueError,
                   "hostcb: result %zd must be a NumPy array of dtype %R", i,
                   want ? reinterpret_cast<PyObject*>(want) : Py_None);
      ok = false;
      break;
    }
    auto* a = reinterpret_cast<PyArrayObject*>(item);
    bool shape_ok = PyArray_NDIM(a) == static_cast<int>(s.dims.size());
    for (int d = 0; shape_ok && d < PyArray_NDIM(a); ++d) {
      shape_ok = PyArray_DIM(a, d) == s.dims[d];
    }
    if (!shape_ok) {
      PyErr_Format(PyExc_ValueError, "hostcb: result %zd has the wrong shape", i);
      ok = false;
      break;
    }
    PyArrayObject* c = PyArray_GETCONTIGUOUS(a);  // new reference
    if (!c) { ok = false; break; }
    arrays.push_back(c);
    total += s.nbytes;
  }
  Py_DECREF(seq);
  if (ok) {
    auto copy = [&] {
      for (size_t i = 0; i < arrays.size(); ++i) {
        if (specs[i].nbytes) {
          std::memcpy(specs[i].data, PyArray_DATA(arrays[i]), specs[i].nbytes);
        }
      }
    };
    if (total >= kCopyWithoutGil) {
      Py_BEGIN_ALLOW_THREADS
      copy();
      Py_END_ALLOW_THREADS
    } else {
      copy();
    }
  }
  for (PyArrayObject* a : arrays) Py_DECREF(a);
  if (!ok) return nullptr;
  CallSlot* slot = h->slot;
  h->slot = nullptr;
  FinishSlot(slot, false, "");
  Py_RETURN_NONE;
}

PyObject* CallHandle_fail(PyObject* self, PyObject* arg) {
  auto* h = reinterpret_cast<CallHandle*>(self);
  if (!CheckPending(h)) return nullptr;
  PyObject* text = PyObject_Str(arg);
  if (!text) return nullptr;
  const char* utf8 = PyUnicode_AsUTF8(text);
  std::string message = utf8 ? utf8 : "hostcb: call failed";
  Py_DECREF(text);
  if (!utf8) PyErr_Clear();
  CallSlot* slot = h->slot;
  h->slot = nullptr;
  FinishSlot(slot, true, std::move(message));
  Py_RETURN_NONE;
}

PyObject* CallHandle_result_specs(PyObject* self, void*) {
  auto* h = reinterpret_cast<CallHandle*>(self);
  if (!CheckPending(h)) return nullptr;
  const auto& specs = h->slot->results;
  PyObject* out = PyTuple_New(specs.size());
  if (!out) return nullptr;
  for (size_t i = 0; i < specs.size(); ++i) {
    PyObject* shape = PyTuple_New(specs[i].dims.size());
    if (!shape) { Py_DECREF(out); return nullptr; }
    for (size_t d = 0; d < specs[i].dims.size(); ++d) {
      PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(specs[i].dims[d]));
    }
    PyObject* dt = g_descr[specs[i].dtype]
                       ? reinterpret_cast<PyObject*>(g_descr[specs[i].dtype])
                       : Py_None;
    PyTuple_SET_ITEM(out, i, Py_BuildValue("(ON)", dt, shape));
  }
  return out;
}

PyMethodDef CallHandle_methods[] = {
    {"complete", CallHandle_complete, METH_O,
     "complete(results): copies the arrays (exact dtypes and shapes) into "
     "the call's outputs and lets the device go on."},
    {"fail", CallHandle_fail, METH_O,
     "fail(message): the call's computation fails with this message."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef CallHandle_getset[] = {
    {"result_specs", CallHandle_result_specs, nullptr,
     "((dtype, shape), ...) the call expects", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject CallHandleType = {PyVarObject_HEAD_INIT(nullptr, 0)};

void InitCallHandleType() {
  CallHandleType.tp_name = "hostcb._native._engine.CallHandle";
  CallHandleType.tp_basicsize = sizeof(CallHandle);
  CallHandleType.tp_flags = Py_TPFLAGS_DEFAULT;
  CallHandleType.tp_doc = "A pending call, answered once by the consumer.";
  CallHandleType.tp_dealloc = CallHandle_dealloc;
  CallHandleType.tp_methods = CallHandle_methods;
  CallHandleType.tp_getset = CallHandle_getset;
}

// ------------------------------------------------------------ functions
Queue* QueueArg(long device) {
  Queue* q = GetQueue(static_cast<int32_t>(device));
  if (!q) PyErr_Format(PyExc_ValueError, "hostcb: bad device ordinal %ld", device);
  return q;
}

PyObject* Py_handlers(PyObject*, PyObject*) {
  return Py_BuildValue(
      "{s:N,s:N,s:N}",
      "hostcb_tap", PyCapsule_New(reinterpret_cast<void*>(&HostcbTap), nullptr, nullptr),
      "hostcb_call", PyCapsule_New(reinterpret_cast<void*>(&HostcbCall), nullptr, nullptr),
      "hostcb_noop", PyCapsule_New(reinterpret_cast<void*>(&HostcbNoop), nullptr, nullptr));
}

PyObject* Py_set_dtypes(PyObject*, PyObject* mapping) {
  if (!PyDict_Check(mapping)) {
    PyErr_SetString(PyExc_TypeError, "set_dtypes takes {xla_code: numpy dtype}");
    return nullptr;
  }
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(mapping, &pos, &key, &value)) {
    long code = PyLong_AsLong(key);
    if (code < 0 || code >= kMaxDtype) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad dtype code");
      return nullptr;
    }
    PyArray_Descr* d = nullptr;
    if (!PyArray_DescrConverter(value, &d)) return nullptr;  // new reference
    Py_XDECREF(g_descr[code]);
    g_descr[code] = d;
    g_dtype_supported[code].store(true);
  }
  Py_RETURN_NONE;
}

// Builds the Python tuple of one record: (target_id, arrays, handle) for a
// tap or call (handle None for a tap), (None, marker_id, None) for a marker.
// Appends the byte copies to do to `copies`.
struct Copy { void* dst; const void* src; uint64_t n; };

PyObject* BuildRecord(const Record& r, std::vector<Copy>* copies) {
  if (r.kind == kMarker) {
    return Py_BuildValue("(OLO)", Py_None, static_cast<long long>(r.target_id),
                         Py_None);
  }
  // A record whose payload could not be allocated has no operands and
  // target_id -1 (see Enqueue): it comes out as (-1, (), None).
  auto* descs = reinterpret_cast<const OperandDesc*>(r.data);
  auto* dims = reinterpret_cast<const int64_t*>(r.data +
                                                r.num_operands * sizeof(OperandDesc));
  PyObject* arrays = PyTuple_New(r.num_operands);
  if (!arrays) return nullptr;
  for (uint16_t i = 0; i < r.num_operands; ++i) {
    const OperandDesc& d = descs[i];
    PyArray_Descr* descr = g_descr[d.dtype];
    npy_intp shape[NPY_MAXDIMS];
    if (d.rank > NPY_MAXDIMS || descr == nullptr) {
      PyErr_SetString(PyExc_ValueError, "hostcb: unsupported operand");
      Py_DECREF(arrays);
      return nullptr;
    }
    for (int k = 0; k < d.rank; ++k) shape[k] = dims[k];
    dims += d.rank;
    Py_INCREF(descr);  // PyArray_NewFromDescr steals it
    PyObject* a = PyArray_NewFromDescr(&PyArray_Type, descr, d.rank, shape,
                                       nullptr, nullptr, 0, nullptr);
    if (!a) { Py_DECREF(arrays); return nullptr; }
    if (d.nbytes) {
      copies->push_back(Copy{PyArray_DATA(reinterpret_cast<PyArrayObject*>(a)),
                             r.data + d.offset, d.nbytes});
    }
    PyTuple_SET_ITEM(arrays, i, a);
  }
  PyObject* tid = PyLong_FromLongLong(r.target_id);
  if (!tid) { Py_DECREF(arrays); return nullptr; }
  PyObject* t = PyTuple_New(3);
  if (!t) { Py_DECREF(tid); Py_DECREF(arrays); return nullptr; }
  PyTuple_SET_ITEM(t, 0, tid);
  PyTuple_SET_ITEM(t, 1, arrays);
  // The handle comes last: once it exists it alone answers the call (its
  // dealloc fails an unanswered call), so nothing may fail after it.
  if (r.kind == kCall) {
    auto* h = PyObject_New(CallHandle, &CallHandleType);
    if (!h) { Py_DECREF(t); return nullptr; }
    h->slot = r.call;
    h->device = r.device;
    PyTuple_SET_ITEM(t, 2, reinterpret_cast<PyObject*>(h));
  } else {
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(t, 2, Py_None);
  }
  return t;
}

PyObject* Py_take_batch(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"device", "max_records", "timeout", "max_bytes",
                             "poll", nullptr};
  long device;
  Py_ssize_t max_records = 4096;
  PyObject* timeout_obj = Py_None;
  unsigned long long max_bytes = 0;
  double poll = 0.05;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "l|nOKd",
                                   const_cast<char**>(kw), &device,
                                   &max_records, &timeout_obj, &max_bytes,
                                   &poll)) {
    return nullptr;
  }
  double timeout = -1;
  if (timeout_obj != Py_None) {
    timeout = PyFloat_AsDouble(timeout_obj);
    if (timeout == -1 && PyErr_Occurred()) return nullptr;
    if (timeout < 0) timeout = 0;
  }
  Queue* q = QueueArg(device);
  if (!q) return nullptr;
  tl_consumer_queue = q;
  if (max_bytes == 0) max_bytes = q->GetCounters().capacity;
  if (max_records < 1) max_records = 1;
  std::vector<Record> records;
  Queue::Take got;
  Py_BEGIN_ALLOW_THREADS
  got = q->TakeReady(&records, static_cast<size_t>(max_records), max_bytes,
                     timeout, poll);
  Py_END_ALLOW_THREADS
  switch (got) {
    case Queue::Take::kTimeout: return PyList_New(0);
    case Queue::Take::kBusy:
      PyErr_SetString(PyExc_RuntimeError,
                      "hostcb: another thread is consuming this device's queue");
      return nullptr;
    case Queue::Take::kRecords: break;
  }
  std::vector<Copy> copies;
  PyObject* out = PyList_New(records.size());
  size_t built = 0;
  if (out) {
    for (; built < records.size(); ++built) {
      PyObject* t = BuildRecord(records[built], &copies);
      if (!t) break;
      PyList_SET_ITEM(out, built, t);
    }
  }
  if (!out || built < records.size()) {
    // Cannot hand the batch out (out of memory): fail the calls not yet
    // owned by a handle so that no device waits forever, then raise.
    for (size_t i = built; i < records.size(); ++i) {
      if (records[i].kind == kCall) {
        FinishSlot(records[i].call, true,
                   "hostcb: the host could not take this call's operands");
      }
    }
    Py_XDECREF(out);  // handles of built calls fail in their dealloc
    q->Release(records.size());
    return nullptr;
  }
  uint64_t total = 0;
  for (const Copy& c : copies) total += c.n;
  if (total >= kCopyWithoutGil) {
    Py_BEGIN_ALLOW_THREADS
    for (const Copy& c : copies) std::memcpy(c.dst, c.src, c.n);
    Py_END_ALLOW_THREADS
  } else {
    for (const Copy& c : copies) std::memcpy(c.dst, c.src, c.n);
  }
  q->Release(records.size());
  return out;
}

PyObject* Py_put_marker(PyObject*, PyObject* args) {
  long device;
  long long marker;
  if (!PyArg_ParseTuple(args, "lL", &device, &marker)) return nullptr;
  Queue* q = QueueArg(device);
  if (!q) return nullptr;
  std::unique_lock<std::mutex> lock;
  Queue::Reservation r = q->Reserve(lock, kMarker, marker, 0, 0,
                                    /*never_wait=*/true);
  q->CommitLocked(r, /*urgent=*/true);
  Py_RETURN_NONE;
}

PyObject* Py_set_capacity(PyObject*, PyObject* arg) {
  unsigned long long n = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  if (n < 4096) {
    PyErr_SetString(PyExc_ValueError, "hostcb: capacity must be >= 4096 bytes");
    return nullptr;
  }
  SetCapacityAll(n);
  Py_RETURN_NONE;
}

PyObject* Py_set_consumer_dispatching(PyObject*, PyObject* args) {
  long device;
  int flag;
  if (!PyArg_ParseTuple(args, "lp", &device, &flag)) return nullptr;
  Queue* q = QueueArg(device);
  if (!q) return nullptr;
  q->SetConsumerDispatching(flag != 0);
  Py_RETURN_NONE;
}

PyObject* Py_counters(PyObject*, PyObject* args) {
  long device;
  if (!PyArg_ParseTuple(args, "l", &device)) return nullptr;
  Queue* q = QueueArg(device);
  if (!q) return nullptr;
  Queue::Counters c = q->GetCounters();
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K}", "records_in",
                       (unsigned long long)c.records_in, "records_out",
                       (unsigned long long)c.records_out, "bytes_held",
                       (unsigned long long)c.bytes_held, "records_held",
                       (unsigned long long)c.records_held, "capacity",
                       (unsigned long long)c.capacity, "space_waiters",
                       (unsigned long long)c.space_waiters);
}

PyObject* Py_after_fork_in_child(PyObject*, PyObject*) {
  ResetAfterFork();
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"handlers", Py_handlers, METH_NOARGS,
     "{name: PyCapsule} of the XLA FFI handlers, for register_ffi_target."},
    {"set_dtypes", Py_set_dtypes, METH_O,
     "set_dtypes({xla_ffi_dtype_code: numpy dtype}): the dtypes that taps "
     "may carry."},
    {"take_batch", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(Py_take_batch)),
     METH_VARARGS | METH_KEYWORDS,
     "take_batch(device, max_records=4096, timeout=None, max_bytes=0, "
     "poll=0.05) -> list.\n\nWaits (GIL released) up to timeout "
     "seconds (None: forever) for ready records of the device's queue, "
     "polling for `poll` seconds before sleeping; returns them in order as "
     "(target_id, (arrays...), CallHandle | None) or (None, marker_id, None); "
     "[] on timeout.  One copy of each operand "
     "into arrays Python owns."},
    {"put_marker", Py_put_marker, METH_VARARGS,
     "put_marker(device, marker_id): queues a marker after every record "
     "queued before it; never waits."},
    {"set_capacity", Py_set_capacity, METH_O,
     "set_capacity(bytes): the byte bound of every queue (applied to a "
     "non-empty queue when it next empties)."},
    {"set_consumer_dispatching", Py_set_consumer_dispatching, METH_VARARGS,
     "set_consumer_dispatching(device, flag): while set, producers of the "
     "device's queue never wait for space (its consumer dispatches a "
     "computation and may wait for it)."},
    {"counters", Py_counters, METH_VARARGS,
     "counters(device) -> {records_in, records_out, bytes_held, records_held, "
     "capacity, space_waiters}."},
    {"after_fork_in_child", Py_after_fork_in_child, METH_NOARGS,
     "Forgets every queue (for os.register_at_fork)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_engine",
                       "hostcb's native tap engine (see engine.py).", -1,
                       kMethods};

}  // namespace
}  // namespace hostcb

PyMODINIT_FUNC PyInit__engine(void) {
  import_array();
  hostcb::InitCallHandleType();
  if (PyType_Ready(&hostcb::CallHandleType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&hostcb::kModule);
  if (!m) return nullptr;
  Py_INCREF(&hostcb::CallHandleType);
  if (PyModule_AddObject(m, "CallHandle",
                         reinterpret_cast<PyObject*>(&hostcb::CallHandleType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  PyModule_AddIntConstant(m, "MAX_DEVICES", hostcb::kMaxDevices);
  return m;
}
