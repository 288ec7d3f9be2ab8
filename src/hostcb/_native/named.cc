// hostcb native engine: the versioned handlers of host functions by name,
// for programs that are exported, cached or serialized and run in another
// process (docs/export.md).
//
// hostcb_tap_v1   attrs: name (string), spec (string).  Operands and
//                 results as hostcb_tap's.
// hostcb_call_v1  attrs: name (string), spec (string).  Operands and
//                 results as hostcb_call's.
//
// `name` is the name under which the host function was registered
// (hostcb.register; "" for id_print, which needs none); `spec` is a JSON
// text that says how the function is called (argument structure, result
// shapes, transforms; see hostcb/_core/by_name.py).  Both are copied verbatim
// into the program, so the program holds no process-local id.
//
// Each handler turns (name, spec) into this process's target id of the
// ids handlers (hostcb_tap, hostcb_call), then does what they do.  The
// first time a process meets a (name, spec), it takes the GIL and asks
// Python's resolver (set_name_resolver), which builds the entry from the
// function now bound to the name, or raises when none is: the computation
// then fails with an error that names it.  Later lookups need no Python:
// a small per-thread table keyed by the attribute's address (checked
// against its bytes: an address may be reused by a later program), then a
// process-wide map under a mutex.
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "pyarrays.h"

namespace ffi = xla::ffi;

