// hostcb native engine: the GPU (CUDA) back end of taps and calls.
//
// hostcb_tap (platform CUDA)
//   attrs: target_id (int64).  Operands: an optional token, then arrays in
//   GPU memory.  On the thread that runs the custom call, it reserves the
//   record in the queue of its GPU (the same queue.h ring as on CPU: the
//   bound, the order and the consumer are the engine's), and puts on the
//   handler's stream, after whatever the device computes before the tap:
//     1. one asynchronous device-to-host copy per operand, into the ring,
//     2. a write of the record's ready word (cuStreamWriteValue64), which
//        the consumer polls; where the driver cannot, a host function
//        (PublishRecord) that only marks the record ready and wakes the
//        consumer: no CUDA call, no Python, no allocation.
//   The record, and its ready word, are set up under a single hold of the
//   queue's mutex (its reservation), the pinner's table read there without
//   a lock of its own, except when the ring first reaches a chunk (then
//   the chunk is pinned with the mutex released).
//   Then it returns: the stream never waits for Python.  When the ring is
//   full the thread waits (on the host) for the consumer, which frees space
//   as the stream publishes records: nothing is dropped, and no stream work
//   depends on that wait.
//
//   The ring is ordinary anonymous memory; the pages a GPU copies into are
//   pinned (cuMemHostRegister) in chunks of kPinChunk bytes as the ring
//   first reaches them, so a ring costs only the memory its taps used; an
//   operand that crosses chunks is copied in one piece per chunk (a copy
//   over two registrations would be a pageable one).  A payload larger
//   than the whole ring (its own allocation) or a chunk the driver refuses
//   to pin is copied all the same, pageable (the driver then returns once
//   the copy is done).  The ring's pages are not inherited by a fork.
//
// hostcb_call / hostcb_call_one (platform CUDA)
//   Copies the operands into pinned staging memory on the stream, waits for
//   the stream (so also for every tap before it: their records are
//   published), runs the call's Python function on this thread exactly as
//   on CPU (CallOnHost: after the device's earlier taps; errors fail the
//   computation with the same text), copies the results back on the stream
//   and returns the staging memory to its pool from a host function.
//
// Neither handler declares the command-buffer trait, so XLA never captures
// them in a CUDA graph: each execution runs them, on the host, in order.
//
// Queues: a GPU's records go to the queue of key kGpuKeyBase + its local
// ordinal (the FFI DeviceOrdinal, JAX's local_hardware_id), never sharing
// a queue with a CPU device.
//
// The host function finds its record by (slot, seq) packed in its user
// data: slot indexes g_queues (12 bits, kMaxDevices), seq is the record's
// sequence number in that queue's FIFO, valid while the record is queued
// (it is: only the consumer pops it, after it is ready).
#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_api.h"
#include "engine.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hostcb {
namespace cuda {
namespace {

Api g_real;
std::atomic<const Api*> g_api{nullptr};
std::mutex g_load_mu;
std::string g_load_error;  // guarded by g_load_mu
bool g_load_tried = false;

template <typename T>
bool Sym(void* lib, const char* name, T* out, std::string* missing) {
  void* p = dlsym(lib, name);
  if (p == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *out = reinterpret_cast<T>(p);
  return true;
}

}  // namespace

const Api* Current() { return g_api.load(std::memory_order_acquire); }

std::string LoadCuda() {
  std::lock_guard<std::mutex> lock(g_load_mu);
  if (Current() != nullptr) return "";
  if (g_load_tried) return g_load_error;
  g_load_tried = true;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    g_load_error =
        std::string("the CUDA driver libcuda.so.1 cannot be loaded") +
        (why ? std::string(" (") + why + ")" : std::string());
    return g_load_error;
  }
  std::string missing;
  Api a{};
  Sym(lib, "cuMemcpyDtoHAsync_v2", &a.MemcpyDtoHAsync, &missing);
  Sym(lib, "cuMemcpyHtoDAsync_v2", &a.MemcpyHtoDAsync, &missing);
  Sym(lib, "cuLaunchHostFunc", &a.LaunchHostFunc, &missing);
  Sym(lib, "cuStreamSynchronize", &a.StreamSynchronize, &missing);
  Sym(lib, "cuStreamGetCtx", &a.StreamGetCtx, &missing);
  Sym(lib, "cuCtxSetCurrent", &a.CtxSetCurrent, &missing);
  Sym(lib, "cuCtxPushCurrent_v2", &a.CtxPushCurrent, &missing);
  Sym(lib, "cuCtxPopCurrent_v2", &a.CtxPopCurrent, &missing);
  Sym(lib, "cuMemHostRegister_v2", &a.MemHostRegister, &missing);
  Sym(lib, "cuMemHostUnregister", &a.MemHostUnregister, &missing);
  Sym(lib, "cuMemHostAlloc", &a.MemHostAlloc, &missing);
  Sym(lib, "cuMemFreeHost", &a.MemFreeHost, &missing);
  Sym(lib, "cuGetErrorName", &a.GetErrorName, &missing);
  // Optional: without them taps are published by host functions.
  std::string absent;
  if (!Sym(lib, "cuStreamWriteValue64_v2", &a.StreamWriteValue64, &absent)) {
    Sym(lib, "cuStreamWriteValue64", &a.StreamWriteValue64, &absent);
  }
  Sym(lib, "cuMemHostGetDevicePointer_v2", &a.MemHostGetDevicePointer, &absent);
  if (!missing.empty()) {
    g_load_error = "the CUDA driver libcuda.so.1 lacks " + missing +
                   " (a driver older than CUDA 10?)";
    return g_load_error;  // the library stays loaded: JAX uses it anyway
  }
  g_real = a;
  g_api.store(&g_real, std::memory_order_release);
  return "";
}

std::string ErrorName(CUresult r) {
  const Api* api = Current();
  const char* name = nullptr;
  if (api != nullptr && api->GetErrorName(r, &name) == kSuccess && name) {
    return name;
  }
  return "CUDA error " + std::to_string(r);
}

#ifdef HOSTCB_TEST_BUILD
void UseFakeCuda() {
  std::lock_guard<std::mutex> lock(g_load_mu);
  g_api.store(FakeApi(), std::memory_order_release);
}
#endif

}  // namespace cuda

