// The scaffold that the native micro-benchmarks (tap_path_bench.cc,
// gpu_tap_bench.cc) share: the calling thread's CPU time, the timing loop
// (wall-clock and CPU time per call, the best of some rounds), and the
// check of a record of their tap (target 7, one f32[4] operand
// [1, 2, 3, 4]).  Header only: each benchmark is one translation unit
// linked with the engine's sources (see tests/_native_bench.py).
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine.h"

namespace bench {

// This thread's CPU time (user and system: page faults included), in ns:
// on a loaded machine it varies less than the wall-clock time.
inline double ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

struct Timing {
  double wall_ns, cpu_ns;
};  // per call

// Runs call(i) for i in [0, calls) on this thread; returns the time per
// call.
template <typename Call>
Timing PerCall(long calls, Call&& call) {
  const double c0 = ThreadCpuNs();
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) {
    call(i);
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double c1 = ThreadCpuNs();
  return Timing{
      std::chrono::duration<double, std::nano>(t1 - t0).count() / calls,
      (c1 - c0) / calls};
}

// The least wall-clock and the least CPU time per call of `rounds` rounds
// of PerCall (each from its own round).
template <typename Call>
Timing BestPerCall(long rounds, long calls, Call&& call) {
  Timing best{1e30, 1e30};
  for (long round = 0; round < rounds; ++round) {
    const Timing t = PerCall(calls, call);
    best.wall_ns = std::min(best.wall_ns, t.wall_ns);
    best.cpu_ns = std::min(best.cpu_ns, t.cpu_ns);
  }
  return best;
}

// Whether `r` is a record of the benchmarks' tap, with its values.
inline bool IsTheTap(const hostcb::Record& r) {
  auto* d = reinterpret_cast<const hostcb::OperandDesc*>(r.data);
  float got[4];
  std::memcpy(got, r.data + d->offset, sizeof(got));
  return r.target_id == 7 && r.num_operands == 1 && d->nbytes == 16 &&
         got[0] == 1 && got[3] == 4;
}

}  // namespace bench
