// hostcb native tap engine: the per-device record queue.
//
// This header has no Python and no XLA dependency: the CPU FFI handlers
// (handlers.cc) are its producers, the CPython module (module.cc) its
// consumer.  The CUDA handlers (cuda.cc) produce into it too: they reserve
// a record on the host, have the stream copy the operands into it and
// commit it from a host function that the stream runs after the copy.
//
// A record is what one tap handed to the host: a descriptor (kind,
// target id, device ordinal, operand count, where its payload lives) kept in
// a FIFO of descriptors, and a payload with the operands' dtypes, shapes and
// bytes.  Payloads live in a per-device ring buffer bounded in BYTES; a
// payload larger than the whole ring gets its own allocation ("external"),
// which counts against the same bound.
//
// Payload layout (at Record::data, 16-byte aligned):
//   OperandDesc desc[num_operands]
//   int64_t dims[sum of ranks]
//   padding to 16
//   operand bytes, each operand starting at a 16-byte aligned offset
//
// Concurrency invariants (all state below is guarded by Queue::mu_, but
// for the consumer's reads of the descriptors it took, see below):
//  * Producers (device threads, any number) reserve payload space in FIFO
//    order under mu_: a reservation appends a descriptor to records_ (a
//    RecordFifo, which allocates nothing per record) and advances head_.
//    The order of records_ is the order in which the reservations were
//    made; a single device program makes its reservations in program
//    order, so its records come out in program order.
//  * A producer may copy a large payload with mu_ released: the bytes in
//    [ring_pos, ring_pos + ring_bytes) belong to that record alone until the
//    consumer releases it.  It then sets `ready` under mu_ (commit).  A
//    GPU producer has its stream write them (an asynchronous copy) and
//    commits from a host function that the stream runs after that copy
//    (Commit(seq)); the record is found again by its sequence number, which
//    stays valid while the record is queued.  Where the driver can, the
//    stream instead writes a nonzero value into the record's ready word (in
//    pinned ring memory, after its payload) once the copy is done: no host
//    function, so the stream never waits for the host.  The producer
//    clears the word and attaches it to the record (AwaitWordLocked) under
//    mu_, normally in the same hold of mu_ as its reservation (one lock per
//    tap), before it asks the stream for anything.  Such a record is ready
//    once its word reads nonzero or it is committed (a producer whose
//    stream refused the write commits it from a host function after all);
//    only the consumer reads the word, polling it (with mu_ held, a
//    bounded back-off between reads) while such a record is the oldest
//    one, since no host code runs when the stream writes it.
//  * No CUDA call is ever made with mu_ held, except by the ring hooks'
//    BeforeUnmap, which runs only when the queue is empty: then every host
//    function that commits into this queue has already committed (its
//    record was released), so nothing the driver may wait for needs mu_.
//  * There is one consumer per queue at a time (consumer_active_).  It takes
//    the longest prefix of records_ whose records are ready (never skipping
//    an unready record: that keeps the order), reads their payloads with
//    mu_ released, then pops exactly that prefix and frees its bytes
//    (advances tail_).  Ring bytes in [tail_, head_) are never handed to a
//    new reservation, so a payload being read is never overwritten.
//  * Once a record is ready, nothing writes its descriptor until the
//    consumer pops it.  So when every queued record is ready (unready_ is
//    0, the usual case on CPU), the consumer copies the descriptors it takes
//    with mu_ released too; a producer that grows records_ meanwhile keeps
//    the old slots alive until the consumer's Release (KeepStorage).
//  * Every hold of mu_ on the tap path is short (a reservation and a small
//    copy, a take, a release), so the producers and the consumer spin a
//    while before they sleep on it (LockSpinning): a futex sleep and wake
//    cost the device thread several microseconds.
//  * Bytes held = (head_ - tail_) + external_held_ + the descriptors of the
//    queued records (sizeof(Record) each, so that taps of tiny or no
//    operands are bounded too) <= capacity_, except for
//    records admitted without waiting (barrier and retire markers, and
//    producers that run on this queue's own consumer thread, which must
//    never wait for themselves) and for a single oversize record admitted
//    into an empty queue.  A producer that does not fit waits on space_cv_;
//    nothing is ever dropped.
//  * A record reserved after another comes out after it, and the consumer
//    runs (or, for markers, reports) each record only after every record
//    before it.  So a marker (kMarker, kRetire: no payload, always ready at
//    its commit) passes only once every record reserved before it has run:
//    a barrier waits for that, and lifetimes.cc frees a retired target id
//    on it (the marker is reserved after the last executable that names the
//    id is gone, so after every record that id will ever have here).
//  * When the queue becomes empty, head_ and tail_ go back to 0, so a
//    consumer that keeps up keeps touching the same first pages of the ring.
//  * Own blocks: a producer may ask (Reserve's own_block_from) that a
//    payload of at least that many bytes get its own allocation even when
//    it fits the ring, admitted and counted as a ring payload would be.
//    The consumer may then adopt an external payload instead of copying
//    it (Release's `adopted`): Release forgets it without freeing it, and
//    from then on the consumer alone owns the block (module.cc frees it
//    when the last array that views it goes).  Nothing else ever writes
//    to an external payload after its commit, so an adopted block holds
//    the tapped values for as long as it lives.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace hostcb {