namespace {

using cuda::CUresult;
using cuda::CUstream;

ffi::Error CudaFailure(const char* what, CUresult r) {
  return ffi::Error(
      ffi::ErrorCode::kInternal,
      std::string("hostcb: ") + what + " failed: " + cuda::ErrorName(r));
}

// Runs `op` (a driver call); if the thread has no current context, makes
// the stream's context current and runs it again.  XLA's threads normally
// have it: this costs nothing then.
template <typename Op>
CUresult WithContext(const cuda::Api* api, CUstream stream, Op op) {
  CUresult r = op();
  if (r == cuda::kErrorInvalidContext && stream != nullptr) {
    cuda::CUcontext ctx = nullptr;
    if (api->StreamGetCtx(stream, &ctx) == cuda::kSuccess &&
        api->CtxSetCurrent(ctx) == cuda::kSuccess) {
      r = op();
    }
  }
  return r;
}

// ------------------------------------------------------------- pinning
// Pins the pages of a GPU queue's ring as the ring first reaches them.
constexpr uint64_t kPinChunk = 2 << 20;

class RingPinner : public RingHooks {
 public:
  // The pinner's table (which chunks of the current ring are pinned, and
  // their device addresses) is written under mu_ and read by producers
  // without it (PinnedLocked), under the queue's mutex instead: the entries
  // are atomics, each set once per ring (unpinned -> pinned or refused);
  // the table is replaced only for a new ring (Ensure, once its first
  // record is reserved: no producer holds a record in another ring then)
  // or cleared by BeforeUnmap (the queue's mutex held, the queue empty), so
  // a producer that found base_ == its ring (acquire) reads a table that
  // stays in place while it holds its record.

  // Whether every chunk of [p, p + n) (within the ring at `base`) is known
  // (pinned or refused) already; then *word_device is the device address
  // of `word` (within [p, p + n); nullptr: none) if its chunk is pinned
  // and mapped for the device, else 0.  Takes no lock and makes no CUDA
  // call: a producer calls it with the queue's mutex held, from its
  // reservation (false: it calls Ensure after unlocking).
  bool PinnedLocked(const uint8_t* base, const uint8_t* p, uint64_t n,
                    const uint8_t* word, cuda::CUdeviceptr* word_device) {
    *word_device = 0;
    if (n == 0) return true;
    if (base_.load(std::memory_order_acquire) != base) return false;
    const uint64_t first = static_cast<uint64_t>(p - base) / kPinChunk;
    const uint64_t last = (static_cast<uint64_t>(p - base) + n - 1) / kPinChunk;
    for (uint64_t c = first; c <= last && c < chunks_; ++c) {
      if (state_[c].load(std::memory_order_acquire) == kUnpinned) return false;
    }
    *word_device = WordDevice(base, word);
    return true;
  }

