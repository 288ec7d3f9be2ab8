// hostcb native tap engine: state shared by the FFI handlers (handlers.cc)
// and the CPython module (module.cc), compiled into one extension.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "queue.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace hostcb {

// At most this many device queues (any non-negative device ordinals).
constexpr int32_t kMaxDevices = 4096;
// A queue's byte bound until Python sets one: the default of the option
// jax_host_callback_max_queue_byte_size, exported to Python as
// DEFAULT_QUEUE_BYTES (module.cc), which hostcb.config reads.
constexpr uint64_t kDefaultQueueBytes = 256000000;
// XLA_FFI_DataType codes are small integers; see c_api.h.
constexpr int kMaxDtype = 64;

// The queues of GPUs: kGpuKeyBase + the GPU's local ordinal (cuda.cc), out
// of the range of CPU device ordinals.
// Exported to Python as GPU_KEY_BASE (cuda_py.cc).
constexpr int32_t kGpuKeyBase = 1 << 30;
constexpr int32_t kMaxGpuOrdinal = 1 << 16;

// The queue of a device ordinal, created on first use with the current
// default capacity; nullptr if the ordinal is out of range.
Queue* GetQueue(int32_t device);
// The queue if it already exists.
Queue* FindQueue(int32_t device);
// Sets the default capacity and that of every existing queue.
void SetCapacityAll(uint64_t bytes);
// Calls fn on every existing queue.
template <typename Fn>
void ForEachQueue(Fn fn);
// In a forked child: forget (leak) every queue, whose mutexes may have been
// held by threads that do not exist in the child.
void ResetAfterFork();

// Asks the Python side, once per queue, to start the consumer of `q`
// (module.cc: takes the GIL and calls the starter that Python set with
// set_consumer_starter).  Called by a producer before its first record, so
// that no consumer thread exists until a device really taps.  Never with the
// queue's mutex held.
void RequestConsumerSlow(Queue* q);
inline void RequestConsumer(Queue* q) {
  if (!q->consumer_requested.load(std::memory_order_acquire)) {
    RequestConsumerSlow(q);
  }
}

// Which XLA dtypes the consumer can turn into NumPy arrays (set from
// Python); the handlers refuse the others with an error.
extern std::atomic<bool> g_dtype_supported[kMaxDtype];

// The tap targets that print (id_print, hostcb.debug.print/callback), a
// bit per target id below kMaxPrintTargets (set from Python when the
// target is registered; a target beyond it is not waited for by host
// reads).  Read by the tap handlers, without a lock.  Part of output
// ordering, whose map is hostcb/_engine/output_order/__init__.py.
constexpr int64_t kMaxPrintTargets = int64_t{1} << 20;
extern std::atomic<uint64_t> g_awaited_targets[kMaxPrintTargets / 64];
inline bool IsPrintTarget(int64_t id) {
  return id >= 0 && id < kMaxPrintTargets &&
         (g_awaited_targets[id / 64].load(std::memory_order_relaxed) >>
          (id % 64)) &
             1;
}

// The queue whose consumer runs on this thread (set by run_batch).  A tap
// produced on that thread (a tap function whose computation XLA runs inline)
// never waits for space, since only this thread frees it.
extern thread_local Queue* tl_consumer_queue;

extern std::atomic<Queue*> g_queues[kMaxDevices];

// hostcb_tap's call frames that it did not decode itself but ran through
// XLA FFI's binding (the slow path; handlers.cc), and the reason of the
// first (a static string; nullptr until then).  The consumer reports the
// reason once (module.cc); tests read both (tap_fallbacks).
extern std::atomic<uint64_t> g_tap_fallbacks;
extern std::atomic<const char*> g_tap_fallback_reason;
void NoteTapFallback(const char* reason);

// Gives access to the raw argument/result arrays behind RemainingArgs/Rets
// (decoding each one through get<AnyBuffer>() would build a diagnostic
// engine per operand).
struct RawArgs : xla::ffi::RemainingArgs {
  explicit RawArgs(const xla::ffi::RemainingArgs& a)
      : xla::ffi::RemainingArgs(a) {}
  const XLA_FFI_Args* raw() const { return args(); }
  size_t first() const { return offset(); }
};
struct RawRets : xla::ffi::RemainingRets {
  explicit RawRets(const xla::ffi::RemainingRets& r)
      : xla::ffi::RemainingRets(r) {}
  const XLA_FFI_Rets* raw() const { return rets(); }
  size_t first() const { return offset(); }
};

// Bytes of an array buffer (dtype width times its dimensions).
inline uint64_t BufferBytes(const XLA_FFI_Buffer* b) {
  uint64_t n = xla::ffi::ByteWidth(static_cast<xla::ffi::DataType>(b->dtype));
  for (int64_t i = 0; i < b->rank; ++i) n *= static_cast<uint64_t>(b->dims[i]);
  return n;
}

