// hostcb native tap engine: the CPython module hostcb._native._engine.
//
// The host side of the queues in queue.h: consumers take batches of records
// out as NumPy arrays, barriers put markers; set_call_server gives call.cc
// its Python functions.  Plain CPython C API and NumPy C API.
//
// Copy semantics: run_batch makes ONE copy of each operand, out of the
// ring into a fresh NumPy array that Python owns (callbacks may keep it);
// the ring bytes are freed as soon as the batch is copied.  A record with
// its own block (queue.h: own blocks; large CPU taps) is not copied at
// all: its arrays view the block, which they keep alive through their
// base (a capsule that frees it when the last of them goes), and the
// queue forgets it.  Either way a tap function gets arrays of its own,
// whose values nothing changes after it returns.  Memory is thus bounded
// by the ring capacity plus one batch (run_batch's max_bytes, default
// the capacity), plus what tap functions keep: within 2x the queue size.
#define HOSTCB_IMPORTS_NUMPY
#include "pyarrays.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#include "entries.h"

namespace hostcb {

PyArray_Descr* g_descr[kMaxDtype];
PyTypeObject* g_entry_types[kEntryKinds] = {};
// call.cc
extern PyObject* g_call_runners;
extern PyObject* g_call_checker;
extern PyObject* g_call_formatter;
// A tuple of the call runners that this thread is running, innermost
// first (GIL held).
PyObject* RunningCallRunners();

// named.cc: Python's resolver of host functions by name (GIL held).
void SetNameResolver(PyObject* resolver);
// print_line.cc: the text of a debug.print line of one 0-d number (a new
// reference), or nullptr: with a Python error on failure, else for a value
// that Python formats (GIL held).
PyObject* PrintLineText(PyObject* pieces, PyObject* array);
// print_line.cc: the same line for an operand of a record: XLA dtype code,
// rank and bytes; nullptr without an error where Python formats it.
PyObject* PrintLineOfOperand(PyObject* pieces, int32_t dtype, int32_t rank,
                             const void* data);
// print_line.cc: the line of an operand of any rank whose text is
// numpy.array2string's (array_text.cc; flags: ArrayTextFlags), or nullptr
// (no exception) where NumPy formats it.
PyObject* ArrayLineOfOperand(PyObject* pieces, int32_t dtype, int32_t rank,
                             const int64_t* dims, const void* data, long flags,
                             long long threshold);
// array_text.cc: array_text(array, flags, threshold) -> the text of
// numpy.array2string(array) under NumPy's default options, or None.
PyObject* ArrayTextOf(PyObject* array, int flags, int64_t threshold);
// print_line.cc: whether those make lines (false where the C++ library has
// no shortest floating-point std::to_chars: they then return nullptr).
extern const bool kFormatsPrintLines;
// cuda_py.cc: adds the GPU back end's functions to the module.
int AddCudaFunctions(PyObject* module);
#ifdef HOSTCB_TEST_BUILD
// tests/native/engine_testing.cc: adds the test build's functions.
int AddTestFunctions(PyObject* module);
#endif
// exit_guard.cc: threads that Python ends at shutdown do not abort.
int InstallExitGuard();
bool UninstallExitGuard();
void ExitGuardAfterForkInChild();

namespace {

// Copies of this many bytes or more in one batch run without the GIL.
constexpr uint64_t kCopyWithoutGil = 1 << 20;
// How long the consumer leaves the GIL to others when the device pauses
// (run_batch): longer than a sleeping thread takes to wake up.
constexpr std::chrono::microseconds kLetTheDeviceThreadIn{50};

// ------------------------------------------------------------ functions
Queue* QueueArg(long device) {
  Queue* q = GetQueue(static_cast<int32_t>(device));
  if (!q)
    PyErr_Format(PyExc_ValueError, "hostcb: bad device ordinal %ld", device);
  return q;
}

PyObject* Py_handlers(PyObject*, PyObject*) {
  return Py_BuildValue(
      "{s:N,s:N,s:N,s:N,s:N,s:N}", "hostcb_tap",
      PyCapsule_New(reinterpret_cast<void*>(&HostcbTap), nullptr, nullptr),
      "hostcb_tap_v1",
      PyCapsule_New(reinterpret_cast<void*>(&HostcbTapV1), nullptr, nullptr),
      "hostcb_call_v1",
      PyCapsule_New(reinterpret_cast<void*>(&HostcbCallV1), nullptr, nullptr),
      "hostcb_call",
      PyCapsule_New(reinterpret_cast<void*>(&HostcbCall), nullptr, nullptr),
      "hostcb_call_one",
      PyCapsule_New(reinterpret_cast<void*>(&HostcbCallOne), nullptr, nullptr),
      "hostcb_noop",
      PyCapsule_New(reinterpret_cast<void*>(&HostcbNoop), nullptr, nullptr));
}

PyObject* Py_set_dtypes(PyObject*, PyObject* mapping) {
  if (!PyDict_Check(mapping)) {
    PyErr_SetString(PyExc_TypeError,
                    "set_dtypes takes {xla_code: numpy dtype}");
    return nullptr;
  }
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(mapping, &pos, &key, &value)) {
    long code = PyLong_AsLong(key);
    if (code < 0 || code >= kMaxDtype) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "bad dtype code");
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

// One record of a batch, built: a tap's arrays (a new reference) or a
// marker (arrays nullptr).
struct Copy {
  void* dst;
  const void* src;
  uint64_t n;
};
struct Built {
  RecordKind kind;
  int64_t target_id;
  PyObject* arrays;  // nullptr for a marker, a lost tap or a line
  // A debug.print line made from the record (its entry (write_lines,
  // pieces, ...) formats its value in C) and that entry's write_lines
  // (new references), else nullptr.
  PyObject* line = nullptr;
  PyObject* writer = nullptr;
};

#ifdef HOSTCB_TEST_BUILD
// Fault injection (the test build): the next this many array allocations
// of run_batch fail as if out of memory (FailNextAllocations).
long g_failing_allocations = 0;
#endif

constexpr const char* kBlockName = "hostcb.record_block";

void FreeBlock(PyObject* capsule) {
  std::free(PyCapsule_GetPointer(capsule, kBlockName));
}

// The tuple of read-only arrays of a tap record; appends the byte copies
// to do to `copies`, or, for a record with its own block, sets *adopted and
// views the block instead (see the copy semantics above).  A record whose
// payload could not be allocated has no operands and target_id -1 (see
// Enqueue): its tuple is empty.
//
// The arrays over an own block have as base a writeable uint8 array over
// the whole block (whose own base is the capsule that frees it), as the
// slab's arrays have theirs (pyarrays.h, SlabSlot): so that an array can be
// made writeable again, as legacy's could.  Only the record's arrays view
// the block, each its own bytes.
PyObject* BuildArrays(const Record& r, std::vector<Copy>* copies,
                      uint8_t* adopted) {
  auto* descs = reinterpret_cast<const OperandDesc*>(r.data);
  auto* dims = reinterpret_cast<const int64_t*>(
      r.data + r.num_operands * sizeof(OperandDesc));
#ifdef HOSTCB_TEST_BUILD
  if (g_failing_allocations > 0) {
    --g_failing_allocations;
    return PyErr_NoMemory();
  }
#endif
  // The block's capsule, without a destructor until every array holds the
  // owner: on a failure before that, the queue still frees the block.
  PyObject* capsule = nullptr;  // borrowed from `owner` once it holds it
  PyObject* owner = nullptr;    // the uint8 array over the block
  if (r.external_bytes && r.data && r.num_operands) {
    capsule = PyCapsule_New(r.data, kBlockName, nullptr);
    if (!capsule) return nullptr;
    npy_intp size = static_cast<npy_intp>(r.external_bytes);
    owner = PyArray_New(&PyArray_Type, 1, &size, NPY_UINT8, nullptr, r.data, 0,
                        NPY_ARRAY_CARRAY, nullptr);
    if (!owner) {
      Py_DECREF(capsule);
      return nullptr;
    }
    if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(owner),
                              capsule) < 0) {  // steals capsule, even then
      Py_DECREF(owner);
      return nullptr;
    }
  }
  PyObject* arrays = PyTuple_New(r.num_operands);
  if (!arrays) {
    Py_XDECREF(owner);
    return nullptr;
  }
  for (uint16_t i = 0; i < r.num_operands; ++i) {
    const OperandDesc& d = descs[i];
    PyObject* a =
        NewArray(d.dtype, d.rank, dims, owner ? r.data + d.offset : nullptr);
    dims += d.rank;
    if (a && owner) {
      Py_INCREF(owner);
      // Stays `owner` (NumPy stops collapsing a chain of bases at an
      // object that is not an array, here the capsule).
      if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(a),
                                owner) < 0) {  // steals owner, even then
        Py_CLEAR(a);
      }
    }
    if (!a) {
      Py_DECREF(arrays);
      Py_XDECREF(owner);
      return nullptr;
    }
    // Read-only, as legacy's tap arrays and those of XLA's Python callbacks
    // (the fallback): copied bytes are written through the pointer below.
    PyArray_CLEARFLAGS(reinterpret_cast<PyArrayObject*>(a),
                       NPY_ARRAY_WRITEABLE);
    if (!owner && d.nbytes) {
      copies->push_back(Copy{PyArray_DATA(reinterpret_cast<PyArrayObject*>(a)),
                             r.data + d.offset, d.nbytes});
    }
    PyTuple_SET_ITEM(arrays, i, a);
  }
  if (owner) {
    // Cannot fail: `capsule` is a valid capsule, which `owner` holds.
    PyCapsule_SetDestructor(capsule, FreeBlock);
    Py_DECREF(owner);  // the arrays hold it
    *adopted = 1;
  }
  return arrays;
}

