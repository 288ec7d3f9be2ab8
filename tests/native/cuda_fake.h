// hostcb native engine, test build only: the test controls of the simulated
// CUDA driver (cuda_fake.cc), used by engine_testing.cc's functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hostcb {
namespace cuda {

enum class FakeOp {
  kNone,
  kCopy,
  kHostFunc,
  kRegister,
  kUnregister,
  kAlloc,
  kWriteValue
};

struct FakeCounters {
  uint64_t copies = 0;
  uint64_t host_functions = 0;
  uint64_t word_writes = 0;
  uint64_t synchronizations = 0;
  uint64_t registrations = 0;
  uint64_t registered_bytes = 0;
  uint64_t unregistrations = 0;
  uint64_t pinned_allocations = 0;
};

// A new simulated stream (never freed).
void* NewFakeStream();
// Holds back (true) or lets run (false) the stream's operations.
void PauseFakeStream(void* stream, bool paused);
// Operations enqueued and not yet finished.
size_t FakeStreamPending(void* stream);
FakeCounters GetFakeCounters();
// The next `count` operations of kind `op` return the CUDA error `code`.
void FailFake(FakeOp op, int count, int code);

}  // namespace cuda
}  // namespace hostcb
