"""The host functions that the native engine runs, by target id: the
tables of their entries, and the leases that keep them.

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

* taps: id -> a tap entry;
* calls: id -> its runner and id -> its check (the two fields of the
  call's :class:`~hostcb._engine.entries.CallEntry`, see :func:`call_id`);

each of a kind of :mod:`hostcb._engine.entries`, which the engine runs.

Keys.  The key table maps an opaque key to a target id.  The lowering
keys a process-local function by what it *is* (the primitive's target,
whose function compares by identity, see :mod:`hostcb._core.primitives`): two
callables that compare equal but are different objects get two ids.  A
key of another kind (a function registered under a stable name) can sit
beside those keys: nothing here looks inside a key.

Lifetime.  Each lowering that uses an id takes a :class:`Lease` and hands
it to JAX with the lowered module (its keep-alive list), which lives as
long as the compiled executable.  When the last lease of an id is gone
(``jax.clear_caches()``, the jitted function dropped), the id retires.
Retired is not yet free: a computation of its executable may still be
running (one dispatched just before the executable was dropped, its
results dropped too), and its taps may still be queued or not yet made.
A retired id's entry is freed at the first of two points where no queued
or running record can name it:

* the engine says the id is quiet (:func:`count_executables`; the native
  engine on CPU, ``lifetimes.cc``): XLA has destroyed every executable
  that names the id, which it does only after their last computation has
  ended, and each device's consumer has passed a marker queued behind
  every record queued by then.  Whichever comes last frees it: the
  retirement here, or the consumer that passes the last marker
  (:func:`free_quiet`).  An id lowered for another platform (the GPU back
  end), or whose executables the engine could not count, waits for the
  second point;
* the next barrier (:func:`barrier_done`), which waits for the
  computations it covers and for the records they queued.

A finalizer (where a lease dies) must not call JAX, and a check without
waiting cannot see a running computation: hence the engine's count of
the executables themselves.  Ids are never reused: were an entry freed
too early, its record would find no function under its id, which the
engine reports as an error, never another function.  A freed id leaves
an empty slot (one list item per table).

A lease cannot be pickled: an executable that holds one cannot be
serialized (``jax.experimental.serialize_executable``), since its ids
mean nothing in another process (:class:`ProcessLocalFunctionError`).

Standard library only: the tables are plain lists; the engine that
counts executables is handed in (:func:`count_executables`).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import pickle
import re
import threading
from typing import Any, Callable

from hostcb._engine.entries import (
  CallEntry,
  CallRunner,
  DirectCall,
  TapEntry,
)

__all__ = [
  "tap_functions",
  "call_runners",
  "call_checks",
  "tap_id",
  "call_id",
  "Lease",
  "ProcessLocalFunctionError",
  "live_ids",
  "collect",
  "count_executables",
  "free_quiet",
]

tap_functions: list[TapEntry | None] = [None]
call_runners: list[CallRunner | DirectCall | None] = [None]
call_checks: list[Callable[[Any], tuple] | None] = [None]
_ids: dict[Any, int] = {}  # key -> target id
_keys: dict[int, Any] = {}  # target id -> key
_leases: dict[int, int] = {}  # target id -> live leases
_names: dict[int, str] = {}  # target id -> the function, for messages
_released: collections.deque = collections.deque()  # ids of dead leases
# id -> retired at (_retire_seq): freed once quiet, or by the next barrier
_retiring: dict[int, int] = {}
# Ids ever leased by a lowering whose executables the engine does not
# count (another platform): only a barrier frees them.
_uncounted: set[int] = set()
# [retire(tid) -> quiet now?, take_quiet() -> [tid]] of the engine that
# counts the executables of each id (count_executables), or empty.
_counter: list[Callable] = []
_quiet_later: collections.deque = collections.deque()  # see free_quiet
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
  digest = hashlib.blake2b(
    _text(key).encode("utf-8", "replace"), digest_size=8
  ).digest()
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


class ProcessLocalFunctionError(pickle.PicklingError):
  """A compiled executable that calls process-local host functions was
  serialized: in another process, its target ids would name other
  functions, or none."""

  __module__ = "hostcb.engine"


class Lease:
  """Keeps target id ``tid`` alive while this object lives; the lowering
  hands it to JAX's keep-alive list of the lowered module."""

  __slots__ = ("tid", "__weakref__")

  def __init__(self, tid: int):
    self.tid = tid

  def __del__(self):
    try:
      _released.append(self.tid)
      _collect_if_free()
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
      "executable, or serialize a program without it."
    )

  def __repr__(self) -> str:
    return f"<hostcb target {self.tid}: {_names.get(self.tid, '?')}>"


def _assign_id(
  key: Any, install: Callable[[int], None], name: str, counted: bool
) -> Lease:
  """A lease of the target id of ``key``; a new id is passed to
  ``install`` first.  ``counted``: the engine counts the executables of
  this lowering (see :func:`count_executables`)."""
  with _lock:
    freed = _collect_locked()
    tid = _ids.get(key)
    if tid is None:
      tid = _new_id(key)
      install(tid)
      _ids[key] = tid
      _keys[tid] = key
      _names[tid] = name
    _leases[tid] = _leases.get(tid, 0) + 1
    if not counted:
      _uncounted.add(tid)
  del freed  # the functions, out of the lock (their __del__ may run)
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


def tap_id(
  key: Any, make: Callable[[], Any], func: Any = None, counted: bool = False
) -> Lease:
  """A lease of the target id (``.tid``) of the tap entry that ``make()``
  builds, one per ``key`` (a tap function with its tree structure and
  transforms), so that recompiling a live function does not grow the
  registry.  ``func``: the function, named in error messages;
  ``counted``: the engine counts the executables of this lowering."""
  return _assign_id(
    key, lambda tid: _put(tap_functions, tid, make()), _name(func), counted
  )