// The consumer's Python hooks (set_consumer_hooks; strong references).
PyObject* g_on_marker = nullptr;             // on_marker(marker_id)
PyObject* g_on_failure = nullptr;            // on_failure(target_id, exc)
PyObject* g_on_dispatch_finished = nullptr;  // dispatch_finished()
// on_quiet(target_id, may_wait): see lifetimes.cc
PyObject* g_on_quiet = nullptr;

// Calls hook(args...) and drops its result; an exception of the hook
// itself cannot be reported to anyone but the interpreter's unraisable
// hook.
void CallHook(PyObject* hook, PyObject* const* argv, size_t n) {
  if (hook == nullptr) return;
  Py_INCREF(hook);  // set_consumer_hooks may replace it meanwhile
  PyObject* r = PyObject_Vectorcall(hook, argv, n, nullptr);
  if (r == nullptr) PyErr_WriteUnraisable(hook);
  Py_XDECREF(r);
  Py_DECREF(hook);
}

// Calls on_failure(target_id, the exception set or None) for a tap whose
// function failed or is missing (see run_batch), the exception taken.
void ReportFailure(int64_t target_id, PyObject* functions) {
  PyObject* exc = PyErr_Occurred() ? TakeException() : nullptr;
  if (PyObject* tid = PyLong_FromLongLong(static_cast<long long>(target_id))) {
    PyObject* argv[2] = {tid, exc != nullptr ? exc : Py_None};
    CallHook(g_on_failure, argv, 2);
    Py_DECREF(tid);
  } else {
    PyErr_WriteUnraisable(functions);
  }
  Py_XDECREF(exc);
}

// Runs the tap function of one built record (see run_batch), by its
// entry's kind (entries.h).
void RunTap(const Built& b, PyObject* functions, PyObject* device_obj) {
  PyObject* entry = b.arrays == nullptr  // a lost tap
                        ? nullptr
                        : TableEntry(functions, b.target_id);
  PyObject* result = nullptr;
  if (entry != nullptr) {
    Py_INCREF(entry);  // the registry may change while it runs
    if (IsKind(entry, kPrintLineTap)) {
      // A line that run_batch did not make (BuildLine: a value that C does
      // not format): its fallback ArrayTap formats it in Python.
      PyObject* fallback = PyTuple_GET_ITEM(entry, print_line_tap::kFallback);
      Py_INCREF(fallback);
      Py_SETREF(entry, fallback);
    }
    if (IsKind(entry, kArrayTap) && PyTuple_GET_SIZE(b.arrays) >= 1) {
      PyObject* argv[2] = {PyTuple_GET_ITEM(b.arrays, 0),
                           PyTuple_GET_ITEM(entry, array_tap::kSecond)};
      result = PyObject_Vectorcall(PyTuple_GET_ITEM(entry, array_tap::kFunc),
                                   argv, 2, nullptr);
    } else if (IsKind(entry, kArraysTap)) {
      PyObject* argv[2] = {b.arrays, device_obj};
      result = PyObject_Vectorcall(PyTuple_GET_ITEM(entry, arrays_tap::kRun),
                                   argv, 2, nullptr);
    } else {
      PyErr_Format(PyExc_TypeError,
                   "hostcb: the tap entry of target id %lld is of no kind "
                   "that the engine runs (hostcb._engine.entries): %R",
                   static_cast<long long>(b.target_id), entry);
    }
    Py_DECREF(entry);
  }
  if (result != nullptr) {
    Py_DECREF(result);
    return;
  }
  // No such function (a lost tap has id -1), or it raised.
  ReportFailure(b.target_id, functions);
}