  // Pins the chunks of [p, p + n) within the ring [base, base + size);
  // best effort (a chunk the driver refuses stays pageable).  Called
  // without the queue's mutex, by a producer that holds a record there (so
  // the ring stays mapped), where PinnedLocked found a chunk not yet pinned.
  // Returns the device address of `word` (within [p, p + n)) if its chunk
  // is pinned and mapped for the device, else 0.
  cuda::CUdeviceptr Ensure(const cuda::Api* api, CUstream stream, uint8_t* base,
                           uint64_t size, uint8_t* p, uint64_t n,
                           const uint8_t* word) {
    if (n == 0) return 0;
    const uint64_t first = static_cast<uint64_t>(p - base) / kPinChunk;
    const uint64_t last = (static_cast<uint64_t>(p - base) + n - 1) / kPinChunk;
    std::lock_guard<std::mutex> lock(mu_);
    if (base_.load(std::memory_order_relaxed) != base) {
      // A new ring (its first use, or after a remap).
      chunks_ = (size + kPinChunk - 1) / kPinChunk;
      state_.reset(new std::atomic<uint8_t>[chunks_]);
      device_.reset(new std::atomic<cuda::CUdeviceptr>[chunks_]);
      for (uint64_t c = 0; c < chunks_; ++c) {
        state_[c].store(kUnpinned, std::memory_order_relaxed);
        device_[c].store(0, std::memory_order_relaxed);
      }
      // A forked child must not share pages the device writes into.
      madvise(base, size, MADV_DONTFORK);
      base_.store(base, std::memory_order_release);
    }
    for (uint64_t c = first; c <= last && c < chunks_; ++c) {
      if (state_[c].load(std::memory_order_relaxed) != kUnpinned) continue;
      const uint64_t off = c * kPinChunk;
      const uint64_t len = std::min(kPinChunk, size - off);
      CUresult r = WithContext(api, stream, [&] {
        return api->MemHostRegister(
            base + off, len,
            cuda::kMemHostRegisterPortable | cuda::kMemHostRegisterDeviceMap);
      });
      // Not "already registered" either: that range is someone else's.
      if (r != cuda::kSuccess) {
        if (refusal_ == cuda::kSuccess) refusal_ = r;
        state_[c].store(kRefused, std::memory_order_release);
        continue;
      }
      pinned_bytes_ += len;
      if (ctx_ == nullptr) api->StreamGetCtx(stream, &ctx_);
      // Where the stream may write the chunk's ready words (0: it cannot;
      // its taps are published by host functions).
      cuda::CUdeviceptr d = 0;
      if (api->MemHostGetDevicePointer != nullptr &&
          WithContext(api, stream, [&] {
            return api->MemHostGetDevicePointer(&d, base + off, 0);
          }) != cuda::kSuccess) {
        d = 0;
      }
      device_[c].store(d, std::memory_order_relaxed);
      state_[c].store(kPinned, std::memory_order_release);  // after device_
    }
    return WordDevice(base, word);
  }

  bool BeforeUnmap(Queue*, uint8_t* ring, uint64_t) override {
    // The queue is empty and its mutex held (queue.h: no host function of
    // this queue is pending, so the driver waits for nothing that needs it).
    // This thread (the consumer's, or Python's) may have no current
    // context: the one that pinned the pages is pushed for the unpinning.
    std::lock_guard<std::mutex> lock(mu_);
    uint8_t* const base = base_.load(std::memory_order_relaxed);
    if (ring != base) return true;
    const cuda::Api* api = cuda::Current();
    bool all = true;
    if (pinned_bytes_ > 0) {
      cuda::CUcontext popped = nullptr;
      const bool pushed =
          ctx_ != nullptr && api->CtxPushCurrent(ctx_) == cuda::kSuccess;
      for (uint64_t c = 0; c < chunks_; ++c) {
        if (state_[c].load(std::memory_order_relaxed) == kPinned &&
            api->MemHostUnregister(base + c * kPinChunk) != cuda::kSuccess) {
          all = false;
        }
      }
      if (pushed) api->CtxPopCurrent(&popped);
    }
    // No producer reads the table now (the queue is empty, its mutex held).
    base_.store(nullptr, std::memory_order_relaxed);
    state_.reset();
    device_.reset();
    chunks_ = 0;
    pinned_bytes_ = 0;
    // Pages still registered must stay mapped: the driver would otherwise
    // keep them for a later mapping at the same address.
    return all;
  }

  // Bytes from p to the end of its chunk (the longest piece of a copy that
  // one registration covers).
  static uint64_t ToChunkEnd(const uint8_t* base, const uint8_t* p) {
    return kPinChunk - static_cast<uint64_t>(p - base) % kPinChunk;
  }

  uint64_t pinned_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return pinned_bytes_;
  }

  // The driver's answer to the first chunk it refused to pin (its copies
  // went through pageable memory), or kSuccess.
  CUresult refusal() {
    std::lock_guard<std::mutex> lock(mu_);
    return refusal_;
  }

 private:
  enum : uint8_t { kUnpinned, kPinned, kRefused };

  // The device address of `word` in the current ring (see PinnedLocked).
  cuda::CUdeviceptr WordDevice(const uint8_t* base, const uint8_t* word) {
    if (word == nullptr) return 0;
    const uint64_t w = static_cast<uint64_t>(word - base);
    const uint64_t c = w / kPinChunk;
    if (c >= chunks_ || state_[c].load(std::memory_order_acquire) != kPinned) {
      return 0;
    }
    const cuda::CUdeviceptr d = device_[c].load(std::memory_order_relaxed);
    return d == 0 ? 0 : d + w % kPinChunk;
  }

  std::mutex mu_;  // writers of the table below; pinned_bytes_, refusal_
  // The ring the table describes (nullptr: none).
  std::atomic<uint8_t*> base_{nullptr};
  cuda::CUcontext ctx_ = nullptr;  // the context the pages were pinned in
  uint64_t chunks_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // per chunk
  // Per pinned chunk, its device address, or 0.
  std::unique_ptr<std::atomic<cuda::CUdeviceptr>[]> device_;
  uint64_t pinned_bytes_ = 0;
  CUresult refusal_ = cuda::kSuccess;
};

std::atomic<RingPinner*> g_pinners[kMaxDevices];
std::mutex g_pinners_mu;

