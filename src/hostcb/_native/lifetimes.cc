// hostcb native tap engine: when a target id can name no record any more.
//
// hostcb_tap, hostcb_call and hostcb_call_one on CPU have an instantiate
// stage (HostcbInstantiate, attrs: target_id (int64)): XLA runs it once per
// custom call of an executable, when it builds that executable, and keeps
// the state it returns (a LiveExecutable) with the executable's thunks,
// which XLA destroys only once the executable is gone AND no computation of
// it still runs (a running computation holds its executable).  So the
// state's destructor is the point after which no handler will ever again
// run for that custom call: every record it made is already queued.
//
// Per target id, under g_life_mu:
//  * instances: the LiveExecutables alive (executables that name the id);
//  * markers: retire markers (kRetire records) queued and not yet passed;
//  * retired: Python's last lease of the id died (RetireTarget); no new
//    executable can name it then (ids are never given twice).
// When instances falls to 0, ExecutableGone queues a retire marker behind
// every record of every queue that has a consumer (a queue without one
// holds no record: a producer asks for the consumer before it queues);
// when the consumer passes the last of them (MarkerPassed), every record
// that names the id has run.  Where no queue has a consumer (a program of
// calls alone), nothing is queued, and the id is quiet at once.  An id is
// quiet when instances == 0 and markers == 0 after at least one instance
// lived; once quiet and retired, its Python functions may be freed, and
// its entry here goes.  Whichever of the three comes last says so:
// RetireTarget returns true; MarkerPassed returns true (the consumer calls
// Python's hook); or ExecutableGone, where no queue has a consumer, leaves
// the id for TakeQuiet and tells Python: at once where its thread holds
// the GIL (a garbage collection dropped the executable), else from the
// interpreter's main thread at its next check for signals
// (QuietWithoutQueue, module.cc); Python's next lowering, retirement or
// barrier takes them too.  An id never instantiated (an older XLA without
// the stage, or lowered only) is never quiet here: a barrier frees it.
//
// Lock order: g_life_mu, then a queue's mutex (ExecutableGone's markers).
// The handlers' execute stage never takes g_life_mu: nothing here is on
// the tap path.  Threads: instantiate on the compiling thread; the
// destructor on whichever thread drops the executable (a Python thread,
// or an XLA thread as the last computation ends), never with the GIL
// needed; MarkerPassed on a consumer.
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hostcb {
namespace {

struct Life {
  int64_t instances = 0;
  int64_t markers = 0;
  bool retired = false;
};

// Never destroyed: XLA may drop executables during static destruction.
std::mutex* g_life_mu = new std::mutex();
std::unordered_map<int64_t, Life>* g_lives =
    new std::unordered_map<int64_t, Life>();
std::vector<int64_t>* g_quiet = new std::vector<int64_t>();

// Queues a retire marker of `tid` in every queue with a consumer; returns
// how many (g_life_mu held).
int64_t PutRetireMarkersLocked(int64_t tid) {
  int64_t n = 0;
  ForEachQueue([&](Queue* q) {
    if (!q->consumer_requested.load(std::memory_order_acquire)) return;
    std::unique_lock<std::mutex> lock;
    Queue::Reservation r = q->Reserve(lock, kRetire, tid, 0, 0,
                                      /*never_wait=*/true);
    q->CommitLocked(r, /*urgent=*/false);
    ++n;
  });
  return n;
}

void ExecutableMade(int64_t tid) {
  std::lock_guard<std::mutex> lock(*g_life_mu);
  ++(*g_lives)[tid].instances;
}

void ExecutableGone(int64_t tid) {
  {
    std::lock_guard<std::mutex> lock(*g_life_mu);
    auto it = g_lives->find(tid);
    if (it == g_lives->end() || --it->second.instances > 0) return;
    it->second.markers += PutRetireMarkersLocked(tid);
    if (it->second.markers > 0 || !it->second.retired) return;
    g_quiet->push_back(tid);
    g_lives->erase(it);
  }
  QuietWithoutQueue(tid);  // g_life_mu released: it may run Python
}

// What XLA keeps with an executable, per custom call that names `tid`.
struct LiveExecutable {
  static ffi::TypeId id;
  explicit LiveExecutable(int64_t t) : tid(t) { ExecutableMade(tid); }
  ~LiveExecutable() { ExecutableGone(tid); }
  LiveExecutable(const LiveExecutable&) = delete;
  LiveExecutable& operator=(const LiveExecutable&) = delete;
  const int64_t tid;
};
ffi::TypeId LiveExecutable::id = XLA_FFI_UNKNOWN_TYPE_ID;

// XLA_FFI_TypeInfo's layout (c_api.h), spelt out: what XLA calls to
// destroy a state of that type.
struct TypeInfoLayout {
  size_t struct_size;
  void* extension_start;
  void (*deleter)(void*);
};
void DeleteLiveExecutable(void* p) { delete static_cast<LiveExecutable*>(p); }
TypeInfoLayout g_type_info{sizeof(TypeInfoLayout), nullptr,
                           DeleteLiveExecutable};

ffi::ErrorOr<std::unique_ptr<LiveExecutable>> Instantiate(int64_t tid) {
  return std::make_unique<LiveExecutable>(tid);
}

// XLA_FFI_State_Set_Args as XLA lays it out from FFI API 0.3 on (jaxlib
// 0.10; 0.12 has API 0.5): the stage, then the type and the state, whose
// deleter is registered with the type (jax.ffi.register_ffi_type).  The
// wheels are built with jaxlib 0.8.0's headers (API 0.1), whose struct
// has the same 48 bytes but the deleter in the last place and no stage:
// the binding's own encoding would write that layout, which XLA misreads.
struct StateSetArgs {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx;
  XLA_FFI_ExecutionStage stage;
  XLA_FFI_TypeId* type_id;
  void* state;
};

// Keeps a LiveExecutable of `tid` with the executable being built.  Under
// an older FFI API (Python registers the stage only where JAX has
// register_ffi_type), or a major version > 0, the state is kept for ever
// instead: the id is then never quiet, and a barrier frees its functions,
// as without the instantiate stage.
XLA_FFI_Error* KeepLiveExecutable(const XLA_FFI_Api* api,
                                  XLA_FFI_ExecutionContext* ctx, int64_t tid) {
  auto state = std::make_unique<LiveExecutable>(tid);
  const XLA_FFI_Api_Version& v = api->api_version;
  if (v.major_version != 0 || v.minor_version < 3) {
    state.release();  // never quiet: freed by a barrier
    return nullptr;
  }
  StateSetArgs args{
      sizeof(args),        nullptr,    ctx, XLA_FFI_ExecutionStage_INSTANTIATE,
      &LiveExecutable::id, state.get()};
  using SetFn = XLA_FFI_Error* (*)(StateSetArgs*);
  XLA_FFI_Error* error = reinterpret_cast<SetFn>(api->XLA_FFI_State_Set)(&args);
  if (error == nullptr) state.release();  // XLA's now
  return error;
}

}  // namespace

void* LiveExecutableTypeId() { return &LiveExecutable::id; }
void* LiveExecutableTypeInfo() { return &g_type_info; }

bool MarkerPassed(int64_t tid) {
  std::lock_guard<std::mutex> lock(*g_life_mu);
  auto it = g_lives->find(tid);
  if (it == g_lives->end()) return false;
  Life& l = it->second;
  if (--l.markers > 0 || l.instances > 0 || !l.retired) return false;
  g_lives->erase(it);
  return true;
}

bool RetireTarget(int64_t tid) {
  std::lock_guard<std::mutex> lock(*g_life_mu);
  auto it = g_lives->find(tid);
  if (it == g_lives->end()) return false;  // never instantiated
  Life& l = it->second;
  l.retired = true;
  if (l.instances > 0 || l.markers > 0) return false;
  g_lives->erase(it);
  return true;
}

std::vector<int64_t> TakeQuiet() {
  std::lock_guard<std::mutex> lock(*g_life_mu);
  std::vector<int64_t> quiet;
  quiet.swap(*g_quiet);
  return quiet;
}

size_t TrackedTargets() {
  std::lock_guard<std::mutex> lock(*g_life_mu);
  return g_lives->size();
}

void LifetimesAfterForkInChild() {
  // Single-threaded child; the parent's queues (and their markers) are
  // forgotten: a retired id without instances is quiet now.
  g_life_mu = new std::mutex();
  for (auto it = g_lives->begin(); it != g_lives->end();) {
    it->second.markers = 0;
    if (it->second.instances == 0 && it->second.retired) {
      g_quiet->push_back(it->first);
      it = g_lives->erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace hostcb

// The binding: metadata queries, and frames this file does not decode (it
// reports their errors in XLA's words).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HostcbInstantiateBound, hostcb::Instantiate,
    ffi::Ffi::BindInstantiate().Attr<int64_t>("target_id"));

// The instantiate stage: the frame decoded here, and the state set in the
// layout of the running XLA (KeepLiveExecutable).
extern "C" XLA_FFI_Error* HostcbInstantiate(XLA_FFI_CallFrame* frame) {
  if (frame->extension_start != nullptr ||
      frame->stage != XLA_FFI_ExecutionStage_INSTANTIATE) {
    return HostcbInstantiateBound(frame);
  }
  const int64_t* tid = hostcb::TargetIdAttr(frame->attrs);
  if (tid == nullptr) return HostcbInstantiateBound(frame);
  return hostcb::KeepLiveExecutable(frame->api, frame->ctx, *tid);
}