// What BuildBatch knows of NumPy's print options while it builds a batch's
// lines (an entry's array_text: its check, called once per batch).
struct LineOptions {
  PyObject* check = nullptr;  // the check called last (borrowed), and
  long flags = 0;             // what it answered
  // A tap function that is not a print's ran before in the batch: it may
  // have changed this thread's print options, so later lines that depend
  // on them are left to Python.
  bool user_code = false;
};

// The flags of ArrayTextFlags (array_text.cc) that `array_text` (an
// entry's (check, threshold, numbers)) allows now, or 0: NumPy formats.
long ArrayTextFlags(PyObject* array_text, LineOptions* o) {
  if (o->user_code) return 0;
  PyObject* check = PyTuple_GET_ITEM(array_text, 0);
  if (check != o->check) {
    PyObject* r = PyObject_CallNoArgs(check);
    o->flags = r == nullptr ? 0 : PyLong_AsLong(r);
    Py_XDECREF(r);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      o->flags = 0;
    }
    o->check = check;
  }
  return o->flags;
}

// The line of tap record `r` where its entry is a PrintLineTap that
// formats the record's one operand in C: `b` gets the line and the writer.
// False for any other record, and where C does not format the value or
// could not make the line (out of memory): RunTap then runs the entry's
// fallback, which formats it in Python (and reports a failure as any tap
// function's).
bool BuildLine(const Record& r, PyObject* functions, Built* b,
               LineOptions* options) {
  if (r.num_operands != 1) return false;
  PyObject* entry = TableEntry(functions, r.target_id);
  if (entry == nullptr || !IsKind(entry, kPrintLineTap)) return false;
  const auto& d = *reinterpret_cast<const OperandDesc*>(r.data);
  PyObject* pieces = PyTuple_GET_ITEM(entry, print_line_tap::kPieces);
  PyObject* array_text = PyTuple_GET_ITEM(entry, print_line_tap::kArrayText);
  PyObject* line = nullptr;
  if (array_text == Py_None ||
      (d.rank == 0 && PyObject_IsTrue(PyTuple_GET_ITEM(array_text, 2)))) {
    line = PrintLineOfOperand(pieces, d.dtype, d.rank, r.data + d.offset);
  } else if (const long flags = ArrayTextFlags(array_text, options)) {
    const auto* dims =
        reinterpret_cast<const int64_t*>(r.data + sizeof(OperandDesc));
    line = ArrayLineOfOperand(
        pieces, d.dtype, d.rank, dims, r.data + d.offset, flags,
        PyLong_AsLongLong(PyTuple_GET_ITEM(array_text, 1)));
  }
  if (line == nullptr) {
    PyErr_Clear();  // Python formats it (RunTap), or reports its failure
    return false;
  }
  b->line = line;
  b->writer = PyTuple_GET_ITEM(entry, print_line_tap::kWriteLines);
  Py_INCREF(b->writer);
  return true;
}

// Runs the lines built[first, last), which share a writer:
// write_lines([line, ...]) (the entries' Python writer catches what the
// stream raises; whatever it lets through is reported as RunTap reports a
// tap function's failure, for the first line).
void WriteLines(std::vector<Built>& built, size_t first, size_t last,
                PyObject* functions) {
  PyObject* writer = built[first].writer;
  PyObject* lines = PyList_New(static_cast<Py_ssize_t>(last - first));
  PyObject* result = nullptr;
  if (lines != nullptr) {
    for (size_t i = first; i < last; ++i) {
      PyList_SET_ITEM(lines, static_cast<Py_ssize_t>(i - first),
                      built[i].line);  // steals it
      built[i].line = nullptr;
    }
    result = PyObject_Vectorcall(writer, &lines, 1, nullptr);
    Py_DECREF(lines);
  }
  for (size_t i = first; i < last; ++i) {
    Py_CLEAR(built[i].line);  // where the list could not be made
    Py_CLEAR(built[i].writer);
  }
  if (result != nullptr) {
    Py_DECREF(result);
    return;
  }
  ReportFailure(built[first].target_id, functions);
}

// Logs once, on the "hostcb" logger, that hostcb_tap ran a call frame
// through XLA FFI's binding (handlers.cc: NoteTapFallback), with the reason
// (the GIL held).  One relaxed load per batch until then.
void ReportTapFallbackOnce() {
  static std::atomic<bool> reported{false};
  if (g_tap_fallbacks.load(std::memory_order_relaxed) == 0 ||
      reported.load(std::memory_order_relaxed)) {
    return;
  }
  const char* why = g_tap_fallback_reason.load(std::memory_order_acquire);
  if (why == nullptr || reported.exchange(true)) return;
  PyObject* logging = PyImport_ImportModule("logging");
  PyObject* logger =
      logging ? PyObject_CallMethod(logging, "getLogger", "s", "hostcb")
              : nullptr;
  PyObject* done =
      logger ? PyObject_CallMethod(
                   logger, "warning", "ss",
                   "hostcb: the tap handler could not decode a call frame "
                   "itself (%s) and took XLA FFI's generic decoding: such "
                   "taps still arrive, in order, at a higher device time "
                   "per tap (counted by hostcb.engine.tap_fallbacks())",
                   why)
             : nullptr;
  if (done == nullptr) PyErr_WriteUnraisable(Py_None);
  Py_XDECREF(done);
  Py_XDECREF(logger);
  Py_XDECREF(logging);
}

PyObject* Py_tap_fallbacks(PyObject*, PyObject*) {
  const char* why = g_tap_fallback_reason.load(std::memory_order_acquire);
  return Py_BuildValue(
      "(Ks)", static_cast<unsigned long long>(g_tap_fallbacks.load()), why);
}

// run_batch's first step: takes the device's next batch of records, the
// GIL released while it waits.
Queue::Take TakeBatch(Queue* q, std::vector<Record>* records,
                      size_t max_records, uint64_t max_bytes, double timeout,
                      double poll) {
  Queue::Take got;
  Py_BEGIN_ALLOW_THREADS got =
      q->TakeReady(records, max_records, max_bytes, timeout, poll);
  if (got == Queue::Take::kRecords && q->WentQuiet()) {
    // The device stopped tapping while this thread ran tap functions, with
    // the GIL: the thread that ran its computation may now wait for the
    // GIL, to return to Python.  Releasing the GIL for this take woke it,
    // but this thread would take the GIL back before it runs, and it would
    // get it only at CPython's switch interval (5 ms) or once the backlog
    // of tap functions has run: about 1 ms per call of a 20,000-step
    // tapped scan here (bench_tap_sched.py's "per call").  A short sleep,
    // once per pause of the device, lets it have the GIL.
    std::this_thread::sleep_for(kLetTheDeviceThreadIn);
  }
  Py_END_ALLOW_THREADS return got;
}