RingPinner* PinnerOf(Queue* q) {
  RingPinner* p = g_pinners[q->slot()].load(std::memory_order_acquire);
  if (p != nullptr) return p;
  std::lock_guard<std::mutex> lock(g_pinners_mu);
  p = g_pinners[q->slot()].load(std::memory_order_acquire);
  if (p == nullptr) {
    p = new RingPinner();  // lives as long as the queue (the process)
    q->SetRingHooks(p);
    g_pinners[q->slot()].store(p, std::memory_order_release);
  }
  return p;
}

// ---------------------------------------------------------- publishing
// The driver's refusal of the first ready word a stream was asked to write
// (cuStreamWriteValue64), or 0: taps are then published by host functions.
std::atomic<CUresult> g_words_refused{cuda::kSuccess};

void* PackRecord(const Queue* q, uint64_t seq) {
  return reinterpret_cast<void*>(
      static_cast<uintptr_t>((seq << 12) | static_cast<uint64_t>(q->slot())));
}

// The host function of a tap: its copies are done; the record is ready.
void PublishRecord(void* user_data) {
  const auto packed = reinterpret_cast<uintptr_t>(user_data);
  Queue* q =
      g_queues[packed & (kMaxDevices - 1)].load(std::memory_order_acquire);
  if (q != nullptr) q->Commit(static_cast<uint64_t>(packed) >> 12, false);
}

static_assert(kMaxDevices == 1 << 12, "PackRecord keeps the slot in 12 bits");

// ------------------------------------------------------------ a GPU tap
// A tap's record, reserved in its GPU's queue: where its bytes go, and how
// the stream publishes it.
struct GpuTap {
  Queue::Reservation r;
  TapLayout layout;
  uint8_t* base = nullptr;  // the queue's ring
  uint64_t size = 0;
  // Not in the ring: an oversize record's own (pageable) allocation.
  bool in_ring = false;
  // The ready word after the payload (nullptr: a host function publishes
  // the record), and where the stream can write it (0: it cannot).
  uint64_t* word = nullptr;
  cuda::CUdeviceptr word_device = 0;
};

// Attaches the tap's ready word to its record, the queue's mutex held.
// The ring's bytes there may hold an earlier record's: cleared before the
// consumer can see the word, and before the stream can write it.
void AwaitWordLocked(Queue* q, const GpuTap& t) {
  __atomic_store_n(t.word, uint64_t{0}, __ATOMIC_RELAXED);
  q->AwaitWordLocked(t.r, t.word);
}

// Reserves the tap's record in the queue (waiting for space there) and
// sets up its ready word where the stream can write it: still under the
// reservation's lock (one lock per tap) where the record's chunks are
// pinned already (always but the first time the ring reaches a chunk),
// else once they are pinned (CUDA calls, the lock released first).
// Returns with `lock` released.
ffi::Error ReserveGpuTap(const cuda::Api* api, CUstream stream, Queue* q,
                         RingPinner* pinner, int64_t target_id,
                         const XLA_FFI_Args* args, size_t first, bool by_word,
                         std::unique_lock<std::mutex>& lock, GpuTap* t) {
  // Room for the ready word after the payload (queue.h).
  const uint64_t word_bytes = by_word ? kAlign : 0;
  // Into locals first: no pointer into *t leaves the inlined steps, so
  // that its fields can stay in registers.
  TapLayout layout;
  Queue::Reservation r;
  ffi::Error e = ReserveTap(q, target_id, args, first, &layout, lock, &r,
                            Queue::kNoOwnBlock, word_bytes);
  if (e.failure()) return e;
  t->layout = layout;
  t->r = r;
  std::tie(t->base, t->size) = q->RingLocked(lock);
  t->in_ring = t->base != nullptr && t->r.data >= t->base &&
               t->r.data < t->base + t->size;
  if (by_word) {
    t->word = reinterpret_cast<uint64_t*>(t->r.data + t->layout.payload);
  }
  const uint64_t bytes = t->layout.payload + word_bytes;
  const auto* word = reinterpret_cast<const uint8_t*>(t->word);
  const bool pinned =
      !t->in_ring ||
      pinner->PinnedLocked(t->base, t->r.data, bytes, word, &t->word_device);
  if (t->word_device != 0) AwaitWordLocked(q, *t);
  lock.unlock();  // no CUDA call with the queue's mutex held (queue.h)
  if (pinned) return ffi::Error::Success();
  // The ring reached a chunk not pinned yet: pinned now (CUDA calls),
  // then the word set up under the queue's mutex again.
  t->word_device =
      pinner->Ensure(api, stream, t->base, t->size, t->r.data, bytes, word);
  if (t->word_device != 0) {
    lock = q->Relock();
    AwaitWordLocked(q, *t);
    lock.unlock();
  }
  return ffi::Error::Success();
}

// Puts the copies of the tap's operands into its record on the stream,
// after whatever the device computes before the tap.  Returns the driver's
// refusal of the first that failed, or kSuccess.
CUresult CopyOperands(const cuda::Api* api, CUstream stream, const GpuTap& t,
                      const XLA_FFI_Args* args, size_t first) {
  CUresult failed = cuda::kSuccess;
  WritePayload(
      t.r.data, args, first, t.layout.header,
      [&](uint8_t* dst, const void* src, uint64_t n) {
        // In the ring, one copy per pinned chunk: a copy that
        // spans two registrations would be a pageable one.
        auto from = reinterpret_cast<cuda::CUdeviceptr>(src);
        while (n > 0 && failed == cuda::kSuccess) {
          const uint64_t piece =
              t.in_ring ? std::min(n, RingPinner::ToChunkEnd(t.base, dst)) : n;
          failed = WithContext(api, stream, [&] {
            return api->MemcpyDtoHAsync(dst, from, piece, stream);
          });
          dst += piece;
          from += piece;
          n -= piece;
        }
        return failed == cuda::kSuccess;
      });
  return failed;
}

