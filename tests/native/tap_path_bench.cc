// A micro-benchmark of the CPU tap path: calls the hostcb_tap
// and hostcb_noop FFI handlers (handlers.cc, linked in) through a call
// frame built here, the way XLA's CPU custom call thunk does, for one tap of
// a token and an f32[4] per call.  A consumer thread drains the queue as
// run_batch does (TakeReady, NoteRan per record, Release), spending
// --work-ns per record (the Python tap function).  Built and run by
// tests/test_tap_path_bench.py (short runs, values checked); for figures,
// run it with larger --calls and under
// `valgrind --tool=callgrind` (--consumer=inline: one thread, the queue
// drained every 256 taps, so that instruction counts cover both sides).
//
//   tap_path_bench [--calls N] [--consumer=thread|inline|late]
//                  [--work-ns W] [--floats F]
//   tap_path_bench --errors   (checks the errors of unusual call frames)
//   tap_path_bench --lock-sleeps   (checks the lock_sleeps counter)
//
// --floats F: the tap's operand is f32[F] (1, 2, ..., F) instead of f32[4]:
// over 4 KiB the handler copies it with the queue's lock released, from
// 1 MiB it gets its own block.  --consumer=late: the records are committed
// late, by a second thread (the "stream", as on a GPU), so that the
// consumer's takes find records not ready yet (see RunLate; it is not
// timed: tap_ns and tap_cpu_ns are 0).
//
// Prints "noop_ns=... tap_ns=... noop_cpu_ns=... tap_cpu_ns=... records=...
// checked=1 lock_sleeps=... locked_takes=...": per call, wall-clock and the
// calling thread's CPU time; how often a thread slept on the queue's lock;
// how many takes copied their records with the lock held (some record
// queued was not ready: the take's slow path).
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
void NamedAfterForkInChild() {}      // named.cc (hostcb_tap_v1), not built here
void LifetimesAfterForkInChild() {}  // lifetimes.cc, not built here
}  // namespace hostcb

namespace {

std::atomic<long> g_taken{0};  // records drained
// Takes that returned records, and those of them that copied the records
// with the queue's lock released (every queued record was ready).
std::atomic<long> g_takes{0}, g_unlocked_takes{0};
void CountUnlockedTake(hostcb::Queue*) { ++g_unlocked_takes; }

// The records that the consumer expects: f32[g_floats] operands, and the
// target 7, or (--consumer=late) kLateTarget plus the record's index.
long g_floats = 4;
bool g_late = false;
constexpr int64_t kLateTarget = 1000;

// Whether `r` is a tap of `target` with one operand f32[n] holding
// 1, 2, ..., n.
bool IsTap(const hostcb::Record& r, int64_t target, long n) {
  if (r.target_id != target || r.num_operands != 1) return false;
  hostcb::OperandDesc d;
  int64_t dim;
  std::memcpy(&d, r.data, sizeof(d));
  std::memcpy(&dim, r.data + sizeof(d), sizeof(dim));
  if (d.dtype != XLA_FFI_DataType_F32 || d.rank != 1 || dim != n ||
      d.nbytes != 4 * static_cast<uint64_t>(n)) {
    return false;
  }
  const uint8_t* bytes = r.data + d.offset;
  for (long j = 0; j < n; ++j) {
    float v;
    std::memcpy(&v, bytes + 4 * j, sizeof(v));
    if (v != static_cast<float>(j + 1)) return false;
  }
  return true;
}

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