// The payload of a tap (queue.h's layout) for its array operands.
struct TapLayout {
  uint16_t num;      // array operands (tokens are skipped)
  uint64_t header;   // bytes of the descriptors and dims, padded
  uint64_t payload;  // header and operand bytes
};
// Measures the array operands args[first:], refusing what the consumer
// cannot turn into NumPy arrays (handlers.cc).
xla::ffi::Error MeasureTap(const XLA_FFI_Args* args, size_t first,
                           TapLayout* layout);
// The error of a device ordinal without a queue.
xla::ffi::Error OutOfRange(int32_t device);
// A tap's first steps on any platform: asks for q's consumer, measures
// args[first:] into *layout and reserves its record in q (*r, `lock` then
// holding q's mutex).  On failure nothing is reserved, or the record went
// through as a lost tap (LostTap), and the handler returns the error.
// `own_block_from`: as Queue::Reserve's.  `extra_bytes` are reserved after
// the payload (layout->payload does not count them).
xla::ffi::Error ReserveTap(Queue* q, int64_t target_id,
                           const XLA_FFI_Args* args, size_t first,
                           TapLayout* layout,
                           std::unique_lock<std::mutex>& lock,
                           Queue::Reservation* r,
                           uint64_t own_block_from = Queue::kNoOwnBlock,
                           uint64_t extra_bytes = 0);
// Whether every result from rets[first:] is the XLA token or an operand's
// own buffer: a tap that returns operands unchanged (aliased to them by
// output_operand_aliasing, so that XLA passes the operand's buffer as the
// result; the tap writes nothing there).
bool ResultsAreTokensOrOperands(const XLA_FFI_Args& args,
                                const XLA_FFI_Rets& rets, size_t first);
// The error of hostcb_tap if another result is asked for.
xla::ffi::Error CheckOnlyTokens(const XLA_FFI_Args* args,
                                const XLA_FFI_Rets* rets, size_t first);
// Commits reservation r, whose payload could not be allocated, as a lost
// tap (`lock` from Reserve still held) and returns the handler's error.
xla::ffi::Error LostTap(Queue* q, Queue::Reservation r, uint64_t payload);

// Queues one tap record of args[first:] for target_id on `device`'s queue
// (what hostcb_tap does; handlers.cc).
xla::ffi::Error EnqueueTap(int32_t device, int64_t target_id,
                           const XLA_FFI_Args* args, size_t first);

// Host functions by name (named.cc): the resolved value of (name, spec),
// target id * 2 + (one-array call), or -1 with *error set; SetNamed seeds
// it (the lowering knows it).  (SetNameResolver, in module.cc's terms,
// sets Python's resolver(name, spec) -> value.)
int64_t ResolveNamed(std::string_view name, std::string_view spec,
                     std::string* error);
void SetNamed(std::string_view name, std::string_view spec, int64_t value);
void NamedAfterForkInChild();

// Runs call target_id's Python runner on this thread (call.cc): waits for
// the records queued before it on `device`'s queue, takes the GIL, passes
// fresh arrays of args[first_arg:] and copies the results into
// rets[first_ret:].  Every buffer's data must be host memory.
xla::ffi::Error CallOnHost(bool one_array, int32_t device, int64_t target_id,
                           const XLA_FFI_Args* args, size_t first_arg,
                           const XLA_FFI_Rets* rets, size_t first_ret);

// Writes the payload of args[first:] at `data`: the descriptors and dims
// here, and each operand's bytes through copy(dst, src, nbytes) (a memcpy
// on CPU, an asynchronous device-to-host copy on a GPU); stops at the first
// copy that returns false and returns false.
template <typename Copy>
bool WritePayload(uint8_t* data, const XLA_FFI_Args* args, size_t first,
                  uint64_t header, Copy copy) {
  size_t num = 0;
  for (size_t i = first; i < static_cast<size_t>(args->size); ++i) {
    auto* b = static_cast<const XLA_FFI_Buffer*>(args->args[i]);
    if (b->dtype != XLA_FFI_DataType_TOKEN) ++num;
  }
  auto* descs = reinterpret_cast<OperandDesc*>(data);
  auto* dims = reinterpret_cast<int64_t*>(data + num * sizeof(OperandDesc));
  uint64_t offset = header;
  size_t k = 0;
  for (size_t i = first; i < static_cast<size_t>(args->size); ++i) {
    auto* b = static_cast<const XLA_FFI_Buffer*>(args->args[i]);
    if (b->dtype == XLA_FFI_DataType_TOKEN) continue;
    const uint64_t nbytes = BufferBytes(b);
    descs[k] = OperandDesc{static_cast<int32_t>(b->dtype),
                           static_cast<int32_t>(b->rank), offset, nbytes};
    std::memcpy(dims, b->dims, b->rank * sizeof(int64_t));
    dims += b->rank;
    if (nbytes && !copy(data + offset, b->data, nbytes)) return false;
    offset += AlignUp(nbytes);
    ++k;
  }
  return true;
}