// Asks the stream to write the tap's ready word after its copies: the
// default flags order the write after them, with a memory barrier (their
// bytes are visible first).  False where this driver or device cannot:
// host functions publish from now on (this record's too: its commit makes
// it ready although its word stays 0), said once
// (hostcb.engine.gpu_publication() says it too).
bool WriteReadyWord(const cuda::Api* api, CUstream stream,
                    cuda::CUdeviceptr word_device) {
  const CUresult failed = WithContext(api, stream, [&] {
    return api->StreamWriteValue64(stream, word_device, 1, 0);
  });
  if (failed == cuda::kSuccess) return true;
  CUresult none = cuda::kSuccess;
  if (g_words_refused.compare_exchange_strong(none, failed)) {
    std::fprintf(stderr,
                 "hostcb: the CUDA driver refused cuStreamWriteValue64 "
                 "(%s): GPU taps are published by host functions from now "
                 "on, which make the stream wait for the host at each tap. "
                 "A driver with stream memory operations (CUDA 11.7 or "
                 "newer) avoids that.\n",
                 cuda::ErrorName(failed).c_str());
  }
  return false;
}

}  // namespace

Queue* GpuQueue(int32_t ordinal) {
  if (ordinal < 0 || ordinal >= kMaxGpuOrdinal) return nullptr;
  return GetQueue(kGpuKeyBase + ordinal);
}

ffi::Error TapOnStream(void* stream, int32_t ordinal, int64_t target_id,
                       const XLA_FFI_Args* args, size_t first) {
  const cuda::Api* api = cuda::Current();
  if (api == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "hostcb: the CUDA driver is not loaded");
  }
  Queue* q = GpuQueue(ordinal);
  if (q == nullptr) return OutOfRange(ordinal);
  RingPinner* pinner = PinnerOf(q);
  // By a ready word where the stream can write it: then no host function
  // publishes the record.
  const bool by_word = api->StreamWriteValue64 != nullptr &&
                       g_words_refused.load(std::memory_order_relaxed) == 0;
  std::unique_lock<std::mutex> lock;
  GpuTap t;
  ffi::Error e = ReserveGpuTap(api, stream, q, pinner, target_id, args, first,
                               by_word, lock, &t);
  if (e.failure()) return e;
  const char* what = "an asynchronous device-to-host copy (cuMemcpyDtoHAsync)";
  CUresult failed = CopyOperands(api, stream, t, args, first);
  if (failed == cuda::kSuccess && t.word_device != 0 &&
      WriteReadyWord(api, stream, t.word_device)) {
    return ffi::Error::Success();
  }
  if (failed == cuda::kSuccess) {
    what = "launching the tap's host function (cuLaunchHostFunc)";
    failed = WithContext(api, stream, [&] {
      return api->LaunchHostFunc(stream, &PublishRecord,
                                 PackRecord(q, t.r.seq));
    });
    if (failed == cuda::kSuccess) return ffi::Error::Success();
  }
  // The record cannot be published by the stream: once the copies already
  // on it are done, it goes through as a lost tap (the queue never stalls,
  // and the next barrier reports it), and the computation fails.
  api->StreamSynchronize(stream);
  lock.lock();
  q->MarkLostLocked(t.r);
  q->CommitLocked(t.r, true);
  return CudaFailure(what, failed);
}

