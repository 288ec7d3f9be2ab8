// Compiled (never run) by tests/test_engine_gpu.py where the CUDA toolkit's
// cuda.h exists: checks that the driver functions that cuda_api.h declares
// by hand have the ABI of the driver's own declarations (every pointer the
// same size as a pointer, every integer or enum of the same width, in the
// same order), that the symbol names it loads are those cuda.h's macros
// select, and that its constants have the driver's values.
#include <cuda.h>

#include <cstddef>
#include <type_traits>

#include "cuda_api.h"

namespace {

// An argument or result type as the ABI sees it on x86-64 and aarch64:
// a pointer, or an integer of some width.
template <typename T, typename = void>
struct Abi {
  using type = std::integral_constant<std::size_t, sizeof(T)>;
};
template <typename T>
struct Abi<T*> {
  using type = void*;
};

template <typename F>
struct FnAbi;
template <typename R, typename... A>
struct FnAbi<R (*)(A...)> {
  using type = typename Abi<R>::type (*)(typename Abi<A>::type...);
};

template <typename Ours, typename Theirs>
constexpr bool kSameAbi =
    std::is_same_v<typename FnAbi<Ours>::type, typename FnAbi<Theirs>::type>;

using hostcb::cuda::Api;
#define CHECK(field, symbol)                                         \
  static_assert(kSameAbi<decltype(Api::field), decltype(&::symbol)>, \
                #field " does not have the ABI of " #symbol)

CHECK(MemcpyDtoHAsync, cuMemcpyDtoHAsync_v2);
CHECK(MemcpyHtoDAsync, cuMemcpyHtoDAsync_v2);
CHECK(LaunchHostFunc, cuLaunchHostFunc);
CHECK(StreamSynchronize, cuStreamSynchronize);
CHECK(StreamGetCtx, cuStreamGetCtx);
CHECK(CtxSetCurrent, cuCtxSetCurrent);
CHECK(CtxPushCurrent, cuCtxPushCurrent_v2);
CHECK(CtxPopCurrent, cuCtxPopCurrent_v2);
CHECK(MemHostRegister, cuMemHostRegister_v2);
CHECK(MemHostUnregister, cuMemHostUnregister);
CHECK(MemHostAlloc, cuMemHostAlloc);
CHECK(MemFreeHost, cuMemFreeHost);
CHECK(GetErrorName, cuGetErrorName);
// Through cuda.h's macros (cuda.cc loads the _v2 symbols where they exist).
CHECK(StreamWriteValue64, cuStreamWriteValue64);
CHECK(MemHostGetDevicePointer, cuMemHostGetDevicePointer);

// The names cuda.h's macros select are the ones cuda.cc loads with dlsym.
#define STR2(x) #x
#define STR(x) STR2(x)
constexpr bool Eq(const char* a, const char* b) {
  return *a == *b && (*a == 0 || Eq(a + 1, b + 1));
}
static_assert(Eq(STR(cuMemcpyDtoHAsync), "cuMemcpyDtoHAsync_v2"));
static_assert(Eq(STR(cuMemcpyHtoDAsync), "cuMemcpyHtoDAsync_v2"));
static_assert(Eq(STR(cuMemHostRegister), "cuMemHostRegister_v2"));
static_assert(Eq(STR(cuCtxPushCurrent), "cuCtxPushCurrent_v2"));
static_assert(Eq(STR(cuCtxPopCurrent), "cuCtxPopCurrent_v2"));

static_assert(hostcb::cuda::kSuccess == CUDA_SUCCESS);
static_assert(hostcb::cuda::kErrorInvalidContext == CUDA_ERROR_INVALID_CONTEXT);
static_assert(hostcb::cuda::kErrorHostMemoryAlreadyRegistered ==
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
static_assert(hostcb::cuda::kMemHostRegisterPortable ==
              CU_MEMHOSTREGISTER_PORTABLE);
static_assert(hostcb::cuda::kMemHostRegisterDeviceMap ==
              CU_MEMHOSTREGISTER_DEVICEMAP);
static_assert(hostcb::cuda::kMemHostAllocPortable == CU_MEMHOSTALLOC_PORTABLE);
static_assert(hostcb::cuda::kMemHostAllocDeviceMap ==
              CU_MEMHOSTALLOC_DEVICEMAP);
static_assert(sizeof(hostcb::cuda::CUdeviceptr) == sizeof(::CUdeviceptr));

}  // namespace