constexpr uint64_t kAlign = 16;
inline uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// kRetire: a retire marker (lifetimes.cc), target_id the retired id.
enum RecordKind : uint8_t { kTap = 1, kMarker = 3, kRetire = 4 };

struct OperandDesc {
  int32_t dtype;  // XLA_FFI_DataType code
  int32_t rank;
  uint64_t offset;  // of the operand's bytes, from the payload start
  uint64_t nbytes;
};

struct Record {
  RecordKind kind;
  bool ready;  // payload written (guarded by Queue::mu_; but see the
               // invariants: the consumer reads the records it took unlocked)
  uint16_t num_operands;
  int32_t device;
  int64_t target_id;  // tap function id, or the marker id
  uint8_t* data;      // payload: in the ring, or the external allocation
  uint64_t payload_bytes;
  uint64_t ring_pos;    // first ring byte of this record (incl. wrap padding)
  uint64_t ring_bytes;  // ring bytes to free (0 for external payloads)
  uint64_t external_bytes;  // bytes of the external allocation (or 0)
  // Where the stream writes nonzero once the payload is there (GPU taps
  // published without a host function), or nullptr.
  const uint64_t* ready_word = nullptr;
};

// Size of the payload header (descs + dims, padded) for operand ranks.
inline uint64_t PayloadHeaderBytes(uint64_t num_operands, uint64_t total_rank) {
  return AlignUp(num_operands * sizeof(OperandDesc) +
                 total_rank * sizeof(int64_t));
}

// The FIFO of record descriptors: a circular array that grows by doubling
// (under Queue::mu_, like every access but the consumer's reads of records
// it has taken, see KeepStorage).  Unlike std::deque it allocates
// nothing per record, so the device threads (producers) and the consumer
// thread do not meet in the allocator: with a deque, the consumer freed
// the nodes that the device thread had allocated, once every few records.
class RecordFifo {
 public:
  bool empty() const { return head_ == tail_; }
  size_t size() const { return static_cast<size_t>(head_ - tail_); }
  Record& front() { return at(tail_); }
  // The slots and their mask, for a reader with the lock released (see
  // KeepStorage).
  const Record* slots() const { return slots_.data(); }
  uint64_t mask() const { return mask_; }
  uint64_t front_seq() const { return tail_; }
  uint64_t end_seq() const { return head_; }
  Record& at(uint64_t seq) { return slots_[seq & mask_]; }
  // Appends r; returns its sequence number (stable until it is popped).
  uint64_t push_back(const Record& r) {
    if (size() == num_slots_) Grow();
    const uint64_t seq = head_++;
    at(seq) = r;
    return seq;
  }
  // While kept, a Grow keeps the slots it leaves (until KeepStorage(false)),
  // so that the consumer may read taken records from them with the queue's
  // mutex released.
  void KeepStorage(bool keep) {
    keep_ = keep;
    if (!keep) retired_.clear();
  }
  void pop_front() {
    if (++tail_ == head_ && num_slots_ > kKeptSlots) {
      std::vector<Record>().swap(slots_);  // a burst is over: give it back
      head_ = tail_ = 0;
      num_slots_ = mask_ = 0;
    }
  }