  // The operand becomes f32[v.size()] at v (which must outlive the frame).
  void Floats(std::vector<float>* v) {
    arr.data = v->data();
    dims[0] = static_cast<int64_t>(v->size());
  }

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
  ++g_takes;
  long index = g_taken.load();
  for (const hostcb::Record& r : recs) {
    if (!IsTap(r, g_late ? kLateTarget + index : 7, g_floats)) *ok = false;
    ++index;
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

// Waits (yielding, up to `deadline_s`) until pred() holds; whether it did.
template <typename Pred>
bool WaitUntil(Pred pred, double deadline_s) {
  const auto until =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(deadline_s));
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

// Reserves one record of f's tap (target 7) and writes it, returning with
// the queue's mutex held in `lock` and the record not committed yet.
hostcb::Queue::Reservation HoldTheLock(hostcb::Queue* q, Frame* f,
                                       std::unique_lock<std::mutex>& lock) {
  hostcb::TapLayout layout;
  hostcb::Queue::Reservation r;
  if (hostcb::ReserveTap(q, 7, &f->frame.args, 0, &layout, lock, &r)
          .failure()) {
    std::fprintf(stderr, "reservation failed\n");
    std::exit(1);
  }
  hostcb::WritePayload(r.data, &f->frame.args, 0, layout.header,
                       [](uint8_t* dst, const void* src, uint64_t n) {
                         std::memcpy(dst, src, n);
                         return true;
                       });
  return r;
}

// --lock-sleeps: lock_sleeps counts each time a thread found the queue's
// mutex held past its spin (LockSpinning) and slept on it, once.  This
// thread holds the mutex (a reservation's hold) while another thread
// (1) taps, then (2) takes; it lets go only once the counter says that
// thread went to sleep (or after 20 s).  Prints how much the counter went
// up in each round (1 and 1 expected), whether that thread was still
// waiting for the mutex when it did, and whether the three records came
// out right.
int LockSleepsAreCounted(hostcb::Queue* q) {
  Frame f, g;
  const uint64_t at_start = q->LockSleeps();
  std::atomic<bool> done{false};
  bool waited = true;
  uint64_t sleeps[2];
  std::vector<hostcb::Record> recs;
  for (int round = 0; round < 2; ++round) {
    const uint64_t before = q->LockSleeps();
    std::unique_lock<std::mutex> lock;
    const hostcb::Queue::Reservation held = HoldTheLock(q, &f, lock);
    done = false;
    std::thread other([&] {
      if (round == 0) {
        if (HostcbTap(&g.frame) != nullptr) std::exit(1);
      } else if (q->TakeReady(&recs, 256, 0, 20.0, 0) !=
                 hostcb::Queue::Take::kRecords) {
        recs.clear();
      }
      done = true;
    });
    WaitUntil([&] { return q->LockSleeps() > before; }, 20.0);
    waited = waited && !done.load();
    q->CommitLocked(held, false);
    lock.unlock();
    other.join();
    sleeps[round] = q->LockSleeps() - before;
  }
  // The take got the two records of round 0 and round 1's own record.
  bool ok = recs.size() == 3;
  for (const hostcb::Record& r : recs) ok = ok && bench::IsTheTap(r);
  q->Release(recs.size());
  ok = ok && q->LockSleeps() - at_start == sleeps[0] + sleeps[1];
  std::printf(
      "producer_sleeps=%llu consumer_sleeps=%llu waited=%d checked=%d\n",
      static_cast<unsigned long long>(sleeps[0]),
      static_cast<unsigned long long>(sleeps[1]), waited ? 1 : 0, ok ? 1 : 0);
  return ok && waited && sleeps[0] == 1 && sleeps[1] == 1 ? 0 : 1;
}

// --consumer=late: this thread reserves every record (target kLateTarget +
// its index) and leaves its payload to a second thread, the "stream" (as
// the CUDA handlers leave it to a device copy): the stream writes the
// payloads and makes the records ready, in blocks of kLateBlock records,
// last record first, one block behind the reservations.  The records of
// every other block, counted back from the last block, are made ready by
// ready words that the stream writes (Queue::AwaitWordLocked, read by the
// consumer only: no lock is taken for them, so that only the word orders
// the payload's bytes before the consumer's read of them), the others by
// commits (Queue::Commit, the host function's).  The last block waits for
// the consumer's first take: so at least that take finds records not
// ready (takes with the lock held; the order must hold back the ready
// records queued after an unready one).  Returns the records made ready
// by a word.
constexpr long kLateBlock = 8;

long RunLate(hostcb::Queue* q, Frame* f, long calls) {
  if (calls < 2 * kLateBlock) {
    std::fprintf(stderr, "--consumer=late needs --calls %ld or more\n",
                 2 * kLateBlock);
    std::exit(2);
  }
  struct Item {
    uint64_t seq;
    uint8_t* data;
    uint64_t header;
    uint64_t* word;  // or nullptr: committed
  };
  std::vector<Item> items(calls);
  std::atomic<long> published{0};
  std::thread stream([&] {
    for (long b = 0; b < calls; b += kLateBlock) {
      const long end = std::min(calls, b + kLateBlock);
      const bool last = end == calls;
      if (!WaitUntil(
              [&] {
                return published.load(std::memory_order_acquire) >=
                           std::min(calls, end + kLateBlock) &&
                       (!last || g_takes.load() > 0);
              },
              60.0)) {
        std::fprintf(stderr, "the stream waited 60 s for block %ld\n", b);
        std::exit(1);
      }
      for (long i = end - 1; i >= b; --i) {
        const Item& it = items[i];
        hostcb::WritePayload(it.data, &f->frame.args, 0, it.header,
                             [](uint8_t* dst, const void* src, uint64_t n) {
                               std::memcpy(dst, src, n);
                               return true;
                             });
        if (it.word != nullptr) {
          __atomic_store_n(it.word, uint64_t{1}, __ATOMIC_RELEASE);
        } else {
          q->Commit(it.seq, false);
        }
      }
    }
  });
  const long blocks = (calls + kLateBlock - 1) / kLateBlock;
  long by_word = 0;
  for (long i = 0; i < calls; ++i) {
    hostcb::TapLayout layout;
    std::unique_lock<std::mutex> lock;
    hostcb::Queue::Reservation r;
    // 16 bytes after the payload hold the ready word; 1 MiB payloads get
    // their own block, as the CPU handler's do.
    if (hostcb::ReserveTap(q, kLateTarget + i, &f->frame.args, 0, &layout, lock,
                           &r, uint64_t{1} << 20, 16)
            .failure()) {
      std::fprintf(stderr, "reservation failed\n");
      std::exit(1);
    }
    uint64_t* word = nullptr;
    if ((blocks - 1 - i / kLateBlock) % 2 == 0) {
      word = reinterpret_cast<uint64_t*>(r.data + layout.payload);
      __atomic_store_n(word, uint64_t{0}, __ATOMIC_RELAXED);
      q->AwaitWordLocked(r, word);
      ++by_word;
    }
    lock.unlock();
    items[i] = Item{r.seq, r.data, layout.header, word};
    published.store(i + 1, std::memory_order_release);
  }
  stream.join();
  return by_word;
}

// The command line's choices (and g_floats, g_late).
struct Options {
  long calls = 200000, work_ns = 0;
  bool inline_consumer = false, errors_only = false, grow_only = false,
       quiet_only = false, sleeps_only = false;
};

// Reads the command line into *o; false (said on stderr) for an argument
// it does not know or a value it refuses.
bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--errors")
      o->errors_only = true;
    else if (a == "--lock-sleeps")
      o->sleeps_only = true;
    else if (a == "--grow-during-take")
      o->grow_only = true;
    else if (a == "--went-quiet")
      o->quiet_only = true;
    else if (a == "--calls" && i + 1 < argc)
      o->calls = std::atol(argv[++i]);
    else if (a == "--work-ns" && i + 1 < argc)
      o->work_ns = std::atol(argv[++i]);
    else if (a == "--floats" && i + 1 < argc)
      g_floats = std::atol(argv[++i]);
    else if (a == "--consumer=inline")
      o->inline_consumer = true;
    else if (a == "--consumer=thread")
      o->inline_consumer = g_late = false;
    else if (a == "--consumer=late")
      g_late = true, o->inline_consumer = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return false;
    }
  }
  if (g_floats < 1) {
    std::fprintf(stderr, "--floats must be 1 or more\n");
    return false;
  }
  return true;
}

