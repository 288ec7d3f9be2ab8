// hostcb native engine, test build only: a simulated CUDA driver, for
// testing the GPU back end's host side (cuda.cc) on machines without a GPU.
//
// A simulated stream is a host thread that runs its operations in the
// order they were enqueued: a "device-to-host copy" is a memcpy (device
// pointers are host pointers here), a host function is called there, and
// cuStreamSynchronize waits until the thread has run everything enqueued.
// A stream can be paused, which holds back its operations as a busy GPU
// would, so tests can see what the host does before the stream catches up.
// Operations can be made to fail (fault injection).  Pinning counts bytes
// and changes nothing.
//
// Never used unless a test calls _use_fake_cuda() (engine_testing.cc).
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "cuda_api.h"
#include "cuda_fake.h"

namespace hostcb {
namespace cuda {

namespace {

constexpr CUresult kErrorInvalidValue = 1;
constexpr CUresult kErrorOutOfMemory = 2;
constexpr CUresult kErrorUnknown = 999;
// A synchronisation never waits longer than this (then fails), so that a
// test that forgot to resume a stream fails instead of hanging.
constexpr auto kSyncDeadline = std::chrono::seconds(60);

struct Stream {
  std::mutex mu;
  std::condition_variable work_cv, idle_cv;
  std::deque<std::function<void()>> ops;
  bool paused = false;
  bool busy = false;
  std::thread worker;

  Stream() {
    worker = std::thread([this] { Run(); });
    worker.detach();  // lives as long as the process
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      work_cv.wait(lock, [&] { return !ops.empty() && !paused; });
      std::function<void()> op = std::move(ops.front());
      ops.pop_front();
      busy = true;
      lock.unlock();
      op();
      lock.lock();
      busy = false;
      if (ops.empty()) idle_cv.notify_all();
    }
  }

  void Push(std::function<void()> op) {
    std::lock_guard<std::mutex> lock(mu);
    ops.push_back(std::move(op));
    work_cv.notify_one();
  }

  bool Sync() {
    std::unique_lock<std::mutex> lock(mu);
    return idle_cv.wait_for(lock, kSyncDeadline,
                            [&] { return ops.empty() && !busy; });
  }
};

std::mutex g_mu;  // the counters and failures below
FakeCounters g_counters;
FakeOp g_fail_op = FakeOp::kNone;
int g_fail_count = 0;
CUresult g_fail_code = kErrorUnknown;

// Whether this operation is to fail (and counts it).
bool Fails(FakeOp op) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_fail_op != op || g_fail_count <= 0) return false;
  --g_fail_count;
  return true;
}

CUresult DtoH(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  if (Fails(FakeOp::kCopy)) return g_fail_code;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_counters.copies;
  }
  static_cast<Stream*>(s)->Push([dst, src, n] {
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  });
  return kSuccess;
}

CUresult HtoD(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  if (Fails(FakeOp::kCopy)) return g_fail_code;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_counters.copies;
  }
  static_cast<Stream*>(s)->Push(
      [dst, src, n] { std::memcpy(reinterpret_cast<void*>(dst), src, n); });
  return kSuccess;
}

CUresult HostFunc(CUstream s, CUhostFn fn, void* user) {
  if (Fails(FakeOp::kHostFunc)) return g_fail_code;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_counters.host_functions;
  }
  static_cast<Stream*>(s)->Push([fn, user] { fn(user); });
  return kSuccess;
}

CUresult WriteValue(CUstream s, CUdeviceptr addr, uint64_t value, unsigned) {
  if (Fails(FakeOp::kWriteValue)) return g_fail_code;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_counters.word_writes;
  }
  static_cast<Stream*>(s)->Push([addr, value] {
    __atomic_store_n(reinterpret_cast<uint64_t*>(addr), value,
                     __ATOMIC_RELEASE);
  });
  return kSuccess;
}

// Registered host memory: the device's address is the host's (as with
// unified addressing).
CUresult DevicePointer(CUdeviceptr* d, void* p, unsigned) {
  *d = reinterpret_cast<CUdeviceptr>(p);
  return kSuccess;
}

CUresult Sync(CUstream s) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_counters.synchronizations;
  }
  return static_cast<Stream*>(s)->Sync() ? kSuccess : kErrorUnknown;
}

CUresult GetCtx(CUstream, CUcontext* ctx) {
  *ctx = nullptr;
  return kSuccess;
}

CUresult SetCurrent(CUcontext) { return kSuccess; }
CUresult Push(CUcontext) { return kSuccess; }
CUresult Pop(CUcontext* ctx) {
  *ctx = nullptr;
  return kSuccess;
}

CUresult Register(void*, size_t n, unsigned) {
  if (Fails(FakeOp::kRegister)) return g_fail_code;
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_counters.registrations;
  g_counters.registered_bytes += n;
  return kSuccess;
}

CUresult Unregister(void*) {
  if (Fails(FakeOp::kUnregister)) return g_fail_code;
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_counters.unregistrations;
  return kSuccess;
}

CUresult Alloc(void** p, size_t n, unsigned) {
  if (Fails(FakeOp::kAlloc)) return g_fail_code;
  *p = std::aligned_alloc(64, (n + 63) / 64 * 64);
  if (*p == nullptr) return kErrorOutOfMemory;
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_counters.pinned_allocations;
  return kSuccess;
}

CUresult Free(void* p) {
  std::free(p);
  return kSuccess;
}

CUresult Name(CUresult r, const char** name) {
  switch (r) {
    case kErrorInvalidValue:
      *name = "CUDA_ERROR_INVALID_VALUE";
      break;
    case kErrorOutOfMemory:
      *name = "CUDA_ERROR_OUT_OF_MEMORY";
      break;
    case kErrorUnknown:
      *name = "CUDA_ERROR_UNKNOWN";
      break;
    default:
      return kErrorInvalidValue;
  }
  return kSuccess;
}

const Api kFake = {DtoH,       HtoD, HostFunc, Sync,       GetCtx,
                   SetCurrent, Push, Pop,      Register,   Unregister,
                   Alloc,      Free, Name,     WriteValue, DevicePointer};

}  // namespace

const Api* FakeApi() { return &kFake; }

void* NewFakeStream() { return new Stream(); }

void PauseFakeStream(void* stream, bool paused) {
  auto* s = static_cast<Stream*>(stream);
  std::lock_guard<std::mutex> lock(s->mu);
  s->paused = paused;
  if (!paused) s->work_cv.notify_one();
}

size_t FakeStreamPending(void* stream) {
  auto* s = static_cast<Stream*>(stream);
  std::lock_guard<std::mutex> lock(s->mu);
  return s->ops.size() + (s->busy ? 1 : 0);
}

FakeCounters GetFakeCounters() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_counters;
}

void FailFake(FakeOp op, int count, int code) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_fail_op = op;
  g_fail_count = count;
  g_fail_code = code;
}

}  // namespace cuda
}  // namespace hostcb
