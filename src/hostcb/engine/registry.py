"""What the native engine's handlers and consumers call, by target id.

A native tap or call carries an integer ``target_id`` attribute; the
engine reads three tables indexed by it directly (no Python int is built
per tap or call to look one up).  Ids come from one sequence and one key
table shared by taps and calls, so each table has None where the other
kind has its ids.  Entries live as long as the process: a compiled
executable may run again at any time.

Ids are part of the lowered program, and so of the key of JAX's
persistent compilation cache.  To let a program lowered in another
process (of the same code) find its cache entry whatever else either
process registered before, a key's id does not count registrations: it is
the first free id at or after a hash of the key's text (its ``repr``
without memory addresses), among ``SPREAD`` ids.  Keys of the same text
(two closures of one ``lambda``) take the next free ids in the order they
come; in another order they get each other's ids, and the programs then
miss the cache, which is safe: a cache entry is found only by a program
lowered with the same ids, that is, bound to this process's functions.

* taps: id -> entry.  An entry ``(func, second)`` is called as
  ``func(arrays[0], second)`` (a tap function of one array that takes no
  device: no Python frame of ours per tap), any other entry as
  ``entry(arrays, device)``;
* calls: id -> ``run(arrays, device_ordinal)`` and id -> ``check(result)``
  (see :func:`call_id`).

Standard library only: the tables are plain lists.
"""
from __future__ import annotations

import hashlib
import re
import threading
from typing import Any, Callable

__all__ = ["tap_functions", "call_runners", "call_checks", "tap_id",
           "call_id"]

tap_functions: list[Any] = [None]
call_runners: list[Callable[[tuple, int], Any] | None] = [None]
call_checks: list[Callable[[Any], tuple] | None] = [None]
_ids: dict[Any, int] = {}  # key -> target id
_taken: set[int] = set()  # the values of _ids
_lock = threading.Lock()

# Ids start in [1, SPREAD]: the tables stay lists that small (and below
# the engine's table of print targets, 2**20).
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


def _assign_id(key: Any, install: Callable[[int], None]) -> int:
  """The target id of ``key``; a new one is passed to ``install`` first."""
  tid = _ids.get(key)
  if tid is None:
    with _lock:
      tid = _ids.get(key)
      if tid is None:
        tid = _first_choice(key)
        while tid in _taken:
          tid += 1
        install(tid)
        _ids[key] = tid
        _taken.add(tid)
  return tid


def _put(table: list, tid: int, value: Any) -> None:
  """``table[tid] = value``, the table grown with None as needed."""
  if len(table) <= tid:
    table.extend([None] * (tid + 1 - len(table)))
  table[tid] = value


def tap_id(key: Any, make: Callable[[], Any]) -> int:
  """The target id of the tap entry that ``make()`` builds, one per
  ``key`` (a tap function with its tree structure and transforms), so that
  recompiling a function does not grow the registry."""
  return _assign_id(key, lambda tid: _put(tap_functions, tid, make()))


def call_id(key: Any, make: Callable[[], tuple[Callable, Callable]]) -> int:
  """The target id of a call, one per ``key``.

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

  return _assign_id(key, install)


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
        tid = _first_choice(("named", name, spec))
        while tid in _taken:
          tid += 1
        install(tid)
        _taken.add(tid)
        found = _named[key] = (tid, install)
  return found[0]


def rebind(name: str) -> None:
  """Rebuilds the entries of every id of ``name`` (bound again)."""
  with _lock:
    entries = [v for (n, _), v in _named.items() if n == name]
  for tid, install in entries:
    install(tid)


def put_tap(tid: int, entry: Any) -> None:
  """Sets the tap entry of ``tid``."""
  _put(tap_functions, tid, entry)


def put_call(tid: int, run: Callable, check: Callable) -> None:
  """Sets the runner and the check of call ``tid``."""
  _put(call_checks, tid, check)
  _put(call_runners, tid, run)