 private:
  void Grow() {
    std::vector<Record> bigger(slots_.empty() ? 1024 : 2 * slots_.size());
    for (uint64_t s = tail_; s < head_; ++s) {
      bigger[s & (bigger.size() - 1)] = at(s);
    }
    slots_.swap(bigger);
    if (keep_) retired_.push_back(std::move(bigger));
    num_slots_ = slots_.size();
    mask_ = num_slots_ - 1;
  }
  static constexpr size_t kKeptSlots = 1 << 16;  // kept when empty
  std::vector<Record> slots_;                    // a power of two in size
  // slots_.size() and that minus 1, kept: a Record is 56 bytes, so the
  // vector's size() is a division (by a multiplication) on every access.
  uint64_t num_slots_ = 0, mask_ = 0;
  uint64_t head_ = 0, tail_ = 0;  // sequence numbers
  bool keep_ = false;
  std::vector<std::vector<Record>> retired_;  // slots left while kept
};

class Queue;

// What a back end whose device writes into the ring (CUDA: pinned pages)
// must hear of the ring's memory.
struct RingHooks {
  // The ring [ring, ring + bytes) is about to be unmapped (mu_ held, the
  // queue empty).  False: it must not be (the device may still write
  // there); the queue then leaves it mapped, for good.
  virtual bool BeforeUnmap(Queue* q, uint8_t* ring, uint64_t bytes) = 0;
  virtual ~RingHooks() = default;
};

class Queue {
 public:
  explicit Queue(int32_t device, uint64_t capacity, int32_t slot = 0)
      : device_(device),
        slot_(slot),
        capacity_(capacity),
        next_capacity_(capacity) {}
  ~Queue() { Unmap(); }
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  int32_t device() const { return device_; }
  // Its index in the engine's table of queues (g_queues).
  int32_t slot() const { return slot_; }

  // Set once, before the first record, by a back end that needs them.
  void SetRingHooks(RingHooks* hooks) {
    std::lock_guard<std::mutex> lock(mu_);
    hooks_ = hooks;
  }

  // The ring's mapping [base, base + bytes), or nullptr before the first
  // ring reservation; `lock` must hold mu_.  It stays mapped while any
  // record is queued.
  std::pair<uint8_t*, uint64_t> RingLocked(
      const std::unique_lock<std::mutex>&) const {
    return {ring_, mapped_};
  }

  // Tests only (tests/native/tap_path_bench.cc): called by the consumer
  // between its unlocked take and its copy of the records taken, so that a
  // test can queue (and grow the FIFO) right then.
  void (*test_hook_unlocked_take)(Queue*) = nullptr;

  // Set by the first producer that asks for a consumer (RequestConsumer in
  // engine.h): consumers start at a device's first record, not before.
  std::atomic<bool> consumer_requested{false};

  // ----------------------------------------------------------- producers
  struct Reservation {
    uint64_t seq;  // of its record in the FIFO
    uint8_t* data;
  };