// run_batch's second step: builds every array and line of the batch,
// copies the bytes, and frees the ring.
std::vector<Built> BuildBatch(Queue* q, const std::vector<Record>& records,
                              PyObject* functions) {
  std::vector<Copy> copies;
  std::vector<Built> built;
  std::vector<uint8_t> adopted(records.size(), 0);
  LineOptions options;
  built.reserve(records.size());
  for (const Record& r : records) {
    if (r.kind != kTap) {  // a barrier's marker, or a retire marker
      built.push_back(Built{r.kind, r.target_id, nullptr});
      continue;
    }
    Built line{r.kind, r.target_id, nullptr};
    if (BuildLine(r, functions, &line, &options)) {
      built.push_back(line);
      continue;
    }
    if (!options.user_code) {
      PyObject* entry = TableEntry(functions, r.target_id);
      options.user_code = entry == nullptr || !IsKind(entry, kPrintLineTap);
    }
    const size_t copies_before = copies.size();
    PyObject* arrays = BuildArrays(r, &copies, &adopted[built.size()]);
    if (arrays == nullptr) {
      // Out of memory for this tap's arrays: the tap is lost, and reported
      // (target -1, see RunTap) at its place in the batch; the markers and
      // the other taps of the batch go on, and so does the consumer.
      PyErr_Clear();
      copies.resize(copies_before);
      built.push_back(Built{r.kind, -1, nullptr});
      continue;
    }
    built.push_back(Built{r.kind, r.target_id, arrays});
  }
  uint64_t total = 0;
  for (const Copy& c : copies) total += c.n;
  if (total >= kCopyWithoutGil) {
    Py_BEGIN_ALLOW_THREADS for (const Copy& c : copies)
        std::memcpy(c.dst, c.src, c.n);
    Py_END_ALLOW_THREADS
  } else {
    for (const Copy& c : copies) std::memcpy(c.dst, c.src, c.n);
  }
  q->Release(records.size(), adopted.data());
  return built;
}

// A record that is no tap: a barrier's marker, on_marker(id); a retire
// marker, on_quiet(id) once the last one of a retired id is passed
// (lifetimes.cc).
void PassMarker(const Built& b, PyObject* functions) {
  const bool marker = b.kind == kMarker;
  if (!marker && !MarkerPassed(b.target_id)) return;
  if (PyObject* id = PyLong_FromLongLong(static_cast<long long>(b.target_id))) {
    PyObject* argv[2] = {id, Py_True};  // on_quiet may wait for a lock
    CallHook(marker ? g_on_marker : g_on_quiet, argv, marker ? 1 : 2);
    Py_DECREF(id);
  } else {
    PyErr_WriteUnraisable(functions);
  }
}

// run_batch's last step: runs the built records in order.
void RunBuilt(Queue* q, std::vector<Built>& built, PyObject* functions,
              PyObject* device_obj) {
  for (size_t i = 0; i < built.size(); ++i) {
    Built& b = built[i];
    if (b.line != nullptr) {
      // The lines that follow with the same writer go in one call.
      size_t last = i + 1;
      while (last < built.size() && built[last].line != nullptr &&
             built[last].writer == b.writer) {
        ++last;
      }
      WriteLines(built, i, last, functions);
      q->NoteRan(last - i);
      i = last - 1;
      continue;
    }
    if (b.kind != kTap) {
      PassMarker(b, functions);
      q->NoteRan(1);
      continue;
    }
    RunTap(b, functions, device_obj);
    Py_CLEAR(b.arrays);
    q->NoteRan(1);
    // A tap function that dispatched computations has returned.
    if (q->ConsumerDispatching()) CallHook(g_on_dispatch_finished, nullptr, 0);
  }
}

PyObject* Py_run_batch(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"device",      "functions", "device_obj",
                             "max_records", "timeout",   "max_bytes",
                             "poll",        nullptr};
  long device;
  PyObject* functions;
  PyObject* device_obj;
  Py_ssize_t max_records = 256;
  PyObject* timeout_obj = Py_None;
  unsigned long long max_bytes = 0;
  double poll = 0.05;
  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "lO!O|nOKd", const_cast<char**>(kw), &device,
          &PyList_Type, &functions, &device_obj, &max_records, &timeout_obj,
          &max_bytes, &poll)) {
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
  // max_bytes 0: the queue's capacity (TakeReady reads it under the lock
  // that it takes anyway).
  if (max_records < 1) max_records = 1;
  std::vector<Record> records;
  switch (TakeBatch(q, &records, static_cast<size_t>(max_records), max_bytes,
                    timeout, poll)) {
    case Queue::Take::kTimeout:
      return PyLong_FromLong(0);
    case Queue::Take::kBusy:
      PyErr_SetString(
          PyExc_RuntimeError,
          "hostcb: another thread is consuming this device's queue");
      return nullptr;
    case Queue::Take::kRecords:
      break;
  }
  ReportTapFallbackOnce();
  std::vector<Built> built = BuildBatch(q, records, functions);
  RunBuilt(q, built, functions, device_obj);
  return PyLong_FromSize_t(built.size());
}

PyObject* Py_set_consumer_hooks(PyObject*, PyObject* args) {
  PyObject *on_marker, *on_failure, *dispatch_finished, *on_quiet;
  if (!PyArg_ParseTuple(args, "OOOO", &on_marker, &on_failure,
                        &dispatch_finished, &on_quiet)) {
    return nullptr;
  }
  if (!PyCallable_Check(on_marker) || !PyCallable_Check(on_failure) ||
      !PyCallable_Check(dispatch_finished) || !PyCallable_Check(on_quiet)) {
    PyErr_SetString(PyExc_TypeError, "set_consumer_hooks takes four callables");
    return nullptr;
  }
  Py_INCREF(on_quiet);
  Py_XSETREF(g_on_quiet, on_quiet);
  Py_INCREF(on_marker);
  Py_XSETREF(g_on_marker, on_marker);
  Py_INCREF(on_failure);
  Py_XSETREF(g_on_failure, on_failure);
  Py_INCREF(dispatch_finished);
  Py_XSETREF(g_on_dispatch_finished, dispatch_finished);
  Py_RETURN_NONE;
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

// The instantiate stage of the handlers of process-local ids, and the
// type of the state it keeps (lifetimes.cc), for Python to register.
PyObject* Py_lifetimes(PyObject*, PyObject*) {
  return Py_BuildValue(
      "{s:N,s:N,s:N}", "instantiate",
      PyCapsule_New(reinterpret_cast<void*>(&HostcbInstantiate), nullptr,
                    nullptr),
      "type_id", PyCapsule_New(LiveExecutableTypeId(), nullptr, nullptr),
      "type_info", PyCapsule_New(LiveExecutableTypeInfo(), nullptr, nullptr));
}

PyObject* Py_retire_target(PyObject*, PyObject* arg) {
  long long tid = PyLong_AsLongLong(arg);
  if (tid == -1 && PyErr_Occurred()) return nullptr;
  return PyBool_FromLong(RetireTarget(tid));
}

PyObject* Py_take_quiet(PyObject*, PyObject*) {
  std::vector<int64_t> quiet = TakeQuiet();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(quiet.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < quiet.size(); ++i) {
    PyObject* tid = PyLong_FromLongLong(static_cast<long long>(quiet[i]));
    if (tid == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), tid);
  }
  return list;
}

