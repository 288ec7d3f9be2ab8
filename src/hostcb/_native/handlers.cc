// hostcb native tap engine: the XLA FFI handlers (CPU).
//
// hostcb_tap   attrs: target_id (int64).  Operands: an optional XLA token
//              first, then any arrays.  Results: the token, if one came in.
//              Copies the arrays into the queue of the device it runs on
//              and returns; waits only while that queue is full.  Its
//              usual call frame is decoded by hand (HostcbTap, below).
// (hostcb_call, which runs a `call`'s Python function on the device thread,
// is in call.cc.)
// (hostcb_tap_v1 and hostcb_call_v1, the same by name, are in named.cc.)
// hostcb_noop  does nothing: the cost of an empty custom call (benchmarks).
//
// Device identification: the handlers bind the FFI execution context's
// DeviceOrdinal.  On CPU it is the local device's ordinal (0..N-1 with
// --xla_force_host_platform_device_count=N, in both jit and pmap code);
// the record carries it and selects the queue.  Per-partition identity in
// SPMD code, if a caller wants it, travels as an ordinary operand (e.g. the
// partition id), which the tap function then receives.
//
// Nothing here touches Python or the GIL, except through RequestConsumer
// (module.cc), once per device.
#include <cstring>
#include <mutex>
#include <string>

#include "engine.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hostcb {

std::atomic<Queue*> g_queues[kMaxDevices];
std::atomic<bool> g_dtype_supported[kMaxDtype];
std::atomic<uint64_t> g_awaited_targets[kMaxPrintTargets / 64];
thread_local Queue* tl_consumer_queue = nullptr;

namespace {

std::mutex g_create_mu;  // serialises queue creation only
std::atomic<uint64_t> g_default_capacity{kDefaultQueueBytes};

// Payloads up to this size are copied with the queue mutex held (one lock
// round trip); larger ones are copied with it released.
constexpr uint64_t kCopyUnderLock = 4096;

// CPU tap payloads of this size or more get their own block (queue.h: own
// blocks), which the consumer hands to the tap function without a second
// copy.  Below it, copying out of the ring costs less than an allocation.
constexpr uint64_t kOwnBlockBytes = uint64_t{1} << 20;

bool SubByte(int dtype) {
  switch (dtype) {
    case XLA_FFI_DataType_S1:
    case XLA_FFI_DataType_S2:
    case XLA_FFI_DataType_S4:
    case XLA_FFI_DataType_U1:
    case XLA_FFI_DataType_U2:
    case XLA_FFI_DataType_U4:
    case XLA_FFI_DataType_F4E2M1FN:
      return true;
    default:
      return false;
  }
}

ffi::Error Unsupported(int dtype) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    "hostcb: the native tap engine cannot pass arrays of XLA "
                    "dtype " +
                        std::to_string(dtype) + " to Python");
}

}  // namespace

ffi::Error MeasureTap(const XLA_FFI_Args* args, size_t first,
                      TapLayout* layout) {
  uint64_t num = 0, total_rank = 0, data_bytes = 0;
  for (size_t i = first; i < static_cast<size_t>(args->size); ++i) {
    if (args->types[i] != XLA_FFI_ArgType_BUFFER) {
      return ffi::Error::InvalidArgument("hostcb: operands must be buffers");
    }
    auto* b = static_cast<const XLA_FFI_Buffer*>(args->args[i]);
    if (b->dtype == XLA_FFI_DataType_TOKEN) continue;
    if (b->dtype < 0 || b->dtype >= kMaxDtype || SubByte(b->dtype) ||
        !g_dtype_supported[b->dtype].load(std::memory_order_relaxed)) {
      return Unsupported(b->dtype);
    }
    ++num;
    total_rank += b->rank;
    data_bytes += AlignUp(BufferBytes(b));
  }
  if (num > 0xFFFF) {
    return ffi::Error::InvalidArgument("hostcb: too many operands");
  }
  layout->num = static_cast<uint16_t>(num);
  layout->header = PayloadHeaderBytes(num, total_rank);
  layout->payload = layout->header + data_bytes;
  return ffi::Error::Success();
}

