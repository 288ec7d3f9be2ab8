// A micro-benchmark of the CPU tap path (issue 38): calls the hostcb_tap
// and hostcb_noop FFI handlers (handlers.cc, linked in) through a call
// frame built here, the way XLA's CPU custom call thunk does, for one tap of
// a token and an f32[4] per call.  A consumer thread drains the queue as
// run_batch does (TakeReady, NoteRan per record, Release), spending
// --work-ns per record (the Python tap function).  Built and run by
// tests/test_tap_path_bench.py (short runs, values checked); used for the
// figures of issue 38 with larger --calls and under
// `valgrind --tool=callgrind` (--consumer=inline: one thread, the queue
// drained every 256 taps, so that instruction counts cover both sides).
//
//   tap_path_bench [--calls N] [--consumer=thread|inline] [--work-ns W]
//   tap_path_bench --errors   (checks the errors of unusual call frames)
//
// Prints "noop_ns=... tap_ns=... noop_cpu_ns=... tap_cpu_ns=... records=...
// checked=1 lock_sleeps=...": per call, wall-clock and the calling thread's
// CPU time; how often a thread slept on the queue's lock.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "bench_common.h"
#include "engine.h"

namespace hostcb {
// The functions of the rest of the engine that handlers.cc calls.
void RequestConsumerSlow(Queue* q) {
  q->consumer_requested.store(true, std::memory_order_release);
}
void ForgetGpuStateAfterFork() {}
void NamedAfterForkInChild() {}  // named.cc (hostcb_tap_v1), not built here
}  // namespace hostcb

namespace {

std::atomic<long> g_taken{0};  // records drained

XLA_FFI_Error* DeviceOrdinalGet(XLA_FFI_DeviceOrdinal_Get_Args* args) {
  args->device_ordinal = 0;
  return nullptr;
}

// The errors that the handlers create: the last message, and a non-null
// error that is never dereferenced.
std::string g_error;
XLA_FFI_Error* ErrorCreate(XLA_FFI_Error_Create_Args* args) {
  g_error = args->message;
  return reinterpret_cast<XLA_FFI_Error*>(&g_error);
}

struct Frame {
  XLA_FFI_Api api{};
  float value[4] = {1, 2, 3, 4};
  int64_t dims[1] = {4};
  XLA_FFI_Buffer token{XLA_FFI_Buffer_STRUCT_SIZE,
                       nullptr,
                       XLA_FFI_DataType_TOKEN,
                       nullptr,
                       0,
                       nullptr};
  XLA_FFI_Buffer arr{XLA_FFI_Buffer_STRUCT_SIZE,
                     nullptr,
                     XLA_FFI_DataType_F32,
                     value,
                     1,
                     dims};
  XLA_FFI_Buffer token_out{XLA_FFI_Buffer_STRUCT_SIZE,
                           nullptr,
                           XLA_FFI_DataType_TOKEN,
                           nullptr,
                           0,
                           nullptr};
  XLA_FFI_ArgType arg_types[2] = {XLA_FFI_ArgType_BUFFER,
                                  XLA_FFI_ArgType_BUFFER};
  void* args[2] = {&token, &arr};
  XLA_FFI_RetType ret_types[1] = {XLA_FFI_RetType_BUFFER};
  void* rets[1] = {&token_out};
  int64_t target = 7;
  XLA_FFI_Scalar scalar{XLA_FFI_DataType_S64, &target};
  XLA_FFI_AttrType attr_types[1] = {XLA_FFI_AttrType_SCALAR};
  XLA_FFI_ByteSpan name{"target_id", 9};
  XLA_FFI_ByteSpan* names[1] = {&name};
  void* attrs[1] = {&scalar};
  XLA_FFI_CallFrame frame{};

  Frame() {
    api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
    api.XLA_FFI_DeviceOrdinal_Get = DeviceOrdinalGet;
    api.XLA_FFI_Error_Create = ErrorCreate;
    frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
    frame.api = &api;
    frame.ctx = reinterpret_cast<XLA_FFI_ExecutionContext*>(this);
    frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
    frame.args =
        XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr, 2, arg_types, args};
    frame.rets =
        XLA_FFI_Rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr, 1, ret_types, rets};
    frame.attrs = XLA_FFI_Attrs{
        XLA_FFI_Attrs_STRUCT_SIZE, nullptr, 1, attr_types, names, attrs};
  }
};

// Drains what is ready; returns the number of records taken (0: none in
// timeout_s).  Checks every record's target and values.
size_t Drain(hostcb::Queue* q, double timeout_s, long work_ns, bool* ok) {
  std::vector<hostcb::Record> recs;
  if (q->TakeReady(&recs, 256, ~uint64_t{0}, timeout_s, 0.05) !=
      hostcb::Queue::Take::kRecords) {
    return 0;
  }
  for (const hostcb::Record& r : recs) {
    if (!bench::IsTheTap(r)) *ok = false;
    if (work_ns > 0) {
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::nanoseconds(work_ns);
      while (std::chrono::steady_clock::now() < until) {
      }
    }
    q->NoteRan(1);
  }
  q->Release(recs.size());
  g_taken += static_cast<long>(recs.size());
  return recs.size();
}