PyObject* Py_tracked_targets(PyObject*, PyObject*) {
  return PyLong_FromSize_t(TrackedTargets());
}

PyObject* Py_set_capacity(PyObject*, PyObject* arg) {
  unsigned long long n = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  if (n < 4096) {
    PyErr_SetString(PyExc_ValueError, "hostcb: capacity must be >= 4096 bytes");
    return nullptr;
  }
  // Without the GIL: a GPU ring unpinned here may make the driver wait for
  // work on its streams, which may include XLA's Python callbacks.
  Py_BEGIN_ALLOW_THREADS SetCapacityAll(n);
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
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
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "records_in",
                       (unsigned long long)c.records_in, "records_out",
                       (unsigned long long)c.records_out, "bytes_held",
                       (unsigned long long)c.bytes_held, "records_held",
                       (unsigned long long)c.records_held, "capacity",
                       (unsigned long long)c.capacity, "space_waiters",
                       (unsigned long long)c.space_waiters, "lock_sleeps",
                       (unsigned long long)c.lock_sleeps);
}

PyObject* Py_wait_for_earlier_records(PyObject*, PyObject* args) {
  long device;
  int awaited_only = 0;
  double timeout_s = -1;
  if (!PyArg_ParseTuple(args, "l|pd", &device, &awaited_only, &timeout_s)) {
    return nullptr;
  }
  Queue* q = QueueArg(device);
  if (!q) return nullptr;
  // Nothing pending (the common case): no release of the GIL.
  if (awaited_only && q->EarlierPrintsRun()) Py_RETURN_TRUE;
  bool ok = true;
  Py_BEGIN_ALLOW_THREADS if (awaited_only) {
    ok = q->WaitForEarlierPrints(timeout_s);
  }
  else {
    q->WaitForEarlierRecords();
  }
  Py_END_ALLOW_THREADS if (ok) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyObject* Py_set_call_server(PyObject*, PyObject* args) {
  PyObject *runners, *checker, *formatter;
  if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &runners, &checker,
                        &formatter)) {
    return nullptr;
  }
  if (!PyCallable_Check(checker) || !PyCallable_Check(formatter)) {
    PyErr_SetString(PyExc_TypeError,
                    "set_call_server takes a list and two callables");
    return nullptr;
  }
  Py_INCREF(runners);
  Py_XSETREF(g_call_runners, runners);
  Py_INCREF(checker);
  Py_XSETREF(g_call_checker, checker);
  Py_INCREF(formatter);
  Py_XSETREF(g_call_formatter, formatter);
  Py_RETURN_NONE;
}

// The kinds of entries (entries.h), by name, with their fields: what
// hostcb/_engine/entries.py must name the same.
struct KindFields {
  const char* name;
  const char* fields[5];
};
constexpr KindFields kEntryKindFields[kEntryKinds] = {
    {"ArrayTap", {"func", "second"}},
    {"PrintLineTap", {"write_lines", "pieces", "fallback", "array_text"}},
    {"ArraysTap", {"run"}},
    {"CallRunner", {"run", "host_function"}},
    {"DirectCall", {"func", "on_failure", "pending", "run"}},
};

// Whether `type` (a tuple type) has exactly the fields of `kind`; else a
// TypeError set.
bool HasFields(PyObject* type, const KindFields& kind) {
  PyObject* fields = PyObject_GetAttrString(type, "_fields");
  bool same = fields != nullptr && PyTuple_Check(fields);
  Py_ssize_t n = 0;
  for (; same && kind.fields[n] != nullptr; ++n) {
    same = n < PyTuple_GET_SIZE(fields) &&
           PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(fields, n),
                                            kind.fields[n]) == 0;
  }
  same = same && n == PyTuple_GET_SIZE(fields);
  Py_XDECREF(fields);
  if (!same) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "hostcb: the entry kind %s has other fields than the "
                 "engine's (entries.h)",
                 kind.name);
  }
  return same;
}

PyObject* Py_set_entry_kinds(PyObject*, PyObject* kinds) {
  if (!PyDict_Check(kinds)) {
    PyErr_SetString(PyExc_TypeError, "set_entry_kinds takes a dict");
    return nullptr;
  }
  PyTypeObject* types[kEntryKinds];
  for (int k = 0; k < kEntryKinds; ++k) {
    PyObject* t = PyDict_GetItemString(kinds, kEntryKindFields[k].name);
    if (t == nullptr || !PyType_Check(t) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t), &PyTuple_Type)) {
      PyErr_Format(PyExc_TypeError,
                   "hostcb: set_entry_kinds lacks the tuple type %s",
                   kEntryKindFields[k].name);
      return nullptr;
    }
    if (!HasFields(t, kEntryKindFields[k])) return nullptr;
    types[k] = reinterpret_cast<PyTypeObject*>(t);
  }
  for (int k = 0; k < kEntryKinds; ++k) {
    PyTypeObject* old = g_entry_types[k];
    Py_INCREF(reinterpret_cast<PyObject*>(types[k]));
    g_entry_types[k] = types[k];
    Py_XDECREF(reinterpret_cast<PyObject*>(old));
  }
  Py_RETURN_NONE;
}

PyObject* Py_running_call_runners(PyObject*, PyObject*) {
  return RunningCallRunners();
}

PyObject* Py_set_name_resolver(PyObject*, PyObject* resolver) {
  if (!PyCallable_Check(resolver)) {
    PyErr_SetString(PyExc_TypeError, "set_name_resolver takes a callable");
    return nullptr;
  }
  SetNameResolver(resolver);
  Py_RETURN_NONE;
}

PyObject* Py_set_named(PyObject*, PyObject* args) {
  const char *name, *spec;
  Py_ssize_t name_size, spec_size;
  long long value;
  if (!PyArg_ParseTuple(args, "s#s#L", &name, &name_size, &spec, &spec_size,
                        &value)) {
    return nullptr;
  }
  SetNamed(std::string_view(name, name_size), std::string_view(spec, spec_size),
           value);
  Py_RETURN_NONE;
}