  // Reserves `payload_bytes` for a new record at the end of the FIFO.
  // Waits while the queue is full unless `never_wait`.  Returns with mu_
  // held in `lock` (the caller copies small payloads under it, or unlocks
  // for large ones) and the record not yet ready.  data is nullptr if an
  // external allocation failed.  A payload of `own_block_from` bytes or
  // more gets its own allocation (see the invariants: own blocks).
  static constexpr uint64_t kNoOwnBlock = ~uint64_t{0};
  Reservation Reserve(std::unique_lock<std::mutex>& lock, RecordKind kind,
                      int64_t target_id, uint16_t num_operands,
                      uint64_t payload_bytes, bool never_wait,
                      uint64_t own_block_from = kNoOwnBlock) {
    lock = LockSpinning();
    payload_bytes = AlignUp(payload_bytes);
    if (records_.empty() && head_ == tail_) ResetWhenEmptyLocked();
    uint64_t ring_pos = 0, ring_bytes = 0;
    uint8_t* data = nullptr;
    bool external = false;
    for (;;) {
      const uint64_t held = HeldLocked();
      if (payload_bytes + sizeof(Record) > capacity_) {
        // Larger than the whole ring: its own allocation, admitted when the
        // queue is empty (so the bound is exceeded by this record only).
        if (held == 0 || never_wait || consumer_dispatching_) {
          external = true;
          break;
        }
      } else if (payload_bytes >= own_block_from) {
        if (held + payload_bytes + sizeof(Record) <= capacity_ || never_wait ||
            consumer_dispatching_) {
          external = true;
          break;
        }
      } else {
        if (!EnsureRingLocked()) {
          external = true;
          break;
        }
        // (head_ is below capacity_ until the ring's first wrap: no
        // division on the hot path then.)
        const uint64_t phys = head_ < capacity_ ? head_ : head_ % capacity_;
        const uint64_t pad =
            phys + payload_bytes > capacity_ ? capacity_ - phys : 0;
        if (held + pad + payload_bytes + sizeof(Record) <= capacity_) {
          ring_pos = head_;
          ring_bytes = pad + payload_bytes;
          head_ += ring_bytes;
          data = ring_ + (pad ? 0 : phys);
          break;
        }
        if (never_wait || consumer_dispatching_) {
          external = true;
          break;
        }
      }
      ++space_waiters_;
      WakeConsumerLocked();  // it may be polling: free space sooner
      space_cv_.wait(lock);
      --space_waiters_;
    }
    uint64_t external_bytes = 0;
    if (external) {
      data = static_cast<uint8_t*>(
          std::aligned_alloc(kAlign, payload_bytes ? payload_bytes : kAlign));
      external_bytes = payload_bytes;
      external_held_ += external_bytes;  // counted even if data is nullptr
    }
    const uint64_t seq = records_.push_back(
        Record{kind, false, num_operands, device_, target_id, data,
               payload_bytes, ring_pos, ring_bytes, external_bytes});
    ++records_in_;
    ++unready_;
    return Reservation{seq, data};
  }

  // Turns a reserved record whose payload could not be allocated into an
  // empty tap of target -1 (reported as lost by the consumer); `lock` must
  // hold mu_.
  void MarkLostLocked(Reservation r) {
    Record& rec = records_.at(r.seq);
    rec.num_operands = 0;
    rec.target_id = -1;
  }

  // Marks a reserved record ready; `lock` must hold mu_ (re-acquired by
  // the caller after an unlocked copy).  `urgent` records (markers)
  // wake a polling consumer at once; taps wake only a sleeping one, so a
  // busy device does not pay a wake-up per tap.
  void CommitLocked(Reservation r, bool urgent) {
    CommitSeqLocked(r.seq, urgent);
  }

  // mu_ again for a producer that let its reservation's hold go while it
  // copied a large payload (EnqueueTap), spinning first as every hold on
  // the tap path does (LockSpinning; counted in lock_sleeps).
  std::unique_lock<std::mutex> Relock() { return LockSpinning(); }

  // Commit of the record with sequence number `seq`, taking mu_ (the host
  // function of a CUDA stream; it makes no CUDA call).
  void Commit(uint64_t seq, bool urgent) {
    std::unique_lock<std::mutex> lock = LockSpinning();
    CommitSeqLocked(seq, urgent);
  }

  // The record is ready once *word reads nonzero (a CUDA stream writes
  // it after the record's copies), or once committed; `lock` must hold
  // mu_ (the reservation's own hold, or a later one), and *word must read
  // 0 already.  A sleeping consumer is woken so that it polls the word.
  void AwaitWordLocked(Reservation r, const uint64_t* word) {
    records_.at(r.seq).ready_word = word;
    if (consumer_state_ == kSleeping) WakeConsumerLocked();
  }

 private:
  void CommitSeqLocked(uint64_t seq, bool urgent) {
    Record& r = records_.at(seq);
    if (!r.ready) {
      r.ready = true;
      --unready_;
    }
    if (consumer_state_ == kSleeping ||
        (consumer_state_ == kPolling &&
         (urgent || HeldLocked() > capacity_ / 2))) {
      WakeConsumerLocked();
    }
  }