ffi::Error OutOfRange(int32_t device) {
  return ffi::Error(ffi::ErrorCode::kOutOfRange,
                    "hostcb: device ordinal " + std::to_string(device) +
                        " is out of the engine's range");
}

ffi::Error ReserveTap(Queue* q, int64_t target_id, const XLA_FFI_Args* args,
                      size_t first, TapLayout* layout,
                      std::unique_lock<std::mutex>& lock, Queue::Reservation* r,
                      uint64_t own_block_from, uint64_t extra_bytes) {
  RequestConsumer(q);
  ffi::Error e = MeasureTap(args, first, layout);
  if (e.failure()) return e;
  *r = q->Reserve(lock, kTap, target_id, layout->num,
                  layout->payload + extra_bytes,
                  /*never_wait=*/tl_consumer_queue == q, own_block_from);
  if (IsPrintTarget(target_id)) q->NotePrintLocked();
  if (r->data == nullptr) return LostTap(q, *r, layout->payload);
  return ffi::Error::Success();
}

bool ResultsAreTokensOrOperands(const XLA_FFI_Args& args,
                                const XLA_FFI_Rets& rets, size_t first) {
  for (size_t i = first; i < static_cast<size_t>(rets.size); ++i) {
    if (rets.types[i] != XLA_FFI_RetType_BUFFER) return false;
    auto* r = static_cast<const XLA_FFI_Buffer*>(rets.rets[i]);
    if (r->dtype == XLA_FFI_DataType_TOKEN) continue;
    bool aliased = false;
    for (int64_t j = 0; j < args.size && !aliased; ++j) {
      auto* a = static_cast<const XLA_FFI_Buffer*>(args.args[j]);
      aliased = args.types[j] == XLA_FFI_ArgType_BUFFER && a->data == r->data &&
                a->dtype == r->dtype && BufferBytes(a) == BufferBytes(r);
    }
    if (!aliased) return false;
  }
  return true;
}

ffi::Error CheckOnlyTokens(const XLA_FFI_Args* args, const XLA_FFI_Rets* rets,
                           size_t first) {
  if (!ResultsAreTokensOrOperands(*args, *rets, first)) {
    return ffi::Error::InvalidArgument(
        "hostcb_tap: its only result may be the XLA token (or an operand "
        "that it returns unchanged, in the operand's own buffer)");
  }
  return ffi::Error::Success();
}

ffi::Error LostTap(Queue* q, Queue::Reservation r, uint64_t payload) {
  // Out of memory for an external payload: the record goes through empty
  // so that the queue does not stall.  It comes out as a tap of target -1
  // with no operands, which the engine reports at the next barrier.  The
  // caller holds mu_ (its lock from Reserve).
  q->MarkLostLocked(r);
  q->CommitLocked(r, true);
  return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                    "hostcb: cannot allocate " + std::to_string(payload) +
                        " bytes for a tap");
}

// Queues one tap record of the array operands (tokens skipped).
ffi::Error EnqueueTap(int32_t device, int64_t target_id,
                      const XLA_FFI_Args* args, size_t first) {
  Queue* q = GetQueue(device);
  if (q == nullptr) return OutOfRange(device);
  TapLayout layout;
  std::unique_lock<std::mutex> lock;
  Queue::Reservation r;
  ffi::Error e =
      ReserveTap(q, target_id, args, first, &layout, lock, &r, kOwnBlockBytes);
  if (e.failure()) return e;
  const bool copy_unlocked = layout.payload > kCopyUnderLock;
  if (copy_unlocked) lock.unlock();
  // The reserved bytes are ours alone.
  WritePayload(r.data, args, first, layout.header,
               [](uint8_t* dst, const void* src, uint64_t n) {
                 std::memcpy(dst, src, n);
                 return true;
               });
  if (copy_unlocked) lock = q->Relock();
  q->CommitLocked(r, /*urgent=*/false);
  return ffi::Error::Success();
}