PyObject* g_consumer_starter = nullptr;  // starter(device_ordinal)

PyObject* Py_set_consumer_starter(PyObject*, PyObject* starter) {
  if (!PyCallable_Check(starter)) {
    PyErr_SetString(PyExc_TypeError, "set_consumer_starter takes a callable");
    return nullptr;
  }
  Py_INCREF(starter);
  Py_XSETREF(g_consumer_starter, starter);
  Py_RETURN_NONE;
}

// Each queue's next producer calls the starter again (whose consumer
// exists: the Python side starts none twice, and hears of the next record).
PyObject* Py_rearm_consumer_starter(PyObject*, PyObject*) {
  ForEachQueue([](Queue* q) {
    q->consumer_requested.store(false, std::memory_order_release);
  });
  Py_RETURN_NONE;
}

PyObject* Py_mark_awaited_target(PyObject*, PyObject* arg) {
  long long id = PyLong_AsLongLong(arg);
  if (id == -1 && PyErr_Occurred()) return nullptr;
  if (id < 0 || id >= kMaxPrintTargets) {
    PyErr_Format(PyExc_ValueError,
                 "hostcb: print target id %lld is outside [0, %lld)", id,
                 static_cast<long long>(kMaxPrintTargets));
    return nullptr;
  }
  g_awaited_targets[id / 64].fetch_or(uint64_t{1} << (id % 64),
                                      std::memory_order_relaxed);
  Py_RETURN_NONE;
}

PyObject* Py_install_exit_guard(PyObject*, PyObject*) {
  if (InstallExitGuard() < 0) return nullptr;
  Py_RETURN_NONE;
}

PyObject* Py_uninstall_exit_guard(PyObject*, PyObject*) {
  return PyBool_FromLong(UninstallExitGuard());
}

// builtins.print while hostcb's prints are staged (_engine/output_order/):
// a thread that has noted a computation of its own that prints (a key of
// either dict: its latest fast-path outputs, or its latest runtime token)
// first calls `wait` (which waits for that computation and its prints);
// then, as every other thread, it calls the original print with the
// arguments as given.  The function's self is the tuple (print, outputs,
// tokens, wait).  With both dicts empty (nothing noted by any thread) it
// allocates nothing and looks nothing up.  Its Python twin, for a process
// without this extension, is output_order/writes.py's _python_print.
PyObject* OrderedPrint(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
  PyObject* print = PyTuple_GET_ITEM(self, 0);
  PyObject* outputs = PyTuple_GET_ITEM(self, 1);
  PyObject* tokens = PyTuple_GET_ITEM(self, 2);
  if (PyDict_GET_SIZE(outputs) != 0 || PyDict_GET_SIZE(tokens) != 0) {
    // threading.get_ident() is this number, as a Python int.
    PyObject* ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (ident == nullptr) return nullptr;
    int noted = PyDict_Contains(outputs, ident);
    if (noted == 0) noted = PyDict_Contains(tokens, ident);
    Py_DECREF(ident);
    if (noted < 0) return nullptr;
    if (noted) {
      PyObject* r = PyObject_CallNoArgs(PyTuple_GET_ITEM(self, 3));
      if (r == nullptr) return nullptr;
      Py_DECREF(r);
    }
  }
  return PyObject_Vectorcall(print, args, nargs, kwnames);
}

PyMethodDef kOrderedPrint = {
    "print",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(OrderedPrint)),
    METH_FASTCALL | METH_KEYWORDS,
    "print(*args, sep=' ', end='\\n', file=None, flush=False): Python's "
    "print, once the calling thread's own hostcb prints ran (see "
    "hostcb._engine.output_order)."};

PyObject* Py_ordered_print(PyObject*, PyObject* args) {
  PyObject *print, *outputs, *tokens, *wait;
  if (!PyArg_ParseTuple(args, "OO!O!O", &print, &PyDict_Type, &outputs,
                        &PyDict_Type, &tokens, &wait)) {
    return nullptr;
  }
  if (!PyCallable_Check(print) || !PyCallable_Check(wait)) {
    PyErr_SetString(PyExc_TypeError,
                    "ordered_print takes print, two dicts and a callable");
    return nullptr;
  }
  // The function's self is this tuple, which it keeps alive.
  PyObject* self = PyTuple_Pack(4, print, outputs, tokens, wait);
  if (self == nullptr) return nullptr;
  PyObject* module = PyUnicode_FromString("builtins");
  if (module == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
  PyObject* f = PyCFunction_NewEx(&kOrderedPrint, self, module);
  Py_DECREF(module);
  Py_DECREF(self);
  return f;
}

PyObject* Py_after_fork_in_child(PyObject*, PyObject*) {
  ResetAfterFork();
  ExitGuardAfterForkInChild();
  Py_RETURN_NONE;
}

// The unflatten function of hostcb's _PrintOutputs pytree node
// (_jax_internals/printing_computations.py), which jaxlib calls once per
// dispatch of a function that prints, on jit's C++ fast path: notes the
// outputs for the calling thread (outputs[threading.get_ident()] =
// children, `outputs` being the dict given to print_outputs_unflatten, the
// function's self) and returns the result tree as the function returns
// it: children[0] where the aux data `tree` is None (one array), else
// tree.unflatten(children).  Its Python twin, for a process without this
// extension, is printing_computations.py's _unflatten_print_outputs.
PyObject* g_unflatten_name = nullptr;  // "unflatten", interned

PyObject* UnflattenPrintOutputs(PyObject* outputs, PyObject* const* args,
                                Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_Format(PyExc_TypeError,
                 "hostcb: the unflatten of print outputs takes 2 arguments "
                 "(tree, children), not %zd",
                 nargs);
    return nullptr;
  }
  PyObject* tree = args[0];
  PyObject* children = args[1];
  // threading.get_ident() is this number, as a Python int.
  PyObject* ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
  if (ident == nullptr) return nullptr;
  int set = PyDict_SetItem(outputs, ident, children);
  Py_DECREF(ident);
  if (set < 0) return nullptr;
  if (tree == Py_None) {
    if (PyTuple_CheckExact(children) && PyTuple_GET_SIZE(children) > 0) {
      PyObject* first = PyTuple_GET_ITEM(children, 0);
      Py_INCREF(first);
      return first;
    }
    return PySequence_GetItem(children, 0);
  }
  return PyObject_CallMethodOneArg(tree, g_unflatten_name, children);
}

PyMethodDef kUnflattenPrintOutputs = {
    "unflatten_print_outputs",
    reinterpret_cast<PyCFunction>(
        reinterpret_cast<void*>(UnflattenPrintOutputs)),
    METH_FASTCALL,
    "unflatten_print_outputs(tree, children): notes children as the "
    "calling thread's latest print outputs; returns children[0] where tree "
    "is None, else tree.unflatten(children)."};

