// hostcb native engine: the few CUDA driver API functions the GPU back end
// uses (cuda.cc), reached through a table of function pointers.
//
// No CUDA header and no CUDA library is needed to build hostcb: the types
// below are the driver API's own ABI (cuda.h: CUresult is an int, streams
// are opaque pointers, device pointers 64-bit integers), and the table is
// filled at run time from dlopen("libcuda.so.1"), the driver that every
// machine with an NVIDIA GPU has.  Where there is no driver, the GPU back
// end is not available and says why (LoadCuda's message).
//
// The test build's tests, on machines without a GPU, install a simulated
// driver instead (tests/native/cuda_fake.cc): a stream is then a host thread
// that runs its copies and host functions in order, so the back end's host
// side (ring, pinning, publication order, bound, barrier, calls) runs
// unchanged on a CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hostcb {
namespace cuda {

using CUresult = int;          // CUDA_SUCCESS is 0
using CUstream = void*;        // CUstream_st*
using CUcontext = void*;       // CUctx_st*
using CUdeviceptr = uint64_t;  // unsigned long long on 64-bit platforms
using CUhostFn = void (*)(void* user_data);

constexpr CUresult kSuccess = 0;
constexpr CUresult kErrorInvalidContext = 201;
constexpr CUresult kErrorHostMemoryAlreadyRegistered = 712;
constexpr unsigned kMemHostRegisterPortable = 0x01;
constexpr unsigned kMemHostRegisterDeviceMap = 0x02;
constexpr unsigned kMemHostAllocPortable = 0x01;
constexpr unsigned kMemHostAllocDeviceMap = 0x02;

// The driver functions, by the symbol names libcuda exports (the _v2 names
// are what cuda.h's macros select for 64-bit builds).
struct Api {
  CUresult (*MemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes,
                              CUstream stream);  // cuMemcpyDtoHAsync_v2
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes,
                              CUstream stream);  // cuMemcpyHtoDAsync_v2
  CUresult (*LaunchHostFunc)(CUstream stream, CUhostFn fn,
                             void* user_data);     // cuLaunchHostFunc
  CUresult (*StreamSynchronize)(CUstream stream);  // cuStreamSynchronize
  CUresult (*StreamGetCtx)(CUstream stream, CUcontext* ctx);  // cuStreamGetCtx
  CUresult (*CtxSetCurrent)(CUcontext ctx);                   // cuCtxSetCurrent
  CUresult (*CtxPushCurrent)(CUcontext ctx);  // cuCtxPushCurrent_v2
  CUresult (*CtxPopCurrent)(CUcontext* ctx);  // cuCtxPopCurrent_v2
  CUresult (*MemHostRegister)(void* p, size_t bytes,
                              unsigned flags);  // cuMemHostRegister_v2
  CUresult (*MemHostUnregister)(void* p);       // cuMemHostUnregister
  CUresult (*MemHostAlloc)(void** p, size_t bytes,
                           unsigned flags);  // cuMemHostAlloc
  CUresult (*MemFreeHost)(void* p);          // cuMemFreeHost
  CUresult (*GetErrorName)(CUresult error,
                           const char** name);  // cuGetErrorName
  // Optional (nullptr where the driver lacks them): a tap's record is then
  // published by a host function instead of a word the stream writes.
  CUresult (*StreamWriteValue64)(CUstream stream, CUdeviceptr addr,
                                 uint64_t value, unsigned flags);
  // cuStreamWriteValue64_v2 (CUDA 11.7), else cuStreamWriteValue64
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr* dptr, void* p,
                                      unsigned flags);
  // cuMemHostGetDevicePointer_v2
};

// The table in use: the real driver once LoadCuda succeeded, the simulated
// one after UseFakeCuda, else nullptr.
const Api* Current();

// Loads libcuda.so.1 (once); returns "" on success, else why it could not.
std::string LoadCuda();

#ifdef HOSTCB_TEST_BUILD
// Replaces the driver by the simulation of FakeApi() (the test build's
// tests/native/cuda_fake.cc, or a benchmark's own).
void UseFakeCuda();
const Api* FakeApi();
#endif

// "CUDA_ERROR_..." for a result code (or its number).
std::string ErrorName(CUresult r);

}  // namespace cuda
}  // namespace hostcb