namespace hostcb {

namespace {

PyObject* g_name_resolver = nullptr;  // resolver(name, spec) -> int (GIL)
std::mutex g_named_mu;
// name + '\0' + spec -> resolved value: target id * 2 + (one-array call).
std::unordered_map<std::string, int64_t>* g_named = nullptr;

struct Memo {
  const char* name = nullptr;
  size_t name_size = 0;
  const char* spec = nullptr;
  size_t spec_size = 0;
  std::string key;  // the bytes seen at these addresses
  int64_t value = -1;
};
constexpr int kMemoSize = 8;
thread_local Memo tl_memo[kMemoSize];
thread_local int tl_memo_next = 0;

std::string Key(std::string_view name, std::string_view spec) {
  std::string key;
  key.reserve(name.size() + 1 + spec.size());
  key.append(name.data(), name.size());
  key.push_back('\0');
  key.append(spec.data(), spec.size());
  return key;
}

bool SameBytes(const Memo& m, std::string_view name, std::string_view spec) {
  return m.key.size() == name.size() + 1 + spec.size() &&
         std::memcmp(m.key.data(), name.data(), name.size()) == 0 &&
         std::memcmp(m.key.data() + name.size() + 1, spec.data(),
                     spec.size()) == 0;
}

// Asks Python; -1 and `error` set when it raises.
int64_t AskPython(std::string_view name, std::string_view spec,
                  std::string* error) {
  if (PythonIsFinalizing()) {
    *error =
        "hostcb: a host function by name ran while Python was shutting "
        "down";
    return -1;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  int64_t value = -1;
  if (g_name_resolver == nullptr) {
    *error =
        "hostcb: no resolver of host functions by name is set (hostcb "
        "was not imported in this process)";
  } else {
    PyObject* out =
        PyObject_CallFunction(g_name_resolver, "s#s#", name.data(),
                              static_cast<Py_ssize_t>(name.size()), spec.data(),
                              static_cast<Py_ssize_t>(spec.size()));
    if (out != nullptr) {
      value = PyLong_AsLongLong(out);
      Py_DECREF(out);
    }
    if (value < 0 || PyErr_Occurred()) {
      value = -1;
      PyObject* exc = TakeException();
      *error = "hostcb: the host function by name '" + std::string(name) +
               "' cannot be called";
      if (exc != nullptr) {
        if (PyObject* s = PyObject_Str(exc)) {
          if (const char* u = PyUnicode_AsUTF8(s)) *error = u;
          Py_DECREF(s);
        }
        Py_DECREF(exc);
      }
      PyErr_Clear();
    }
  }
  PyGILState_Release(gil);
  return value;
}

}  // namespace

// The resolved value of (name, spec): target id * 2 + (one-array call), or
// -1 with `error` set.
int64_t ResolveNamed(std::string_view name, std::string_view spec,
                     std::string* error) {
  for (Memo& m : tl_memo) {
    if (m.name == name.data() && m.spec == spec.data() &&
        m.name_size == name.size() && m.spec_size == spec.size() &&
        SameBytes(m, name, spec)) {
      return m.value;
    }
  }
  std::string key = Key(name, spec);
  int64_t value = -1;
  {
    std::lock_guard<std::mutex> lock(g_named_mu);
    if (g_named != nullptr) {
      auto it = g_named->find(key);
      if (it != g_named->end()) value = it->second;
    }
  }
  if (value < 0) {
    value = AskPython(name, spec, error);
    if (value < 0) return -1;  // not kept: the name may be bound later
    std::lock_guard<std::mutex> lock(g_named_mu);
    if (g_named == nullptr)
      g_named = new std::unordered_map<std::string, int64_t>();
    (*g_named)[key] = value;
  }
  Memo& m = tl_memo[tl_memo_next];
  tl_memo_next = (tl_memo_next + 1) % kMemoSize;
  m.name = name.data();
  m.name_size = name.size();
  m.spec = spec.data();
  m.spec_size = spec.size();
  m.key = std::move(key);
  m.value = value;
  return value;
}

void SetNamed(std::string_view name, std::string_view spec, int64_t value) {
  std::lock_guard<std::mutex> lock(g_named_mu);
  if (g_named == nullptr)
    g_named = new std::unordered_map<std::string, int64_t>();
  (*g_named)[Key(name, spec)] = value;
}

void SetNameResolver(PyObject* resolver) {  // GIL held
  Py_INCREF(resolver);
  Py_XSETREF(g_name_resolver, resolver);
}

void NamedAfterForkInChild() {
  // Single-threaded child: the map (plain memory) stays valid; its mutex
  // may be held by a thread of the parent.
  new (&g_named_mu) std::mutex();
}

namespace {

ffi::Error Unresolved(std::string error) {
  return ffi::Error(ffi::ErrorCode::kNotFound, std::move(error));
}

ffi::Error TapV1(int32_t device, std::string_view name, std::string_view spec,
                 ffi::RemainingArgs args, ffi::RemainingRets rets) {
  std::string error;
  const int64_t value = ResolveNamed(name, spec, &error);
  if (value < 0) return Unresolved(std::move(error));
  RawRets rr(rets);
  RawArgs ra(args);
  ffi::Error e = CheckOnlyTokens(ra.raw(), rr.raw(), rr.first());
  if (e.failure()) return e;
  return EnqueueTap(device, value / 2, ra.raw(), ra.first());
}

ffi::Error CallV1(int32_t device, std::string_view name, std::string_view spec,
                  ffi::RemainingArgs args, ffi::RemainingRets rets) {
  std::string error;
  const int64_t value = ResolveNamed(name, spec, &error);
  if (value < 0) return Unresolved(std::move(error));
  RawArgs ra(args);
  RawRets rr(rets);
  return CallOnHost(value % 2 == 1, device, value / 2, ra.raw(), ra.first(),
                    rr.raw(), rr.first());
}

ffi::Error TapCudaV1(void* stream, int32_t ordinal, std::string_view name,
                     std::string_view spec, ffi::RemainingArgs args,
                     ffi::RemainingRets rets) {
  std::string error;
  const int64_t value = ResolveNamed(name, spec, &error);
  if (value < 0) return Unresolved(std::move(error));
  RawRets rr(rets);
  RawArgs ra(args);
  ffi::Error e = CheckOnlyTokens(ra.raw(), rr.raw(), rr.first());
  if (e.failure()) return e;
  return TapOnStream(stream, ordinal, value / 2, ra.raw(), ra.first());
}

ffi::Error CallCudaV1(void* stream, int32_t ordinal, std::string_view name,
                      std::string_view spec, ffi::RemainingArgs args,
                      ffi::RemainingRets rets) {
  std::string error;
  const int64_t value = ResolveNamed(name, spec, &error);
  if (value < 0) return Unresolved(std::move(error));
  RawArgs ra(args);
  RawRets rr(rets);
  return CallOnStream(value % 2 == 1, stream, ordinal, value / 2, ra.raw(),
                      ra.first(), rr.raw(), rr.first());
}

auto HostBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::DeviceOrdinal>()
      .Attr<std::string_view>("name")
      .Attr<std::string_view>("spec")
      .RemainingArgs()
      .RemainingRets();
}

auto CudaBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<void*>>()
      .Ctx<ffi::DeviceOrdinal>()
      .Attr<std::string_view>("name")
      .Attr<std::string_view>("spec")
      .RemainingArgs()
      .RemainingRets();
}

}  // namespace
}  // namespace hostcb

XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbTapV1, hostcb::TapV1,
                              hostcb::HostBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbCallV1, hostcb::CallV1,
                              hostcb::HostBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbTapCudaV1, hostcb::TapCudaV1,
                              hostcb::CudaBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbCallCudaV1, hostcb::CallCudaV1,
                              hostcb::CudaBinding());
