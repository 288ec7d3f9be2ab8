// A micro-benchmark of the host side of a GPU tap (cuda.cc's TapOnStream)
// or call (CallOnStream): the CPU time that the thread running the
// hostcb_tap (hostcb_call) custom call spends per tap enqueue (per call,
// its function a stand-in for the Python one), for one f32[4] operand
// (and result), with no GPU.  It links the
// engine's handlers.cc and cuda.cc (no Python) and drives them through a
// simulated driver of its own that does each operation at once, on the
// calling thread: a "device-to-host copy" is a memcpy, a stream memory
// write a store, a host function a call, pinning a no-op.  So the figures
// are the engine's own cost (its locks, the ring, the pinner's table), not
// a driver's.  A consumer thread drains the queue as run_batch does.
// Built (with -DHOSTCB_TEST_BUILD: cuda.cc's UseFakeCuda and
// SetGpuWordsRefused) and run by tests/test_gpu_tap_bench.py (short runs,
// values checked); the figures of docs/guide.md come from larger --calls,
// built against this tree's and another tree's src/hostcb/_native.
//
//   gpu_tap_bench [--calls N] [--rounds R] [--publication=word|host]
//                 [--op=tap|call]
//
// Prints "tap_ns=... tap_cpu_ns=... records=... checked=1": per tap or call
// (the best of R rounds), wall-clock and the calling thread's CPU time;
// records: the taps delivered (0 for calls, whose results are checked).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "cuda_api.h"
#include "engine.h"

namespace hostcb {
// The functions of the rest of the engine that handlers.cc and cuda.cc
// call (module.cc, call.cc, named.cc: Python, not built here).
void RequestConsumerSlow(Queue* q) {
  q->consumer_requested.store(true, std::memory_order_release);
}
void NamedAfterForkInChild() {}
void LifetimesAfterForkInChild() {}  // lifetimes.cc
// A call's function (Python in the engine): copies its one operand to
// its one result, doubled.
xla::ffi::Error CallOnHost(bool, int32_t, int64_t, const XLA_FFI_Args* args,
                           size_t, const XLA_FFI_Rets* rets, size_t) {
  auto* in = static_cast<const XLA_FFI_Buffer*>(args->args[0]);
  auto* out = static_cast<const XLA_FFI_Buffer*>(rets->rets[0]);
  for (int i = 0; i < 4; ++i) {
    static_cast<float*>(out->data)[i] = 2 * static_cast<float*>(in->data)[i];
  }
  return xla::ffi::Error::Success();
}

namespace cuda {
namespace {

CUresult Copy(void* dst, CUdeviceptr src, size_t n, CUstream) {
  std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  return kSuccess;
}
CUresult CopyIn(CUdeviceptr dst, const void* src, size_t n, CUstream) {
  std::memcpy(reinterpret_cast<void*>(dst), src, n);
  return kSuccess;
}
CUresult HostFunc(CUstream, CUhostFn fn, void* user_data) {
  fn(user_data);
  return kSuccess;
}
CUresult Ok(CUstream) { return kSuccess; }
CUresult GetCtx(CUstream, CUcontext* ctx) {
  *ctx = reinterpret_cast<CUcontext>(1);
  return kSuccess;
}
CUresult SetCtx(CUcontext) { return kSuccess; }
CUresult PopCtx(CUcontext* ctx) {
  *ctx = nullptr;
  return kSuccess;
}
CUresult Register(void*, size_t, unsigned) { return kSuccess; }
CUresult Unregister(void*) { return kSuccess; }
CUresult Alloc(void** p, size_t n, unsigned) {
  *p = std::malloc(n);
  return *p ? kSuccess : 2;
}
CUresult FreeHost(void* p) {
  std::free(p);
  return kSuccess;
}
CUresult Name(CUresult, const char** name) {
  *name = "CUDA_ERROR";
  return kSuccess;
}
CUresult WriteValue(CUstream, CUdeviceptr addr, uint64_t value, unsigned) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(addr), value, __ATOMIC_RELEASE);
  return kSuccess;
}
CUresult DevicePointer(CUdeviceptr* d, void* p, unsigned) {
  *d = reinterpret_cast<CUdeviceptr>(p);
  return kSuccess;
}

const Api kInline = {Copy,   CopyIn,   HostFunc, Ok,         GetCtx,
                     SetCtx, SetCtx,   PopCtx,   Register,   Unregister,
                     Alloc,  FreeHost, Name,     WriteValue, DevicePointer};

}  // namespace