namespace {

ffi::Error TapImpl(int32_t device, int64_t target_id, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  RawRets rr(rets);
  RawArgs ra(args);
  ffi::Error e = CheckOnlyTokens(ra.raw(), rr.raw(), rr.first());
  if (e.failure()) return e;
  return EnqueueTap(device, target_id, ra.raw(), ra.first());
}

// Any attributes (a tap's target_id too: bench_dispatch.py compiles a tap
// with this handler, as the floor of a tapped dispatch), operands and
// results; reads and writes nothing.
ffi::Error NoopImpl(ffi::Dictionary, ffi::RemainingArgs, ffi::RemainingRets) {
  return ffi::Error::Success();
}

}  // namespace

// g_queues is an open-addressing table keyed by device ordinal (the JAX
// device id: 0..N-1 in one process, process_index * 2048 + i in process
// `process_index` of a multi-process program).  Queues are only ever added
// (under g_create_mu), so lookups need no lock.
namespace {
size_t Slot(int32_t device) {
  return static_cast<uint32_t>(device) % static_cast<uint32_t>(kMaxDevices);
}
}  // namespace

Queue* FindQueue(int32_t device) {
  if (device < 0) return nullptr;
  for (size_t i = 0, s = Slot(device); i < kMaxDevices;
       ++i, s = (s + 1) % kMaxDevices) {
    Queue* q = g_queues[s].load(std::memory_order_acquire);
    if (q == nullptr) return nullptr;
    if (q->device() == device) return q;
  }
  return nullptr;
}

Queue* GetQueue(int32_t device) {
  if (device < 0) return nullptr;
  if (Queue* q = FindQueue(device)) return q;
  std::lock_guard<std::mutex> lock(g_create_mu);
  for (size_t i = 0, s = Slot(device); i < kMaxDevices;
       ++i, s = (s + 1) % kMaxDevices) {
    Queue* q = g_queues[s].load(std::memory_order_acquire);
    if (q != nullptr && q->device() == device) return q;
    if (q == nullptr) {
      q = new Queue(device, g_default_capacity.load(), static_cast<int32_t>(s));
      g_queues[s].store(q, std::memory_order_release);
      return q;
    }
  }
  return nullptr;  // kMaxDevices queues already
}

void SetCapacityAll(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(g_create_mu);
  g_default_capacity.store(bytes);
  ForEachQueue([&](Queue* q) { q->SetCapacity(bytes); });
}

void ResetAfterFork() {
  // Single-threaded child: no lock (g_create_mu itself may be held by a
  // thread of the parent).  The old queues are leaked on purpose.
  new (&g_create_mu) std::mutex();
  for (auto& q : g_queues) q.store(nullptr, std::memory_order_relaxed);
  tl_consumer_queue = nullptr;
  ForgetGpuStateAfterFork();
  NamedAfterForkInChild();
  LifetimesAfterForkInChild();
}

}  // namespace hostcb

