"""What the native engine's handlers and consumers call, by target id.

A native tap or call carries an integer ``target_id`` attribute; the
engine reads three tables indexed by it directly (no Python int is built
per tap or call to look one up).  Ids come from one key table shared by
taps and calls, so each table has None where the other kind has its ids.

Ids are part of the lowered program, and so of the key of JAX's
persistent compilation cache.  To let a program lowered in another
process (of the same code) find its cache entry whatever else either
process registered before, a key's id does not count registrations: it is
the first id never taken at or after a hash of the key's text (its
``repr`` without memory addresses), among ``SPREAD`` ids.  Keys of the
same text (two closures of one ``lambda``, a retraced function) take the
next ids in the order they come; in another order they get each other's
ids, and the programs then miss the cache, which is safe: a cache entry is
found only by a program lowered with the same ids, that is, bound to this
process's functions.

* taps: id -> entry.  An entry ``(func, second)`` is called as
  ``func(arrays[0], second)`` (a tap function of one array that takes no
  device: no Python frame of ours per tap), any other entry as
  ``entry(arrays, device)``;
* calls: id -> ``run(arrays, device_ordinal)`` and id -> ``check(result)``
  (see :func:`call_id`).

Keys.  The key table maps an opaque key to a target id.  The lowering
keys a process-local function by what it *is* (the primitive's target,
whose function compares by identity, see :mod:`hostcb.primitives`): two
callables that compare equal but are different objects get two ids.  A
key of another kind (a function registered under a stable name) can sit
beside those keys: nothing here looks inside a key.

Lifetime.  Each lowering that uses an id takes a :class:`Lease` and hands
it to JAX with the lowered module (its keep-alive list), which lives as
long as the compiled executable.  When the last lease of an id is gone
(``jax.clear_caches()``, the jitted function dropped), the id retires.
Its entry is freed once the computations that may still queue records of
it have finished (one dispatched just before its executable was dropped
may still run) and every record queued until then has run, so that a
queued tap still finds its function.  Who sees that: a barrier (it waits
for both), a consumer (between batches, and every ``_COLLECT_SECONDS``
while idle), a lowering (:func:`collect`, which asks
:data:`computations_finished` without waiting).  Ids are never reused:
were an entry freed too early, its record would find no function under
its id, which the engine reports as an error, never another function.  A
freed id leaves an empty slot (one list item per table).

A lease cannot be pickled: an executable that holds one cannot be
serialized (``jax.experimental.serialize_executable``), since its ids
mean nothing in another process (:class:`ProcessLocalFunctionError`).

Standard library only: the tables are plain lists.
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import pickle
import re
import threading
import time
from typing import Any, Callable

__all__ = ["tap_functions", "call_runners", "call_checks", "tap_id",
           "call_id", "Lease", "ProcessLocalFunctionError",
           "live_ids", "collect"]

tap_functions: list[Any] = [None]
call_runners: list[Callable[[tuple, int], Any] | None] = [None]
call_checks: list[Callable[[Any], tuple] | None] = [None]
_ids: dict[Any, int] = {}  # key -> target id
_keys: dict[int, Any] = {}  # target id -> key
_leases: dict[int, int] = {}  # target id -> live leases
_names: dict[int, str] = {}  # target id -> the function, for messages
_released: collections.deque = collections.deque()  # ids of dead leases
# [id, retired at (_retire_seq), records_in by queue once the computations
# that could queue records of it have finished, else None]
_retiring: list[list] = []
_retire_seq = itertools.count(1)
_last_retire_seq = [0]
# Every id ever given (freed ones too: an id is never reused), one bit
# each, and, per first choice, where the search for a free id goes on from.
_taken = bytearray()
_probe_from: dict[int, int] = {}
_lock = threading.Lock()

# Ids start in [1, SPREAD]: the tables stay lists that small (and below
# the engine's table of print targets, 2**20), plus one slot per id given.
SPREAD = 1 << 16
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _text(key: Any) -> str:
  """The key's text, the same in every process that runs the same code."""
  try:
    text = repr(key)
  except Exception:  # noqa: BLE001  (a failing repr: only the spread is lost)
    text = type(key).__qualname__
  return _ADDRESS.sub("", text)