 public:
  // ----------------------------------------------------------- consumer
  // Copies out the longest ready prefix of the FIFO (at most max_records
  // records and, past the first, max_bytes payload bytes; 0: the
  // capacity).  Waits up to timeout_s (< 0: forever) for a first ready
  // record; polls for poll_s (timed waits the producers need not signal)
  // before sleeping.
  // Returns kTimeout if nothing is ready in time, kBusy if another consumer is
  // active.  Records stay in the FIFO until Release(taken).
  enum class Take { kRecords, kTimeout, kBusy };
  Take TakeReady(std::vector<Record>* out, size_t max_records,
                 uint64_t max_bytes, double timeout_s, double poll_s) {
    using Clock = std::chrono::steady_clock;
    // (Before the lock: no allocation while the producers wait for it.)
    out->reserve(out->size() + std::min<size_t>(max_records, 1024));
    std::unique_lock<std::mutex> lock = LockSpinning();
    if (consumer_active_) return Take::kBusy;
    // The consumer has processed every record it took before.
    processed_ = records_out_;
    if (ran_.load(std::memory_order_relaxed) < processed_) {
      ran_.store(processed_, std::memory_order_seq_cst);
    }
    if (processed_waiters_ || awaited_waiters_.load()) {
      processed_cv_.notify_all();
    }
    const auto start = Clock::now();
    const auto poll_end = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(poll_s));
    const bool forever = timeout_s < 0;
    const auto deadline =
        start + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(forever ? 0 : timeout_s));
    // Back-off between reads of a ready word (see AwaitWordLocked).
    auto word_poll = std::chrono::microseconds(10);
    while (records_.empty() || !ReadyLocked(records_.front())) {
      auto now = Clock::now();
      if (!forever && now >= deadline) return Take::kTimeout;
      if (!records_.empty() && records_.front().ready_word != nullptr) {
        // Written by a stream: nobody signals it.
        consumer_state_ = kPolling;
        consumer_cv_.wait_for(lock, word_poll);
        word_poll = std::min(word_poll * 2, std::chrono::microseconds(1000));
      } else if (now < poll_end) {
        consumer_state_ = kPolling;
        consumer_cv_.wait_for(lock, std::chrono::milliseconds(1));
      } else {
        consumer_state_ = kSleeping;
        if (forever)
          consumer_cv_.wait(lock);
        else
          consumer_cv_.wait_until(lock, deadline);
      }
      consumer_state_ = kRunning;
    }
    if (max_bytes == 0) max_bytes = capacity_;
    uint64_t bytes = 0;
    consumer_active_ = true;
    // WentQuiet's bookkeeping: whether no record was reserved since the
    // previous take (that returned records), and whether that was so at
    // the previous take too.
    const bool none_since_previous = records_in_ == in_at_take_;
    went_quiet_ = none_since_previous && !quiet_;
    quiet_ = none_since_previous;
    in_at_take_ = records_in_;
    if (unready_ == 0) {
      // Every queued record is ready, and no producer writes a ready record
      // again before its release: copy them out with mu_ released, so that
      // the producers do not wait for the copy (reading the descriptors that
      // another core just wrote costs a cache miss each).  A Grow
      // meanwhile keeps the slots read here until Release.
      const size_t n = std::min(
          records_.size(), max_records - std::min(max_records, out->size()));
      const uint64_t first = records_.front_seq();
      const Record* slots = records_.slots();
      const uint64_t mask = records_.mask();
      records_.KeepStorage(true);
      lock.unlock();
      if (test_hook_unlocked_take != nullptr) test_hook_unlocked_take(this);
      for (size_t i = 0; i < n; ++i) {
        const Record& r = slots[(first + i) & mask];
        if (!out->empty() && bytes + r.payload_bytes > max_bytes) break;
        bytes += r.payload_bytes;
        out->push_back(r);
      }
      return Take::kRecords;
    }
    for (uint64_t seq = records_.front_seq(); seq < records_.end_seq(); ++seq) {
      Record& r = records_.at(seq);
      if (!ReadyLocked(r) || out->size() >= max_records) break;
      if (!out->empty() && bytes + r.payload_bytes > max_bytes) break;
      bytes += r.payload_bytes;
      out->push_back(r);
    }
    return Take::kRecords;
  }

  // Whether the consumer's latest take found no record reserved since its
  // previous take, while that previous take had found at least one
  // reserved since the take before it (or, for the first take, since the
  // queue was made).  Only takes that return kRecords count; a reserved
  // record counts whether or not it was ready yet, and markers count.
  // So it is true at one take per pause of the producers (the device
  // stopped tapping about one batch ago), and false again until some
  // record is reserved and then a take finds none new.  Read by the
  // consumer after its take (no lock: it alone writes it, in TakeReady).
  bool WentQuiet() const { return went_quiet_; }

  // Frees the first n records, which the active consumer has read.  Where
  // `adopted` (n flags, or nullptr) is set, the record's external payload
  // is the consumer's now: forgotten, not freed (see own blocks).
  void Release(size_t n, const uint8_t* adopted = nullptr) {
    std::unique_lock<std::mutex> lock = LockSpinning();
    for (size_t i = 0; i < n; ++i) {
      Record& r = records_.front();
      if (r.external_bytes) {
        if (adopted == nullptr || !adopted[i]) std::free(r.data);
        external_held_ -= r.external_bytes;
      }
      if (r.ring_bytes) tail_ = r.ring_pos + r.ring_bytes;
      records_.pop_front();
    }
    records_out_ += n;
    consumer_active_ = false;
    records_.KeepStorage(false);
    // Reservations may have been made out of ring order only by the wrap
    // padding, which belongs to the record after it: tail_ only grows.
    if (records_.empty() && head_ == tail_) ResetWhenEmptyLocked();
    if (space_waiters_) space_cv_.notify_all();
  }

  // Gives back the consumer role without releasing anything (error path).
  void AbandonTake() {
    std::unique_lock<std::mutex> lock = LockSpinning();
    consumer_active_ = false;
    records_.KeepStorage(false);
  }

  // ----------------------------------------------------------- control
  void SetCapacity(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    // Applied now if the queue is empty, else when it next becomes empty
    // (the ring cannot be resized under records that live in it).
    next_capacity_ = bytes;
    if (records_.empty() && head_ == tail_) ResetWhenEmptyLocked();
    if (space_waiters_) space_cv_.notify_all();
  }

  // While the consumer thread runs a tap function that dispatched a
  // computation (jitted code), producers never wait for space: that
  // computation may tap this queue from another thread while the consumer
  // waits for it, and only the consumer frees space.  The bound is then
  // exceeded by what is queued meanwhile.
  void SetConsumerDispatching(bool dispatching) {
    std::lock_guard<std::mutex> lock(mu_);
    consumer_dispatching_ = dispatching;
    if (dispatching && space_waiters_) space_cv_.notify_all();
    if (dispatching && (processed_waiters_ || awaited_waiters_.load())) {
      processed_cv_.notify_all();
    }
  }

  // Whether the consumer thread runs a tap function that dispatched a
  // computation (no lock: the consumer thread reads what it set itself).
  bool ConsumerDispatching() const {
    return consumer_dispatching_.load(std::memory_order_relaxed);
  }

  // Waits until the consumer has processed (run the functions of) every
  // record queued before this call: a `call` runs after the taps its
  // device made before it.  Does not wait while the consumer runs a tap
  // function that dispatched a computation (it may be the one making this
  // call, on another thread, and wait for it); the caller must not be the
  // consumer's own thread.
  void WaitForEarlierRecords() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = records_in_;
    if (processed_ >= target || consumer_dispatching_) return;
    WakeConsumerLocked();  // it may be polling with taps not yet seen
    ++processed_waiters_;
    processed_cv_.wait(
        lock, [&] { return processed_ >= target || consumer_dispatching_; });
    --processed_waiters_;
  }

  // Records that a print tap was just reserved (`lock` holds mu_): a host
  // read of a result waits for the prints queued before it
  // (WaitForEarlierPrints), not for the other taps.
  void NotePrintLocked() { last_awaited_in_ = records_in_; }

  // Like WaitForEarlierRecords, for the records up to the latest print tap
  // queued before this call only, counted per record as the consumer runs
  // them (NoteRan): a slow or blocked tap function queued after that print,
  // in the same batch or later, is not waited for.
  // Whether WaitForEarlierPrints would return at once (no waiting: the
  // caller may hold the GIL).
  bool EarlierPrintsRun() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t target = last_awaited_in_;
    return processed_ >= target ||
           ran_.load(std::memory_order_seq_cst) >= target ||
           consumer_dispatching_;
  }

  // `timeout_s` < 0: no deadline; else returns false if the prints were
  // not all run within that many seconds.
  bool WaitForEarlierPrints(double timeout_s = -1) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = last_awaited_in_;
    auto done = [&] {
      return processed_ >= target ||
             ran_.load(std::memory_order_seq_cst) >= target ||
             consumer_dispatching_;
    };
    if (done()) return true;
    awaited_waiters_.fetch_add(1, std::memory_order_seq_cst);
    // The consumer wakes the waiters once it has run this many records
    // (the lowest target of the waiters; see NoteRan).  Written under mu_
    // only; the wait below checks `done` again after it.
    if (target < awaited_wake_at_.load(std::memory_order_seq_cst)) {
      awaited_wake_at_.store(target, std::memory_order_seq_cst);
    }
    WakeConsumerLocked();  // it may be polling with taps not yet seen
    bool ok = true;
    if (timeout_s < 0) {
      processed_cv_.wait(lock, done);
    } else {
      ok = processed_cv_.wait_for(
          lock, std::chrono::duration<double>(timeout_s), done);
    }
    if (awaited_waiters_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
      awaited_wake_at_.store(kNever, std::memory_order_seq_cst);
    }
    return ok;
  }

  // The consumer has run the functions of `n` more records of the batch it
  // took (mu_ not held): wakes the host reads that wait for a print among
  // them once it has run the record they wait for.  Per record, where
  // `processed_` moves per batch only; the lock is taken only then, not per
  // record (a waiter with a later target may see a few early wake-ups while
  // one with an earlier target waits beside it).
  void NoteRan(uint64_t n) {
    const uint64_t ran = ran_.fetch_add(n, std::memory_order_seq_cst) + n;
    if (ran >= awaited_wake_at_.load(std::memory_order_seq_cst)) {
      std::unique_lock<std::mutex> lock = LockSpinning();
      processed_cv_.notify_all();
    }
  }

  // lock_sleeps: how often a producer or the consumer slept on mu_ after
  // its spin (LockSpinning), since the queue was made.
  struct Counters {
    uint64_t records_in, records_out, bytes_held, records_held, capacity,
        space_waiters, lock_sleeps;
  };
  // lock_sleeps alone, read without mu_: a test that holds mu_ (from
  // Reserve) sees another thread go to sleep on it.
  uint64_t LockSleeps() const {
    return lock_sleeps_.load(std::memory_order_relaxed);
  }
  Counters GetCounters() {
    std::lock_guard<std::mutex> lock(mu_);
    return Counters{records_in_,
                    records_out_,
                    HeldLocked(),
                    records_.size(),
                    capacity_,
                    static_cast<uint64_t>(space_waiters_),
                    lock_sleeps_.load(std::memory_order_relaxed)};
  }

 private:
  enum ConsumerState { kRunning, kPolling, kSleeping };

  // Whether r is ready: committed, or its ready word written (noted then).
  bool ReadyLocked(Record& r) {
    if (!r.ready && r.ready_word != nullptr &&
        __atomic_load_n(r.ready_word, __ATOMIC_ACQUIRE) != 0) {
      r.ready = true;
      --unready_;
    }
    return r.ready;
  }

  // The bytes counted against capacity_ (see the invariants above).
  uint64_t HeldLocked() const {
    return (head_ - tail_) + external_held_ + records_.size() * sizeof(Record);
  }

  // mu_, locked after spinning a while if it is held: the producers and the
  // consumer hold it for well under a microsecond, while a thread that
  // sleeps on it (a futex wait, and the holder's futex wake) loses several
  // (the device thread slept on it about once per batch the consumer
  // took).  Sleeps if it is still held after the spin (its holder
  // may have lost its CPU).
  std::unique_lock<std::mutex> LockSpinning() {
    if (!mu_.try_lock()) {
      const auto until = std::chrono::steady_clock::now() + kLockSpin;
      bool got = false;
      while (!got && std::chrono::steady_clock::now() < until) {
        for (int k = 0; k < 4; ++k) CpuRelax();
        got = mu_.try_lock();
      }
      if (!got) {
        lock_sleeps_.fetch_add(1, std::memory_order_relaxed);
        mu_.lock();
      }
    }
    return std::unique_lock<std::mutex>(mu_, std::adopt_lock);
  }
  // Longer than the holds above (a few hundred ns at most), shorter than
  // a sleep and a wake-up.  Bounded by time: a pause instruction takes
  // from 10 to 150 cycles, depending on the CPU.
  static constexpr std::chrono::microseconds kLockSpin{5};

  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }

  void WakeConsumerLocked() {
    if (consumer_state_ != kRunning) consumer_cv_.notify_one();
  }

  void ResetWhenEmptyLocked() {
    head_ = tail_ = 0;
    if (next_capacity_ != capacity_) {
      if (ring_ && next_capacity_ > mapped_) Unmap();
      capacity_ = next_capacity_;
    }
  }

  // Maps the ring on first use: untouched pages cost no memory.
  bool EnsureRingLocked() {
    if (ring_) return true;
    void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    ring_ = static_cast<uint8_t*>(p);
    mapped_ = capacity_;
    return true;
  }

  void Unmap() {
    if (ring_ && (!hooks_ || hooks_->BeforeUnmap(this, ring_, mapped_))) {
      munmap(ring_, mapped_);
    }
    ring_ = nullptr;
    mapped_ = 0;
  }

  const int32_t device_;
  const int32_t slot_;
  RingHooks* hooks_ = nullptr;
  std::mutex mu_;
  std::condition_variable space_cv_;      // producers waiting for space
  std::condition_variable consumer_cv_;   // the consumer waiting for records
  std::condition_variable processed_cv_;  // calls waiting for earlier taps
  RecordFifo records_;
  uint8_t* ring_ = nullptr;
  uint64_t mapped_ = 0;
  uint64_t capacity_;
  uint64_t next_capacity_;
  uint64_t head_ = 0;  // next free ring position (logical, mod capacity_)
  uint64_t tail_ = 0;  // first ring position still held
  uint64_t external_held_ = 0;
  int space_waiters_ = 0;
  int processed_waiters_ = 0;
  ConsumerState consumer_state_ = kRunning;
  bool consumer_active_ = false;
  std::atomic<bool> consumer_dispatching_{false};
  std::atomic<uint64_t> lock_sleeps_{0};  // see GetCounters
  uint64_t records_in_ = 0, records_out_ = 0;
  uint64_t unready_ = 0;  // queued records not ready yet
  // The consumer's, for WentQuiet: records_in_ at its latest take (that
  // returned records); whether that take found none reserved since the
  // take before it (quiet_); and WentQuiet's answer for it.
  uint64_t in_at_take_ = 0;
  bool quiet_ = true, went_quiet_ = false;
  uint64_t last_awaited_in_ = 0;  // records_in_ after the latest print tap
  // Records whose functions have run: those released before the consumer's
  // latest take (it takes again only after running a whole batch).
  uint64_t processed_ = 0;
  // Records whose functions have run, counted per record by the consumer
  // (NoteRan); host reads waiting for a print among them (awaited_waiters_).
  // On a cache line of their own, the last of the object: the consumer
  // writes ran_ once per record, and on the line of records_in_ and
  // head_, which a producer writes on every tap, that cost the producer a
  // cache miss per record the consumer ran.
  alignas(64) std::atomic<uint64_t> ran_{0};
  std::atomic<int> awaited_waiters_{0};
  static constexpr uint64_t kNever = ~uint64_t{0};
  std::atomic<uint64_t> awaited_wake_at_{kNever};  // see NoteRan
};

}  // namespace hostcb