namespace {

// ---------------------------------------------------------- call staging
// Pinned host buffers for calls' operands and results, reused: taken by a
// call, given back once the stream has copied the results out of it.  The
// stream says so by writing the buffer's done word (after its data), where
// the driver can (as taps' ready words, queue.h): the pool takes back such
// a buffer once its word reads nonzero.  Elsewhere a host function gives
// it back.
struct Staging {
  uint8_t* data;
  uint64_t size;
  uint64_t* done;                 // the done word, after the data
  cuda::CUdeviceptr done_device;  // where the stream writes it, or 0
  Staging* next = nullptr;        // in the pool's list of given-back ones
};

class StagingPool {
 public:
  // A buffer of at least n bytes (nullptr data with the error in *r).
  Staging* Take(const cuda::Api* api, CUstream stream, uint64_t n,
                CUresult* r) {
    *r = cuda::kSuccess;
    std::vector<Staging*> surplus;
    Staging* found = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ReclaimLocked();
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i]->size >= n) {
          found = free_[i];
          free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
      // Too many idle small ones: free the smallest (outside the lock, and
      // never from a host function).
      if (found == nullptr && free_.size() >= kKept) {
        surplus.push_back(free_.front());
        free_.erase(free_.begin());
      }
    }
    for (Staging* s : surplus) {
      WithContext(api, stream, [&] { return api->MemFreeHost(s->data); });
      delete s;
    }
    if (found != nullptr) return found;
    uint64_t size = kMinSize;
    while (size < n) size *= 2;
    void* p = nullptr;
    *r = WithContext(api, stream, [&] {
      return api->MemHostAlloc(
          &p, size + kAlign,
          cuda::kMemHostAllocPortable | cuda::kMemHostAllocDeviceMap);
    });
    if (*r != cuda::kSuccess) return nullptr;
    auto* s = new Staging{
        static_cast<uint8_t*>(p), size,
        reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(p) + size), 0};
    if (api->MemHostGetDevicePointer != nullptr &&
        WithContext(api, stream, [&] {
          return api->MemHostGetDevicePointer(&s->done_device, s->done, 0);
        }) != cuda::kSuccess) {
      s->done_device = 0;
    }
    return s;
  }

  void Give(Staging* s) {
    std::lock_guard<std::mutex> lock(mu_);
    GiveLocked(s);
  }

  // Given back once its done word reads nonzero (the stream writes it).
  // Takes no lock (a call takes the pool's mutex once, in Take): pushed
  // onto a list that the next Take moves into in_flight_ (a push-only
  // stack emptied whole by an exchange has no ABA problem).
  void GiveWhenDone(Staging* s) {
    s->next = given_.load(std::memory_order_relaxed);
    while (!given_.compare_exchange_weak(s->next, s, std::memory_order_release,
                                         std::memory_order_relaxed)) {
    }
  }

 private:
  void GiveLocked(Staging* s) {
    // Kept sorted by size, smallest first.
    auto it = free_.begin();
    while (it != free_.end() && (*it)->size < s->size) ++it;
    free_.insert(it, s);
  }

  void ReclaimLocked() {
    for (Staging* s = given_.exchange(nullptr, std::memory_order_acquire);
         s != nullptr;) {
      Staging* next = s->next;
      in_flight_.push_back(s);
      s = next;
    }
    for (size_t i = 0; i < in_flight_.size();) {
      Staging* s = in_flight_[i];
      if (__atomic_load_n(s->done, __ATOMIC_ACQUIRE) != 0) {
        in_flight_[i] = in_flight_.back();
        in_flight_.pop_back();
        GiveLocked(s);
      } else {
        ++i;
      }
    }
  }

  static constexpr uint64_t kMinSize = 64 << 10;
  static constexpr size_t kKept = 8;
  std::mutex mu_;
  std::vector<Staging*> free_;
  std::vector<Staging*> in_flight_;       // the stream has yet to write `done`
  std::atomic<Staging*> given_{nullptr};  // GiveWhenDone's, for in_flight_
};

// Never destroyed: a host function may still give a buffer back while the
// process exits.
StagingPool& g_staging = *new StagingPool();

// Watches *word until it reads nonzero (true), for at most kSpin.
constexpr auto kSpin = std::chrono::milliseconds(2);
bool SpinUntilNonzero(const uint64_t* word) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (uint32_t n = 1;; ++n) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != 0) return true;
    if (n % 64 == 0 && std::chrono::steady_clock::now() > until) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
}

void GiveBackStaging(void* user_data) {
  g_staging.Give(static_cast<Staging*>(user_data));
}

// Asks the stream to write the staging's done word after what it was given
// so far (no host function: the stream never waits for the host); false
// where it cannot.
bool WriteDoneWord(const cuda::Api* api, CUstream stream, Staging* staging) {
  if (staging->done_device == 0 ||
      g_words_refused.load(std::memory_order_relaxed) != cuda::kSuccess) {
    return false;
  }
  __atomic_store_n(staging->done, uint64_t{0}, __ATOMIC_RELAXED);
  return WithContext(api, stream, [&] {
           return api->StreamWriteValue64(stream, staging->done_device, 1, 0);
         }) == cuda::kSuccess;
}

// ------------------------------------------------------------ a GPU call
// A call's operands and results as the host sees them: copies of their
// buffers' descriptions (operands first), each pointing into the staging
// memory once StageOperands has run.
struct HostBuffers {
  HostBuffers(size_t args, size_t rets)
      : n_args(args), n_rets(rets), bufs(args + rets), ptrs(args + rets) {}

  const size_t n_args;
  const size_t n_rets;
  std::vector<XLA_FFI_Buffer> bufs;
  std::vector<void*> ptrs;  // to bufs
  uint64_t total = 0;       // the staging bytes they need
};

// Copies the descriptions of args[first_arg:] and rets[first_ret:], which
// must all be buffers, into `h` (made for that many).
ffi::Error DescribeBuffers(const XLA_FFI_Args* args, size_t first_arg,
                           const XLA_FFI_Rets* rets, size_t first_ret,
                           HostBuffers* h) {
  // Locals, not *h's fields, in the loop: its stores into the buffers'
  // descriptions would make the compiler read those again.
  const size_t n_args = h->n_args;
  const size_t n = n_args + h->n_rets;
  XLA_FFI_Buffer* const bufs = h->bufs.data();
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool is_arg = i < n_args;
    const bool is_buffer =
        is_arg ? args->types[first_arg + i] == XLA_FFI_ArgType_BUFFER
               : rets->types[first_ret + i - n_args] == XLA_FFI_RetType_BUFFER;
    if (!is_buffer) {
      return ffi::Error::InvalidArgument(
          "hostcb: a call's operands and results must be buffers");
    }
    const auto* b = static_cast<const XLA_FFI_Buffer*>(
        is_arg ? args->args[first_arg + i]
               : rets->rets[first_ret + i - n_args]);
    bufs[i] = *b;
    h->ptrs[i] = &bufs[i];
    if (b->dtype != XLA_FFI_DataType_TOKEN) total += AlignUp(BufferBytes(b));
  }
  h->total = total;
  return ffi::Error::Success();
}