def _first_choice(key: Any) -> int:
  digest = hashlib.blake2b(_text(key).encode("utf-8", "replace"),
                           digest_size=8).digest()
  return 1 + int.from_bytes(digest, "little") % SPREAD


def _new_id(key: Any) -> int:
  """An id never given before, from the key's first choice on (under the
  lock)."""
  first = _first_choice(key)
  tid = _probe_from.get(first, first)
  while tid >> 3 < len(_taken) and _taken[tid >> 3] >> (tid & 7) & 1:
    tid += 1
  if tid >> 3 >= len(_taken):
    _taken.extend(bytes((tid >> 3) + 1 - len(_taken)))
  _taken[tid >> 3] |= 1 << (tid & 7)
  _probe_from[first] = tid + 1
  return tid

# ``queue_positions() -> {queue: records queued so far}`` and
# ``queue_done(queue) -> records run so far``: set by the native back end
# (:mod:`.native`), whose queues hold records by target id.
queue_positions: Callable[[], dict[int, int]] = dict
queue_done: Callable[[int], int] = lambda queue: 0
# ``computations_finished() -> bool``: whether every computation dispatched
# so far that may tap has finished (without waiting; set by the engine):
# only then have the records of a freed executable all been queued.
computations_finished: Callable[[], bool] = lambda: True
# ``wake_collector()``: makes a thread that may call JAX run :func:`collect`
# soon (set by the native back end: its consumers); called from a
# finalizer, so it must neither wait nor call JAX.
wake_collector: Callable[[], None] = lambda: None


class ProcessLocalFunctionError(pickle.PicklingError):
  """A compiled executable that calls process-local host functions was
  serialized: in another process, its target ids would name other
  functions, or none."""


class Lease:
  """Keeps target id ``tid`` alive while this object lives; the lowering
  hands it to JAX's keep-alive list of the lowered module."""
  __slots__ = ("tid", "__weakref__")

  def __init__(self, tid: int):
    self.tid = tid

  def __del__(self):
    try:
      first = not _released
      _released.append(self.tid)
      _collect_if_free()
      if first:
        wake_collector()
    except Exception:  # noqa: BLE001  (interpreter exit: nothing to free)
      pass

  def __reduce__(self):
    raise ProcessLocalFunctionError(
        "hostcb: this executable calls the host function "
        f"{_names.get(self.tid, '?')} (hostcb target id {self.tid}), which "
        "exists only in the process that compiled it: in another process "
        "that id would call another function, or none, so an executable "
        "with hostcb taps or calls of process-local functions cannot be "
        "serialized. Register the function under a stable name "
        "(hostcb.register(name, fn)) to call it from a serialized "
        "executable, or serialize a program without it.")

  def __repr__(self) -> str:
    return f"<hostcb target {self.tid}: {_names.get(self.tid, '?')}>"


def _assign_id(key: Any, install: Callable[[int], None], name: str
               ) -> Lease:
  """A lease of the target id of ``key``; a new id is passed to
  ``install`` first."""
  with _lock:
    # (A lowering may ask JAX: it is no finalizer.)
    freed = _collect_locked(check_computations=True)
    tid = _ids.get(key)
    if tid is None:
      tid = _new_id(key)
      install(tid)
      _ids[key] = tid
      _keys[tid] = key
      _names[tid] = name
    _leases[tid] = _leases.get(tid, 0) + 1
  del freed  # the functions freed, out of the lock (their __del__ may run)
  return Lease(tid)


def _put(table: list, tid: int, value: Any) -> None:
  """``table[tid] = value``, the table grown with None as needed."""
  if len(table) <= tid:
    table.extend([None] * (tid + 1 - len(table)))
  table[tid] = value


def _name(func: Any) -> str:
  try:
    return repr(func)[:200]
  except Exception:  # noqa: BLE001  (a broken __repr__: the type says enough)
    return f"<{type(func).__name__} object>"


def tap_id(key: Any, make: Callable[[], Any], func: Any = None) -> Lease:
  """A lease of the target id (``.tid``) of the tap entry that ``make()``
  builds, one per ``key`` (a tap function with its tree structure and
  transforms), so that recompiling a live function does not grow the
  registry.  ``func``: the function, named in error messages."""
  return _assign_id(key, lambda tid: _put(tap_functions, tid, make()),
                    _name(func))