bench::Timing NsPerCall(XLA_FFI_Error* (*handler)(XLA_FFI_CallFrame*), Frame* f,
                        long calls, hostcb::Queue* q_inline, long work_ns) {
  bool ok = true;
  const bench::Timing t = bench::PerCall(calls, [&](long i) {
    if (handler(&f->frame) != nullptr) {
      std::fprintf(stderr, "handler failed: %s\n", g_error.c_str());
      std::exit(1);
    }
    if (q_inline && (i & 255) == 255) Drain(q_inline, 0, work_ns, &ok);
  });
  if (!ok) {
    std::fprintf(stderr, "a record came out wrong\n");
    std::exit(1);
  }
  return t;
}

// The call frames that hostcb_tap does not decode itself go to XLA FFI's
// binding, whose errors they get; its own errors are the engine's.
bool ErrorsAreChecked(hostcb::Queue* q) {
  bool ok = true;
  auto expect = [&](Frame& f, const char* part, const char* what) {
    g_error.clear();
    const auto before = q->GetCounters().records_in;
    if (HostcbTap(&f.frame) == nullptr ||
        g_error.find(part) == std::string::npos ||
        q->GetCounters().records_in != before) {
      std::fprintf(stderr, "%s: got \"%s\"\n", what, g_error.c_str());
      ok = false;
    }
  };
  {
    Frame f;  // another stage: the binding's error
    f.frame.stage = XLA_FFI_ExecutionStage_PREPARE;
    expect(f, "Wrong execution stage", "stage");
  }
  {
    Frame f;  // another attribute name: the binding's error
    f.name = XLA_FFI_ByteSpan{"target_ix", 9};
    expect(f, "target_id", "attribute name");
  }
  {
    Frame f;  // a dtype the consumer cannot convert: the engine's error
    f.arr.dtype = XLA_FFI_DataType_C128;
    expect(f, "cannot pass arrays of XLA dtype", "dtype");
  }
  {
    Frame f;  // a result that is not the token
    f.token_out.dtype = XLA_FFI_DataType_F32;
    expect(f, "its only result may be the XLA token", "result");
  }
  {
    // An extension that is not the metadata query: the binding runs the
    // tap (it is queued) and the fallback is counted with its reason.
    Frame f;
    // (XLA_FFI_Extension_Base, renamed XLA_FFI_InternalExtension in
    // jaxlib 0.12's headers.)
    using Extension = std::remove_pointer_t<decltype(f.frame.extension_start)>;
    Extension ext{sizeof(Extension), static_cast<decltype(ext.type)>(77),
                  nullptr};
    f.frame.extension_start = &ext;
    const auto before = q->GetCounters().records_in;
    const char* why = nullptr;
    if (HostcbTap(&f.frame) != nullptr ||
        q->GetCounters().records_in != before + 1 ||
        hostcb::g_tap_fallbacks.load() != 1 ||
        (why = hostcb::g_tap_fallback_reason.load()) == nullptr ||
        std::strstr(why, "extension") == nullptr) {
      std::fprintf(stderr, "extension: not counted as a fallback\n");
      ok = false;
    }
    std::vector<hostcb::Record> recs;  // drains the tap
    if (q->TakeReady(&recs, 16, 0, 1.0, 0) == hostcb::Queue::Take::kRecords) {
      q->Release(recs.size());
    }
  }
  if (hostcb::g_tap_fallbacks.load() != 1) {  // the errors are not counted
    std::fprintf(stderr, "errors counted as fallbacks\n");
    ok = false;
  }
  return ok;
}

// --grow-during-take: the consumer takes 10 records, and while it copies
// them with the queue's lock released (the test hook), 3000 more taps grow
// the record FIFO from 1024 slots to 4096.  The 10 must come out right
// from the slots the grow left (kept until the release; built with
// -fsanitize=address, a read of freed slots fails the run), then the 3000.
Frame* g_grow_frame = nullptr;

void GrowQueue(hostcb::Queue* q) {
  q->test_hook_unlocked_take = nullptr;  // once
  for (int i = 0; i < 3000; ++i) {
    if (HostcbTap(&g_grow_frame->frame) != nullptr) {
      std::fprintf(stderr, "handler failed: %s\n", g_error.c_str());
      std::exit(1);
    }
  }
}