namespace hostcb {
namespace {

// hostcb_tap as XLA FFI's binding decodes it: every stage, the metadata
// query, and the errors of a call frame that is not the usual one.
XLA_FFI_DEFINE_HANDLER(kTapBound, TapImpl,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::DeviceOrdinal>()
                           .Attr<int64_t>("target_id")
                           .RemainingArgs()
                           .RemainingRets());

// An ffi::Error as the C API's error (what the binding returns for it).
XLA_FFI_Error* ToCError(const XLA_FFI_Api* api, const ffi::Error& e) {
  XLA_FFI_Error_Create_Args args;
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.message = e.message().c_str();
  args.errc = static_cast<XLA_FFI_Error_Code>(*e.errc());
  return api->XLA_FFI_Error_Create(&args);
}

const char kMetadataQuery[] = "a metadata query";

// Why hostcb_tap does not decode `frame` itself (nullptr: it does, and
// *target_id is set).  The reasons are static strings.
const char* FastFrameRefusal(const XLA_FFI_CallFrame* frame,
                             const int64_t** target_id) {
  if (frame->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE) {
    return "the call frame is smaller than the one of the FFI headers that "
           "hostcb was built with";
  }
  if (frame->extension_start != nullptr) {
    if (frame->extension_start->type == XLA_FFI_Extension_Metadata) {
      return kMetadataQuery;
    }
    return "the call frame carries an extension";
  }
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) {
    return "a stage other than execute";
  }
  if (!ResultsAreTokensOrOperands(frame->args, frame->rets, 0)) {
    return "a result that is neither the token nor an operand's own buffer";
  }
  *target_id = TargetIdAttr(frame->attrs);
  if (*target_id == nullptr) {
    return "attributes other than one int64 scalar target_id";
  }
  return nullptr;
}

}  // namespace

// The `target_id` attribute of a call frame that has it alone, as a scalar
// int64, or nullptr.
const int64_t* TargetIdAttr(const XLA_FFI_Attrs& attrs) {
  if (attrs.size != 1 || attrs.types[0] != XLA_FFI_AttrType_SCALAR) {
    return nullptr;
  }
  const XLA_FFI_ByteSpan* name = attrs.names[0];
  auto* scalar = static_cast<const XLA_FFI_Scalar*>(attrs.attrs[0]);
  if (name->len != 9 || std::memcmp(name->ptr, "target_id", 9) != 0 ||
      scalar->dtype != XLA_FFI_DataType_S64) {
    return nullptr;
  }
  return static_cast<const int64_t*>(scalar->value);
}

std::atomic<uint64_t> g_tap_fallbacks{0};
std::atomic<const char*> g_tap_fallback_reason{nullptr};

void NoteTapFallback(const char* reason) {
  if (g_tap_fallbacks.fetch_add(1, std::memory_order_relaxed) == 0) {
    g_tap_fallback_reason.store(reason, std::memory_order_release);
  }
}

}  // namespace hostcb

// hostcb_tap.  The execute stage's usual call frame (no extension, the one
// attribute, token results only) is decoded here, straight from the C structs:
// the binding's decoding (a diagnostic engine, optionals and the attribute
// looked up by name on every call) cost about a quarter of a tap's
// instructions.  Anything else goes through the binding (kTapBound), which
// checks what this does not and reports the errors in XLA's words; a frame
// that the binding then runs (a tap that took the slow path) is counted, and
// the first one's reason is kept for the consumer to report (TapFallbacks).
extern "C" XLA_FFI_Error* HostcbTap(XLA_FFI_CallFrame* call_frame) {
  const int64_t* target_id = nullptr;
  const char* refused = hostcb::FastFrameRefusal(call_frame, &target_id);
  if (refused != nullptr) {
    XLA_FFI_Error* err = (*hostcb::kTapBound)(call_frame);
    if (err == nullptr && refused != hostcb::kMetadataQuery) {
      hostcb::NoteTapFallback(refused);
    }
    return err;
  }
  const XLA_FFI_Api* api = call_frame->api;
  XLA_FFI_DeviceOrdinal_Get_Args dev;
  dev.struct_size = XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE;
  dev.extension_start = nullptr;
  dev.ctx = call_frame->ctx;
  dev.device_ordinal = -1;
  if (XLA_FFI_Error* err = api->XLA_FFI_DeviceOrdinal_Get(&dev)) return err;
  const ffi::Error e =
      hostcb::EnqueueTap(dev.device_ordinal, *target_id, &call_frame->args, 0);
  return e.success() ? nullptr : hostcb::ToCError(api, e);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HostcbNoop, hostcb::NoopImpl,
    ffi::Ffi::Bind().Attrs<ffi::Dictionary>().RemainingArgs().RemainingRets());