def call_id(key: Any, make: Callable[[], tuple[Callable, Callable]],
            func: Any = None) -> Lease:
  """A lease of the target id of a call, one per ``key``.

  ``make()`` returns ``(run, check)``: ``run(arrays, device_ordinal)``
  calls the host function and returns its flat, checked results (or, for a
  call lowered to ``hostcb_call_one``, the host function's result as it
  is); ``check(result)`` turns such a result into the flat, checked
  results or raises.
  """
  def install(tid: int) -> None:
    run, check = make()
    _put(call_checks, tid, check)
    _put(call_runners, tid, run)

  return _assign_id(key, install, _name(func))


def live_ids() -> int:
  """How many target ids have an entry (for tests)."""
  return len(_keys)


def collect() -> None:
  """Frees the entries of retired ids whose queued records have all run.

  Asks :data:`computations_finished` (JAX), at most every
  :data:`CHECK_SECONDS`: call it where JAX may be called (a consumer
  between batches, a barrier, a lowering), never from a finalizer.
  """
  with _lock:
    freed = _collect_locked(check_computations=True)
  del freed  # out of the lock


def _collect_if_free() -> None:
  # A lease may die inside a registry call of the same thread (a garbage
  # collection): the lock is then held, and the next call collects.
  if _lock.acquire(blocking=False):
    try:
      freed = _collect_locked()
    finally:
      _lock.release()
    del freed  # out of the lock


# collect() asks JAX whether the computations finished at most this often.
CHECK_SECONDS = 0.05
_last_check = [-CHECK_SECONDS]


def _collect_locked(check_computations: bool = False) -> list:
  """Retires the ids of dead leases, frees what can be; returns the freed
  entries, to drop once the lock is released.  Only with
  ``check_computations`` does it ask JAX (:data:`computations_finished`):
  a lease dies in a garbage collection, which may run inside JAX code
  that holds a lock that JAX would take again."""
  while _released:
    tid = _released.popleft()
    n = _leases.get(tid, 0) - 1
    if n > 0:
      _leases[tid] = n
      continue
    _leases.pop(tid, None)
    key = _keys.get(tid)
    if key is not None and _ids.get(key) == tid:
      del _ids[key]  # a new lowering of it gets a new id
    seq = next(_retire_seq)
    _last_retire_seq[0] = seq
    _retiring.append([tid, seq, None])
  if not _retiring:
    return []
  if (check_computations and any(r[2] is None for r in _retiring)
      and time.monotonic() - _last_check[0] >= CHECK_SECONDS):
    _last_check[0] = time.monotonic()
    if computations_finished():
      positions = queue_positions()
      for r in _retiring:
        if r[2] is None:
          r[2] = positions
  kept, freed = [], []
  done: dict[int, int] = {}  # records run, per queue, read once
  for r in _retiring:
    tid, _, positions = r
    if positions is None:
      kept.append(r)
      continue
    passed = True
    for q, n in positions.items():
      if q not in done:
        done[q] = queue_done(q)
      if done[q] < n:
        passed = False
        break
    if not passed:
      kept.append(r)
      continue
    _keys.pop(tid, None)
    _names.pop(tid, None)
    for table in (tap_functions, call_runners, call_checks):
      if tid < len(table):
        freed.append(table[tid])
        table[tid] = None
  _retiring[:] = kept
  return freed


def pending() -> bool:
  """Whether retired ids wait for their computations or queued records."""
  return bool(_retiring or _released)


def barrier_started() -> int:
  """Called as a barrier starts: returns the mark to pass to
  :func:`barrier_done` (the ids whose last lease died so far retire now)."""
  collect()
  return _last_retire_seq[0]


def barrier_done(mark: int) -> None:
  """A barrier that started at ``mark`` has seen every computation
  dispatched before it finish and every record they queued run: the ids
  retired before it need wait for nothing more."""
  with _lock:
    for r in _retiring:
      if r[1] <= mark:
        r[2] = {}
    freed = _collect_locked()
  del freed  # out of the lock


def after_fork_in_child() -> None:
  """The child keeps the tables (its executables use the same ids)."""
  global _lock
  _lock = threading.Lock()