// The GPU back end (cuda.cc), with the driver that cuda_api.h loads.
// The queue of GPU `ordinal` (local), created on first use.
Queue* GpuQueue(int32_t ordinal);
// What the CUDA hostcb_tap handler does, on `stream`.
xla::ffi::Error TapOnStream(void* stream, int32_t ordinal, int64_t target_id,
                            const XLA_FFI_Args* args, size_t first);
// What the CUDA hostcb_call(_one) handlers do, on `stream`.
xla::ffi::Error CallOnStream(bool one_array, void* stream, int32_t ordinal,
                             int64_t target_id, const XLA_FFI_Args* args,
                             size_t first_arg, const XLA_FFI_Rets* rets,
                             size_t first_ret);
// In a forked child (called by ResetAfterFork).
void ForgetGpuStateAfterFork();
// Bytes of GPU `ordinal`'s ring that are pinned.
uint64_t GpuPinnedBytes(int32_t ordinal);
// The CUDA error name of the first pinning that the driver refused for that
// GPU's ring, or "" (every chunk reached so far is pinned).
std::string GpuPinRefusal(int32_t ordinal);
// "" where GPU taps are published by a ready word that the stream writes,
// else why they are published by host functions (slower: the stream waits
// for the host at each tap).
std::string GpuPublication();
#ifdef HOSTCB_TEST_BUILD
// The test build's hooks (tests/native/engine_testing.cc):
// as if the driver had refused a ready word with CUDA error `code` (0:
// words again; cuda.cc),
void SetGpuWordsRefused(int code);
// the consumer fails to allocate the arrays of the next n taps (module.cc).
void FailNextAllocations(long n);
#endif

// The lives of target ids' executables (lifetimes.cc): XLA's instantiate
// stage of the handlers of process-local ids, the type of the state it
// keeps with each executable (pointers for Python to register), and what
// the consumer and Python ask.
// The `target_id` attribute of a call frame that has it alone, as a scalar
// int64, or nullptr (handlers.cc).
const int64_t* TargetIdAttr(const XLA_FFI_Attrs& attrs);
void* LiveExecutableTypeId();
void* LiveExecutableTypeInfo();
// The consumer passed a retire marker of tid: true if tid is now retired
// and quiet (its functions may be freed).
bool MarkerPassed(int64_t tid);
// Python's last lease of tid died: true if tid is quiet already.
bool RetireTarget(int64_t tid);
// Retired ids that became quiet with no queue to pass (taken once).
std::vector<int64_t> TakeQuiet();
// module.cc: retired tid became quiet in ExecutableGone with no queue to
// pass (it is in TakeQuiet's list): where this thread holds the GIL, tells
// Python now (on_quiet(tid, False)); else asks the interpreter's main
// thread to, at its next check for signals (never waiting for the GIL).
void QuietWithoutQueue(int64_t tid);
// Ids with an entry (tests: bounded by the ids in use).
size_t TrackedTargets();
void LifetimesAfterForkInChild();
template <typename Fn>
void ForEachQueue(Fn fn) {
  for (int32_t i = 0; i < kMaxDevices; ++i) {
    if (Queue* q = g_queues[i].load(std::memory_order_acquire)) fn(q);
  }
}

}  // namespace hostcb

extern "C" {
XLA_FFI_Error* HostcbTap(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HostcbCall(XLA_FFI_CallFrame* call_frame);     // call.cc
XLA_FFI_Error* HostcbCallOne(XLA_FFI_CallFrame* call_frame);  // call.cc
XLA_FFI_Error* HostcbNoop(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HostcbTapCuda(XLA_FFI_CallFrame* call_frame);      // cuda.cc
XLA_FFI_Error* HostcbCallCuda(XLA_FFI_CallFrame* call_frame);     // cuda.cc
XLA_FFI_Error* HostcbCallOneCuda(XLA_FFI_CallFrame* call_frame);  // cuda.cc
XLA_FFI_Error* HostcbTapV1(XLA_FFI_CallFrame* call_frame);        // named.cc
XLA_FFI_Error* HostcbCallV1(XLA_FFI_CallFrame* call_frame);       // named.cc
XLA_FFI_Error* HostcbTapCudaV1(XLA_FFI_CallFrame* call_frame);    // named.cc
XLA_FFI_Error* HostcbCallCudaV1(XLA_FFI_CallFrame* call_frame);   // named.cc
// The instantiate stage of hostcb_tap, hostcb_call and hostcb_call_one on
// CPU (lifetimes.cc).
XLA_FFI_Error* HostcbInstantiate(XLA_FFI_CallFrame* call_frame);
}
