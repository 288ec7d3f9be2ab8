// hostcb native tap engine: state shared by the FFI handlers (handlers.cc)
// and the CPython module (module.cc), compiled into one extension.
#pragma once

#include <atomic>
#include <cstdint>

#include "queue.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace hostcb {

// At most this many device queues (any non-negative device ordinals).
constexpr int32_t kMaxDevices = 4096;
// XLA_FFI_DataType codes are small integers; see c_api.h.
constexpr int kMaxDtype = 64;

// The queue of a device ordinal, created on first use with the current
// default capacity; nullptr if the ordinal is out of range.
Queue* GetQueue(int32_t device);
// The queue if it already exists.
Queue* FindQueue(int32_t device);
// Sets the default capacity and that of every existing queue.
void SetCapacityAll(uint64_t bytes);
// Calls fn on every existing queue.
template <typename Fn> void ForEachQueue(Fn fn);
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

// The queue whose consumer runs on this thread (set by run_batch).  A tap
// produced on that thread (a tap function whose computation XLA runs inline)
// never waits for space, since only this thread frees it.
extern thread_local Queue* tl_consumer_queue;

extern std::atomic<Queue*> g_queues[kMaxDevices];

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

template <typename Fn> void ForEachQueue(Fn fn) {
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
}