def call_id(
  key: Any,
  make: Callable[[], CallEntry],
  func: Any = None,
  counted: bool = False,
) -> Lease:
  """A lease of the target id of the call entry that ``make()`` builds,
  one per ``key``: its runner runs the host function, and its
  ``check(result)`` turns a result that the ``hostcb_call_one`` handler
  does not take as it is into the flat, checked results, or raises."""
  return _assign_id(
    key, lambda tid: put_call(tid, make()), _name(func), counted
  )


def live_ids() -> int:
  """How many target ids have an entry (for tests)."""
  return len(_keys)


def collect() -> None:
  """Retires the ids whose last lease died (each is freed once quiet, or
  by the next barrier)."""
  with _lock:
    freed = _collect_locked()
  del freed


def _collect_if_free() -> None:
  # A lease may die inside a registry call of the same thread (a garbage
  # collection): the lock is then held, and that call collects.
  if _lock.acquire(blocking=False):
    try:
      freed = _collect_locked()
    finally:
      _lock.release()
    del freed


def _collect_locked() -> list:
  """Retires the ids of dead leases, and frees those that the engine says
  are quiet (JAX is not called: a lease dies in a garbage collection,
  which may run inside JAX code).  Returns the freed entries, to drop once
  the lock is released."""
  freed: list = []
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
    _retiring[tid] = seq
    if _counter and _counter[0](tid):  # quiet already
      _free_locked(tid, freed)
  if _counter:
    for tid in _counter[1]():
      _free_locked(tid, freed)
  while _quiet_later:
    _free_locked(_quiet_later.popleft(), freed)
  return freed


def _free_locked(tid: int, freed: list) -> None:
  """Frees the entry of retired id ``tid``, unless a lowering the engine
  does not count leased it (then the next barrier frees it)."""
  if tid not in _retiring or tid in _uncounted:
    return
  del _retiring[tid]
  _keys.pop(tid, None)
  _names.pop(tid, None)
  for table in (tap_functions, call_runners, call_checks):
    if tid < len(table):
      freed.append(table[tid])
      table[tid] = None


def count_executables(
  retire: Callable[[int], bool], take_quiet: Callable[[], list[int]]
) -> None:
  """Hands in the engine that counts the executables of each id (set once
  its handlers count them): ``retire(tid)`` is told that ``tid``'s last
  lease died and answers whether it is quiet already; ``take_quiet()``
  returns retired ids that became quiet since, where no consumer said so
  (:func:`free_quiet`)."""
  _counter[:] = [retire, take_quiet]


def free_quiet(tid: int, may_wait: bool = True) -> None:
  """The engine says retired id ``tid`` is quiet (a consumer passed the
  last marker behind its records, or its last executable went where no
  consumer runs): frees its entry.  Without ``may_wait`` (a garbage
  collection, which may run inside a registry call that holds the lock),
  an id that cannot be freed at once is freed by the next registry call."""
  freed: list = []
  if not _lock.acquire(blocking=may_wait):
    _quiet_later.append(tid)
    return
  try:
    _free_locked(tid, freed)
  finally:
    _lock.release()
  del freed


def pending() -> bool:
  """Whether retired ids wait to be freed."""
  return bool(_retiring or _released)


def barrier_started() -> int:
  """Called as a barrier starts: returns the mark to pass to
  :func:`barrier_done` (the ids whose last lease died so far retire now)."""
  collect()
  return _last_retire_seq[0]


def barrier_done(mark: int) -> None:
  """A barrier that started at ``mark`` has seen every computation
  dispatched before it finish (those it covers: see
  :func:`hostcb.barrier_wait`) and every record they queued run: frees the
  entries of the ids retired before it."""
  freed: list = []
  with _lock:
    for tid, seq in list(_retiring.items()):
      if seq <= mark:
        _uncounted.discard(tid)
        _free_locked(tid, freed)
  del freed  # the functions, out of the lock (their __del__ may run)


def after_fork_in_child() -> None:
  """The child keeps the tables (its executables use the same ids)."""
  global _lock
  _lock = threading.Lock()


# ------------------------------------------------ host functions by name
# Beside the ids above, the ids of host functions registered by name
# (hostcb.register, docs/export.md), keyed by (name, spec): the text that a
# program carries instead of an id, so that it may run in another process.
# Their entries are rebuilt when the name is bound again, and live as long
# as the process: a program that names them may be loaded at any time.
__all__ += ["named_id", "rebind", "put_tap", "put_call"]

_named: dict[tuple[str, str], tuple[int, Callable[[int], None]]] = {}


def named_id(name: str, spec: str, install: Callable[[int], None]) -> int:
  """The target id of ``(name, spec)``; ``install(tid)`` puts its entry in
  the tables, now for a new id, and again at each :func:`rebind` of
  ``name``."""
  key = (name, spec)
  found = _named.get(key)
  if found is None:
    with _lock:
      found = _named.get(key)
      if found is None:
        tid = _new_id(("named", name, spec))
        install(tid)
        found = _named[key] = (tid, install)
  return found[0]


def rebind(name: str) -> None:
  """Rebuilds the entries of every id of ``name`` (bound again)."""
  with _lock:
    entries = [v for (n, _), v in _named.items() if n == name]
  for tid, install in entries:
    install(tid)


def put_tap(tid: int, entry: TapEntry) -> None:
  """Sets the tap entry of ``tid``."""
  _put(tap_functions, tid, entry)


def put_call(tid: int, entry: CallEntry) -> None:
  """Sets the runner and the check of call ``tid``."""
  _put(call_checks, tid, entry.check)
  _put(call_runners, tid, entry.runner)