PyObject* Py_print_outputs_unflatten(PyObject*, PyObject* outputs) {
  if (!PyDict_CheckExact(outputs)) {
    PyErr_SetString(PyExc_TypeError,
                    "print_outputs_unflatten takes a dict (thread id -> "
                    "outputs)");
    return nullptr;
  }
  if (g_unflatten_name == nullptr) {
    g_unflatten_name = PyUnicode_InternFromString("unflatten");
    if (g_unflatten_name == nullptr) return nullptr;
  }
  // The function's self is the dict, which it keeps alive.
  return PyCFunction_New(&kUnflattenPrintOutputs, outputs);
}

PyObject* Py_print_line_text(PyObject*, PyObject* args) {
  PyObject *pieces, *array;
  if (!PyArg_ParseTuple(args, "OO", &pieces, &array)) return nullptr;
  PyObject* text = PrintLineText(pieces, array);
  if (text == nullptr && !PyErr_Occurred()) Py_RETURN_NONE;
  return text;
}

PyObject* Py_array_text(PyObject*, PyObject* args) {
  PyObject* array;
  int flags;
  long long threshold;
  if (!PyArg_ParseTuple(args, "OiL", &array, &flags, &threshold)) {
    return nullptr;
  }
  return ArrayTextOf(array, flags, threshold);
}

PyMethodDef kMethods[] = {
    {"tap_fallbacks", Py_tap_fallbacks, METH_NOARGS,
     "(count, reason or None): hostcb_tap's call frames that took XLA FFI's "
     "generic decoding, and the reason of the first."},
    {"handlers", Py_handlers, METH_NOARGS,
     "{name: PyCapsule} of the XLA FFI handlers, for register_ffi_target."},
    {"set_dtypes", Py_set_dtypes, METH_O,
     "set_dtypes({xla_ffi_dtype_code: numpy dtype}): the dtypes that taps "
     "may carry."},
    {"run_batch",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(Py_run_batch)),
     METH_VARARGS | METH_KEYWORDS,
     "run_batch(device, functions, device_obj, max_records=256, "
     "timeout=None, max_bytes=0, poll=0.05) -> int.\n\nWaits (GIL "
     "released) up to timeout seconds (None: forever) for ready records of "
     "the device's queue, polling for `poll` seconds before sleeping; makes "
     "one copy of each operand into arrays Python owns, frees the ring, then "
     "runs the records in order with the GIL held: a tap calls "
     "functions[target_id] (a list, None where nothing is registered), an "
     "entry (func, second) as func(arrays[0], "
     "second), an entry (write_lines, pieces, (func, second)) of one array "
     "as write_lines([print_line_text(pieces, arrays[0])]) where that gives "
     "a line (the lines of consecutive such records with the same "
     "write_lines in one call), else as func(arrays[0], second), and any "
     "other as entry(arrays, device_obj); a marker calls "
     "on_marker(marker_id), the last retire marker of a retired target id "
     "on_quiet(target_id, True).  A tap function that raises (or a "
     "missing one) calls on_failure(target_id, exception or None); after a "
     "tap function "
     "that dispatched computations, dispatch_finished() (see "
     "set_consumer_hooks).  Returns the number of records run (0 on "
     "timeout)."},
    {"set_consumer_hooks", Py_set_consumer_hooks, METH_VARARGS,
     "set_consumer_hooks(on_marker, on_failure, dispatch_finished, "
     "on_quiet): the Python functions run_batch calls."},
    {"lifetimes", Py_lifetimes, METH_NOARGS,
     "{instantiate, type_id, type_info}: PyCapsules of the instantiate "
     "stage of hostcb_tap, hostcb_call and hostcb_call_one on CPU, and of "
     "the type of the state it keeps with each executable (register the "
     "type first)."},
    {"retire_target", Py_retire_target, METH_O,
     "retire_target(target_id) -> bool: the last lease of the id died; "
     "True if no executable naming it lives and every record it made has "
     "run (else on_quiet(target_id) says so later, or take_quiet())."},
    {"take_quiet", Py_take_quiet, METH_NOARGS,
     "take_quiet() -> [target_id]: retired ids that became quiet where no "
     "queue had a consumer to say so."},
    {"tracked_targets", Py_tracked_targets, METH_NOARGS,
     "tracked_targets() -> int: target ids whose executables are tracked."},
    {"put_marker", Py_put_marker, METH_VARARGS,
     "put_marker(device, marker_id): queues a marker after every record "
     "queued before it; never waits."},
    {"set_capacity", Py_set_capacity, METH_O,
     "set_capacity(bytes): the byte bound of every queue (applied to a "
     "non-empty queue when it next empties)."},
    {"set_consumer_dispatching", Py_set_consumer_dispatching, METH_VARARGS,
     "set_consumer_dispatching(device, flag): while set, producers of the "
     "device's queue never wait for space, nor calls for earlier records "
     "(its consumer runs a tap function that dispatched a computation and "
     "may wait for it)."},
    {"counters", Py_counters, METH_VARARGS,
     "counters(device) -> {records_in, records_out, bytes_held, records_held, "
     "capacity, space_waiters, lock_sleeps}."},
    {"mark_awaited_target", Py_mark_awaited_target, METH_O,
     "mark_awaited_target(target_id): taps of this target print; host reads "
     "wait for them (wait_for_earlier_records(device, True))."},
    {"wait_for_earlier_records", Py_wait_for_earlier_records, METH_VARARGS,
     "wait_for_earlier_records(device, awaited_only=False, timeout_s=-1): "
     "waits (GIL released) until the device's consumer has run every record "
     "queued before the call (awaited_only: up to the latest print tap), or "
     "runs a tap function that dispatched a computation; with awaited_only "
     "and timeout_s >= 0, at most that many seconds (returns False if they "
     "passed first).  Not from the consumer's own thread."},
    {"set_call_server", Py_set_call_server, METH_VARARGS,
     "set_call_server(runners, checker, formatter): hostcb_call runs "
     "runners[target_id](arrays, device_ordinal) (runners a list, None "
     "where nothing is registered) on the device thread (GIL "
     "held) and copies the sequence of arrays it returns into the call's "
     "results; hostcb_call_one copies a returned NumPy array of the one "
     "result's exact dtype and shape, and passes anything else to "
     "checker(target_id, result) for that sequence.  An exception fails the "
     "computation with the text formatter(exception) returns."},
    {"set_entry_kinds", Py_set_entry_kinds, METH_O,
     "set_entry_kinds({name: type}): the kinds of entries that the handlers "
     "run (hostcb._engine.entries), checked against the engine's own"},
    {"running_call_runners", Py_running_call_runners, METH_NOARGS,
     "running_call_runners() -> the runners (see set_call_server) that "
     "the calling thread is running, innermost first."},
    {"set_name_resolver", Py_set_name_resolver, METH_O,
     "set_name_resolver(resolver): hostcb_tap_v1 and hostcb_call_v1 call "
     "resolver(name, spec) -> target id * 2 + one_array, once per (name, "
     "spec) and process."},
    {"set_named", Py_set_named, METH_VARARGS,
     "set_named(name, spec, value): what the resolver would return."},
    {"rearm_consumer_starter", Py_rearm_consumer_starter, METH_NOARGS,
     "rearm_consumer_starter(): the next record of each device's queue calls "
     "the starter again (hostcb.uninstall(): to hear of the next tap)."},
    {"set_consumer_starter", Py_set_consumer_starter, METH_O,
     "set_consumer_starter(starter): a device's first producer calls "
     "starter(device_ordinal) once, on its device thread with the GIL "
     "taken, before it queues its record."},
    {"install_exit_guard", Py_install_exit_guard, METH_NOARGS,
     "Installs the std::terminate handler of exit_guard.cc (threads that "
     "Python ends at shutdown do not abort the process)."},
    {"uninstall_exit_guard", Py_uninstall_exit_guard, METH_NOARGS,
     "Puts back the std::terminate handler that was there before; False "
     "where another one replaced hostcb's since."},
    {"array_text", Py_array_text, METH_VARARGS,
     "array_text(array, flags, threshold) -> the text of "
     "numpy.array2string(array) under NumPy's default print options "
     "(array_text.cc; flags: the NumPy version's behaviours), or None where "
     "NumPy formats it."},
    {"print_line_text", Py_print_line_text, METH_VARARGS,
     "print_line_text(pieces, array) -> the line that a debug.print tap "
     "entry (write, pieces, (func, second)) writes for the 0-d array: the "
     "UTF-8 bytes of `pieces` joined by the value's text as Python formats "
     "its number with '{}', and a newline; None for a value that Python "
     "formats (not 0-d, or a dtype other than float16/32/64, the integers "
     "and bool)."},
    {"print_outputs_unflatten", Py_print_outputs_unflatten, METH_O,
     "print_outputs_unflatten(outputs) -> the unflatten function of "
     "hostcb's _PrintOutputs pytree node: (tree, children) -> "
     "outputs[threading.get_ident()] = children, then children[0] where "
     "tree is None, else tree.unflatten(children)."},
    {"ordered_print", Py_ordered_print, METH_VARARGS,
     "ordered_print(print, outputs, tokens, wait) -> a function called as "
     "print: where the calling thread's id is a key of either dict, calls "
     "wait() first; then print(*args, **kwargs)."},
    {"after_fork_in_child", Py_after_fork_in_child, METH_NOARGS,
     "Forgets every queue and takes this thread as the main one (for "
     "os.register_at_fork)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_engine",
    "hostcb's native tap engine (see hostcb/engine/native.py).", -1, kMethods};

}  // namespace