// Prints "name=1" if a check passed, else "name=0"; the exit status.
int Report(const char* name, bool ok) {
  std::printf("%s=%d\n", name, ok ? 1 : 0);
  return ok ? 0 : 1;
}

// Times the empty custom call and the tap, o.calls calls each, beside a
// consumer as o says; prints the figures; the exit status.
int RunBenchmark(hostcb::Queue* q, Frame* f, const Options& o) {
  q->test_hook_unlocked_take = CountUnlockedTake;
  std::atomic<bool> stop{false};
  bool ok = true;
  std::thread consumer;
  if (!o.inline_consumer) {
    consumer = std::thread([&] {
      while (!stop.load()) Drain(q, 0.01, o.work_ns, &ok);
      while (Drain(q, 0, o.work_ns, &ok)) {
      }
    });
  }
  // The empty custom call's frame has no attribute (XLA FFI's binding of
  // hostcb_noop refuses one since jaxlib 0.8.0's headers).
  Frame nf;
  nf.frame.attrs.size = 0;
  const bench::Timing noop = NsPerCall(HostcbNoop, &nf, o.calls, nullptr, 0);
  bench::Timing tap{0, 0};
  long by_word = 0;
  if (g_late) {
    by_word = RunLate(q, f, o.calls);
  } else {
    tap = NsPerCall(HostcbTap, f, o.calls, o.inline_consumer ? q : nullptr,
                    o.work_ns);
  }
  if (o.inline_consumer) {
    while (Drain(q, 0, o.work_ns, &ok)) {
    }
  } else {
    stop.store(true);
    consumer.join();
  }
  std::printf(
      "noop_ns=%.1f tap_ns=%.1f noop_cpu_ns=%.1f tap_cpu_ns=%.1f "
      "records=%ld checked=%d lock_sleeps=%llu locked_takes=%ld "
      "by_word=%ld\n",
      noop.wall_ns, tap.wall_ns, noop.cpu_ns, tap.cpu_ns, g_taken.load(),
      ok ? 1 : 0, static_cast<unsigned long long>(q->GetCounters().lock_sleeps),
      g_takes.load() - g_unlocked_takes.load(), by_word);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 2;
  hostcb::g_dtype_supported[XLA_FFI_DataType_F32].store(true);
  Frame f;
  std::vector<float> floats(g_floats);
  for (long j = 0; j < g_floats; ++j) floats[j] = static_cast<float>(j + 1);
  f.Floats(&floats);
  hostcb::Queue* q = hostcb::GetQueue(0);
  if (o.sleeps_only) return LockSleepsAreCounted(q);
  if (o.errors_only) return Report("errors_checked", ErrorsAreChecked(q));
  if (o.quiet_only) return Report("went_quiet_checked", WentQuietIsChecked(q));
  if (o.grow_only) return Report("grow_checked", GrowDuringTakeIsChecked(q));
  return RunBenchmark(q, &f, o);
}