// Points every buffer of `h` into the staging memory and puts the copies of
// the operands there on the stream.  Returns the driver's refusal of the
// first copy that failed, or kSuccess.
CUresult StageOperands(const cuda::Api* api, CUstream stream,
                       const Staging* staging, HostBuffers* h) {
  const size_t n_args = h->n_args;  // locals, as in DescribeBuffers
  const size_t n = n_args + h->n_rets;
  XLA_FFI_Buffer* const bufs = h->bufs.data();
  uint64_t offset = 0;
  CUresult r = cuda::kSuccess;
  for (size_t i = 0; i < n; ++i) {
    XLA_FFI_Buffer& b = bufs[i];
    if (b.dtype == XLA_FFI_DataType_TOKEN) continue;
    void* device_data = b.data;
    b.data = staging->data + offset;
    const uint64_t nbytes = BufferBytes(&b);
    offset += AlignUp(nbytes);
    if (i < n_args && nbytes && r == cuda::kSuccess) {
      r = WithContext(api, stream, [&] {
        return api->MemcpyDtoHAsync(
            b.data, reinterpret_cast<cuda::CUdeviceptr>(device_data), nbytes,
            stream);
      });
    }
  }
  return r;
}

// Returns once the operands are in the staging memory (then every tap
// before the call is published too).  The stream says so by writing the
// staging's done word after the copies, which this thread watches for a
// while (no driver wake-up); past kSpin, or where the driver cannot write
// words, it synchronizes with the stream (which also reports a failed
// stream: its error is returned).
CUresult AwaitOperands(const cuda::Api* api, CUstream stream,
                       Staging* staging) {
  if (WriteDoneWord(api, stream, staging) && SpinUntilNonzero(staging->done)) {
    return cuda::kSuccess;
  }
  return WithContext(api, stream,
                     [&] { return api->StreamSynchronize(stream); });
}

// Runs the call's Python function on this thread exactly as on CPU, with
// the staged operands and results (CallOnHost).
ffi::Error RunOnHost(bool one_array, int32_t key, int64_t target_id,
                     HostBuffers* h) {
  std::vector<XLA_FFI_ArgType> arg_types(h->n_args, XLA_FFI_ArgType_BUFFER);
  std::vector<XLA_FFI_RetType> ret_types(h->n_rets, XLA_FFI_RetType_BUFFER);
  XLA_FFI_Args host_args{};
  host_args.struct_size = sizeof(XLA_FFI_Args);
  host_args.size = static_cast<int64_t>(h->n_args);
  host_args.types = arg_types.data();
  host_args.args = h->ptrs.data();
  XLA_FFI_Rets host_rets{};
  host_rets.struct_size = sizeof(XLA_FFI_Rets);
  host_rets.size = static_cast<int64_t>(h->n_rets);
  host_rets.types = ret_types.data();
  host_rets.rets = h->ptrs.data() + h->n_args;
  return CallOnHost(one_array, key, target_id, &host_args, 0, &host_rets, 0);
}

// Puts the copies of the staged results into the call's result buffers on
// the stream.  Returns the driver's refusal of the first copy that failed,
// or kSuccess.
CUresult CopyResults(const cuda::Api* api, CUstream stream,
                     const HostBuffers& h, const XLA_FFI_Rets* rets,
                     size_t first_ret) {
  for (size_t k = 0; k < h.n_rets; ++k) {
    const XLA_FFI_Buffer& b = h.bufs[h.n_args + k];
    if (b.dtype == XLA_FFI_DataType_TOKEN) continue;
    const auto* out =
        static_cast<const XLA_FFI_Buffer*>(rets->rets[first_ret + k]);
    if (const uint64_t nbytes = BufferBytes(&b)) {
      const CUresult r = WithContext(api, stream, [&] {
        return api->MemcpyHtoDAsync(
            reinterpret_cast<cuda::CUdeviceptr>(out->data), b.data, nbytes,
            stream);
      });
      if (r != cuda::kSuccess) return r;
    }
  }
  return cuda::kSuccess;
}

}  // namespace