bool GrowDuringTakeIsChecked(hostcb::Queue* q) {
  Frame f;
  g_grow_frame = &f;
  for (int i = 0; i < 10; ++i) HostcbTap(&f.frame);
  q->test_hook_unlocked_take = GrowQueue;
  bool ok = true;
  std::vector<hostcb::Record> first;
  if (q->TakeReady(&first, 10, 0, 1.0, 0) != hostcb::Queue::Take::kRecords ||
      first.size() != 10 || q->GetCounters().records_held != 3010) {
    std::fprintf(stderr, "the grow did not happen during the take\n");
    return false;
  }
  for (const hostcb::Record& r : first) ok = ok && bench::IsTheTap(r);
  q->Release(first.size());
  long rest = 0;
  for (;;) {
    std::vector<hostcb::Record> recs;
    if (q->TakeReady(&recs, 256, 0, 0, 0) != hostcb::Queue::Take::kRecords) {
      break;
    }
    for (const hostcb::Record& r : recs) ok = ok && bench::IsTheTap(r);
    rest += static_cast<long>(recs.size());
    q->Release(recs.size());
  }
  return ok && rest == 3000;
}

// --went-quiet: WentQuiet says once, at the first take after which nothing
// was queued, that the device paused; not while taps keep coming, and not
// again until they came again.
bool WentQuietIsChecked(hostcb::Queue* q) {
  Frame f;
  auto tap = [&](int n) {
    for (int i = 0; i < n; ++i) HostcbTap(&f.frame);
  };
  auto take_two = [&] {
    std::vector<hostcb::Record> recs;
    if (q->TakeReady(&recs, 2, 0, 0, 0) != hostcb::Queue::Take::kRecords) {
      std::fprintf(stderr, "nothing to take\n");
      std::exit(1);
    }
    q->Release(recs.size());
    return q->WentQuiet();
  };
  tap(10);
  bool ok = !take_two();   // taps came since the start
  ok = ok && take_two();   // none since the previous take: paused
  ok = ok && !take_two();  // still paused: said once
  tap(1);
  ok = ok && !take_two();            // taps came again
  ok = ok && take_two();             // paused again
  std::vector<hostcb::Record> recs;  // drains the rest
  while (q->TakeReady(&recs, 256, 0, 0, 0) == hostcb::Queue::Take::kRecords) {
    q->Release(recs.size());
    recs.clear();
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  long calls = 200000, work_ns = 0;
  bool inline_consumer = false, errors_only = false, grow_only = false,
       quiet_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--errors") {
      errors_only = true;
      continue;
    }
    if (a == "--grow-during-take") {
      grow_only = true;
      continue;
    }
    if (a == "--went-quiet") {
      quiet_only = true;
      continue;
    }
    if (a == "--calls" && i + 1 < argc)
      calls = std::atol(argv[++i]);
    else if (a == "--work-ns" && i + 1 < argc)
      work_ns = std::atol(argv[++i]);
    else if (a == "--consumer=inline")
      inline_consumer = true;
    else if (a == "--consumer=thread")
      inline_consumer = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  hostcb::g_dtype_supported[XLA_FFI_DataType_F32].store(true);
  Frame f;
  hostcb::Queue* q = hostcb::GetQueue(0);
  if (errors_only) {
    const bool ok = ErrorsAreChecked(q);
    std::printf("errors_checked=%d\n", ok ? 1 : 0);
    return ok ? 0 : 1;
  }
  if (quiet_only) {
    const bool ok = WentQuietIsChecked(q);
    std::printf("went_quiet_checked=%d\n", ok ? 1 : 0);
    return ok ? 0 : 1;
  }
  if (grow_only) {
    const bool ok = GrowDuringTakeIsChecked(q);
    std::printf("grow_checked=%d\n", ok ? 1 : 0);
    return ok ? 0 : 1;
  }
  std::atomic<bool> stop{false};
  bool ok = true;
  std::thread consumer;
  if (!inline_consumer) {
    consumer = std::thread([&] {
      while (!stop.load()) Drain(q, 0.01, work_ns, &ok);
      while (Drain(q, 0, work_ns, &ok)) {
      }
    });
  }
  // The empty custom call's frame has no attribute (XLA FFI's binding of
  // hostcb_noop refuses one since jaxlib 0.8.0's headers).
  Frame nf;
  nf.frame.attrs.size = 0;
  const bench::Timing noop = NsPerCall(HostcbNoop, &nf, calls, nullptr, 0);
  const bench::Timing tap =
      NsPerCall(HostcbTap, &f, calls, inline_consumer ? q : nullptr, work_ns);
  if (inline_consumer) {
    while (Drain(q, 0, work_ns, &ok)) {
    }
  } else {
    stop.store(true);
    consumer.join();
  }
  std::printf(
      "noop_ns=%.1f tap_ns=%.1f noop_cpu_ns=%.1f tap_cpu_ns=%.1f "
      "records=%ld checked=%d lock_sleeps=%llu\n",
      noop.wall_ns, tap.wall_ns, noop.cpu_ns, tap.cpu_ns, g_taken.load(),
      ok ? 1 : 0,
      static_cast<unsigned long long>(q->GetCounters().lock_sleeps));
  return ok ? 0 : 1;
}