namespace {

// Frees (on_quiet(tid, False)) the retired ids that became quiet with no
// queue to pass (TakeQuiet); GIL held.  An exception set meanwhile (inside
// a garbage collection) is kept.
void DrainQuiet() {
  if (g_on_quiet == nullptr) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  for (int64_t tid : TakeQuiet()) {
    if (PyObject* id = PyLong_FromLongLong(static_cast<long long>(tid))) {
      PyObject* argv[2] = {id, Py_False};  // never waits for a lock
      CallHook(g_on_quiet, argv, 2);
      Py_DECREF(id);
    } else {
      PyErr_Clear();  // left for Python's next lowering or barrier
    }
  }
  PyErr_Restore(type, value, traceback);
}

// One pending call of DrainQuiet at a time (CPython's queue of them is
// short).
std::atomic<bool> g_drain_scheduled{false};

int DrainQuietPending(void*) {
  g_drain_scheduled.store(false, std::memory_order_release);
  DrainQuiet();
  return 0;
}

}  // namespace

#ifdef HOSTCB_TEST_BUILD
void FailNextAllocations(long n) { g_failing_allocations = n; }
#endif

void QuietWithoutQueue(int64_t) {
  if (g_on_quiet == nullptr || PythonIsFinalizing()) return;
  if (PyGILState_Check()) {  // a garbage collection dropped the executable
    DrainQuiet();
    return;
  }
  // An XLA thread, as a computation ended: it never waits for the GIL.
  // The interpreter's main thread runs DrainQuiet at its next check for
  // signals (Py_AddPendingCall needs no GIL).
  if (!g_drain_scheduled.exchange(true, std::memory_order_acq_rel) &&
      Py_AddPendingCall(DrainQuietPending, nullptr) != 0) {
    g_drain_scheduled.store(false, std::memory_order_release);
  }
}

void RequestConsumerSlow(Queue* q) {
  if (q->consumer_requested.exchange(true, std::memory_order_acq_rel)) return;
  // The device thread holds no Python state; the thread that dispatched the
  // computation waits for it with the GIL released (as for hostcb_call).
  // Not while the interpreter shuts down: a daemon thread's computation
  // then has no consumer to start.
  if (PythonIsFinalizing()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (PyObject* starter = g_consumer_starter) {
    Py_INCREF(starter);
    PyObject* r = PyObject_CallFunction(starter, "i", q->device());
    if (r == nullptr) PyErr_WriteUnraisable(starter);
    Py_XDECREF(r);
    Py_DECREF(starter);
  }
  PyGILState_Release(gil);
}

}  // namespace hostcb

PyMODINIT_FUNC PyInit__engine(void) {
  import_array();
  PyObject* m = PyModule_Create(&hostcb::kModule);
  if (!m) return nullptr;
  // The constants that Python shares with the engine (engine.h), read by
  // hostcb._native.shared_constant.
  if (PyModule_AddIntConstant(m, "MAX_DEVICES", hostcb::kMaxDevices) < 0 ||
      PyModule_AddIntConstant(m, "MAX_PRINT_TARGETS",
                              static_cast<long>(hostcb::kMaxPrintTargets)) <
          0 ||
      PyModule_AddIntConstant(m, "DEFAULT_QUEUE_BYTES",
                              static_cast<long>(hostcb::kDefaultQueueBytes)) <
          0 ||
      // Whether print_line_text makes lines (print_line.cc).
      PyModule_AddIntConstant(m, "FORMATS_PRINT_LINES",
                              hostcb::kFormatsPrintLines ? 1 : 0) < 0 ||
      hostcb::AddCudaFunctions(m) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
#ifdef HOSTCB_TEST_BUILD
  if (hostcb::AddTestFunctions(m) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
#endif
  return m;
}