ffi::Error CallOnStream(bool one_array, void* stream, int32_t ordinal,
                        int64_t target_id, const XLA_FFI_Args* args,
                        size_t first_arg, const XLA_FFI_Rets* rets,
                        size_t first_ret) {
  const cuda::Api* api = cuda::Current();
  if (api == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "hostcb: the CUDA driver is not loaded");
  }
  if (ordinal < 0 || ordinal >= kMaxGpuOrdinal) return OutOfRange(ordinal);
  HostBuffers h(static_cast<size_t>(args->size) - first_arg,
                static_cast<size_t>(rets->size) - first_ret);
  ffi::Error e = DescribeBuffers(args, first_arg, rets, first_ret, &h);
  if (e.failure()) return e;
  CUresult r;
  Staging* staging = g_staging.Take(api, stream, h.total, &r);
  if (staging == nullptr) {
    return CudaFailure("allocating pinned memory (cuMemHostAlloc)", r);
  }
  r = StageOperands(api, stream, staging, &h);
  if (r != cuda::kSuccess) {
    api->StreamSynchronize(stream);
    g_staging.Give(staging);
    return CudaFailure("copying a call's operands (cuMemcpyDtoHAsync)", r);
  }
  r = AwaitOperands(api, stream, staging);
  if (r != cuda::kSuccess) {
    g_staging.Give(staging);
    return CudaFailure("waiting for the stream (cuStreamSynchronize)", r);
  }
  e = RunOnHost(one_array, kGpuKeyBase + ordinal, target_id, &h);
  if (e.failure()) {
    g_staging.Give(staging);  // nothing of it is on the stream
    return e;
  }
  r = CopyResults(api, stream, h, rets, first_ret);
  // The staging comes back once the stream has copied the results out of
  // it: by its done word, else by a host function.
  if (r == cuda::kSuccess && WriteDoneWord(api, stream, staging)) {
    g_staging.GiveWhenDone(staging);
    return ffi::Error::Success();
  }
  if (r == cuda::kSuccess) {
    r = WithContext(api, stream, [&] {
      return api->LaunchHostFunc(stream, &GiveBackStaging, staging);
    });
    if (r == cuda::kSuccess) return ffi::Error::Success();
  }
  api->StreamSynchronize(stream);
  g_staging.Give(staging);
  return CudaFailure("copying a call's results (cuMemcpyHtoDAsync)", r);
}

void ForgetGpuStateAfterFork() {
  // The child has no CUDA context of its parent; the pinners (leaked) knew
  // the parent's queues, which ResetAfterFork forgets too.
  new (&g_pinners_mu) std::mutex();
  for (auto& p : g_pinners) p.store(nullptr, std::memory_order_relaxed);
}

namespace {
RingPinner* PinnerOf(int32_t ordinal) {
  Queue* q = ordinal >= 0 && ordinal < kMaxGpuOrdinal
                 ? FindQueue(kGpuKeyBase + ordinal)
                 : nullptr;
  return q == nullptr ? nullptr
                      : g_pinners[q->slot()].load(std::memory_order_acquire);
}
}  // namespace

uint64_t GpuPinnedBytes(int32_t ordinal) {
  RingPinner* p = PinnerOf(ordinal);
  return p == nullptr ? 0 : p->pinned_bytes();
}

std::string GpuPinRefusal(int32_t ordinal) {
  RingPinner* p = PinnerOf(ordinal);
  const CUresult r = p == nullptr ? cuda::kSuccess : p->refusal();
  return r == cuda::kSuccess ? std::string() : cuda::ErrorName(r);
}

std::string GpuPublication() {
  const cuda::Api* api = cuda::Current();
  if (api == nullptr) return "the CUDA driver is not loaded";
  if (api->StreamWriteValue64 == nullptr ||
      api->MemHostGetDevicePointer == nullptr) {
    return "the CUDA driver lacks cuStreamWriteValue64 or "
           "cuMemHostGetDevicePointer";
  }
  const CUresult r = g_words_refused.load(std::memory_order_relaxed);
  if (r != cuda::kSuccess) {
    return "the CUDA driver refused cuStreamWriteValue64 (" +
           cuda::ErrorName(r) + ")";
  }
  return "";
}

#ifdef HOSTCB_TEST_BUILD
void SetGpuWordsRefused(int code) {
  g_words_refused.store(code, std::memory_order_relaxed);
}
#endif

namespace {

ffi::Error TapCudaImpl(void* stream, int32_t ordinal, int64_t target_id,
                       ffi::RemainingArgs args, ffi::RemainingRets rets) {
  RawRets rr(rets);
  RawArgs ra(args);
  ffi::Error e = CheckOnlyTokens(ra.raw(), rr.raw(), rr.first());
  if (e.failure()) return e;
  return TapOnStream(stream, ordinal, target_id, ra.raw(), ra.first());
}

template <bool kOneArray>
ffi::Error CallCudaImpl(void* stream, int32_t ordinal, int64_t target_id,
                        ffi::RemainingArgs args, ffi::RemainingRets rets) {
  RawArgs ra(args);
  RawRets rr(rets);
  return CallOnStream(kOneArray, stream, ordinal, target_id, ra.raw(),
                      ra.first(), rr.raw(), rr.first());
}

auto CudaBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<void*>>()
      .Ctx<ffi::DeviceOrdinal>()
      .Attr<int64_t>("target_id")
      .RemainingArgs()
      .RemainingRets();
}

}  // namespace
}  // namespace hostcb

XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbTapCuda, hostcb::TapCudaImpl,
                              hostcb::CudaBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbCallCuda, hostcb::CallCudaImpl<false>,
                              hostcb::CudaBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(HostcbCallOneCuda, hostcb::CallCudaImpl<true>,
                              hostcb::CudaBinding());