// What cuda.cc's UseFakeCuda installs (cuda_fake.cc is not linked).
const Api* FakeApi() { return &kInline; }

}  // namespace cuda
}  // namespace hostcb

namespace {

std::atomic<long> g_taken{0};
std::atomic<bool> g_bad{false};
std::atomic<bool> g_stop{false};

void Consume(hostcb::Queue* q) {
  std::vector<hostcb::Record> recs;
  while (!g_stop.load()) {
    recs.clear();
    if (q->TakeReady(&recs, 256, 0, 0.01, 0.05) !=
        hostcb::Queue::Take::kRecords) {
      continue;
    }
    for (const hostcb::Record& r : recs) {
      if (!bench::IsTheTap(r)) g_bad = true;
      q->NoteRan(1);
    }
    q->Release(recs.size());
    g_taken += static_cast<long>(recs.size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  long calls = 200000, rounds = 5;
  bool by_word = true, calls_op = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--calls" && i + 1 < argc) {
      calls = std::atol(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atol(argv[++i]);
    } else if (a == "--publication=word") {
      by_word = true;
    } else if (a == "--publication=host") {
      by_word = false;
    } else if (a == "--op=tap" || a == "--op=call") {
      calls_op = a == "--op=call";
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  hostcb::cuda::UseFakeCuda();
  hostcb::g_dtype_supported[XLA_FFI_DataType_F32].store(true);
  // CUDA_ERROR_NOT_SUPPORTED: taps published by host functions.
  hostcb::SetGpuWordsRefused(by_word ? 0 : 801);
  hostcb::Queue* q = hostcb::GpuQueue(0);
  std::thread consumer(Consume, q);

  float value[4] = {1, 2, 3, 4};
  int64_t dims[1] = {4};
  XLA_FFI_Buffer arr{XLA_FFI_Buffer_STRUCT_SIZE,
                     nullptr,
                     XLA_FFI_DataType_F32,
                     value,
                     1,
                     dims};
  XLA_FFI_ArgType types[1] = {XLA_FFI_ArgType_BUFFER};
  void* args[1] = {&arr};
  XLA_FFI_Args a{XLA_FFI_Args_STRUCT_SIZE, nullptr, 1, types, args};
  float result[4] = {0, 0, 0, 0};
  XLA_FFI_Buffer res{XLA_FFI_Buffer_STRUCT_SIZE,
                     nullptr,
                     XLA_FFI_DataType_F32,
                     result,
                     1,
                     dims};
  XLA_FFI_RetType ret_types[1] = {XLA_FFI_RetType_BUFFER};
  void* rets[1] = {&res};
  XLA_FFI_Rets rs{XLA_FFI_Rets_STRUCT_SIZE, nullptr, 1, ret_types, rets};
  bool results_ok = true;
  void* stream = reinterpret_cast<void*>(0x1000);

  const bench::Timing best = bench::BestPerCall(rounds, calls, [&](long) {
    xla::ffi::Error e =
        calls_op ? hostcb::CallOnStream(false, stream, 0, 8, &a, 0, &rs, 0)
                 : hostcb::TapOnStream(stream, 0, 7, &a, 0);
    if (calls_op) {
      results_ok = results_ok && result[0] == 2 && result[3] == 8;
      result[0] = result[3] = 0;
    }
    if (e.failure()) {
      std::fprintf(stderr, "tap failed: %s\n", e.message().c_str());
      std::exit(1);  // the consumer thread still runs: no return from main
    }
  });
  const long expected = calls_op ? 0 : calls * rounds;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (g_taken.load() < expected &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  g_stop = true;
  consumer.join();
  const bool ok = results_ok && !g_bad.load() && g_taken.load() == expected;
  std::printf("tap_ns=%.1f tap_cpu_ns=%.1f records=%ld checked=%d\n",
              best.wall_ns, best.cpu_ns, g_taken.load(), ok ? 1 : 0);
  return ok ? 0 : 1;
}
