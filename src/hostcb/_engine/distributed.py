"""hostcb in a multi-process JAX program (``jax.distributed.initialize``).

hostcb has no transport of its own between processes: a callback runs in
the process that owns the device making it, through XLA's ordinary host
callback, and each process has its own tap queues.  In short:

* ``jit``/``pjit`` over a global mesh: a tap or ``call`` runs once, in the
  process owning device ``device_index`` (default 0) of the computation's
  devices, with the whole operand; the other processes do not call the
  function.  A ``call``'s result reaches every process's shards through
  XLA's collectives.
* ``pmap``/``shard_map``: each process runs the callbacks of its own local
  devices; ``device=`` is the global ``jax.Device``.
* ``barrier_wait()`` waits for this process's taps only;
  ``barrier_wait(all_processes=True)`` then also waits, through JAX's
  distributed runtime (the coordination service), until every process has
  reached its own ``barrier_wait(all_processes=True)``.

Every process must call ``barrier_wait(all_processes=True)`` the same number
of times, from one thread: the n-th call of each process meets the n-th
call of the others.  A wait that lasts longer than the timeout (default
300 s, :func:`set_timeout` or the ``HOSTCB_BARRIER_TIMEOUT_S`` environment
variable) raises :class:`TimeoutError` instead of hanging.
"""

from __future__ import annotations

import itertools
import os
import threading

import jax

from hostcb import _jax_internals as ji

__all__ = ["wait_for_all_processes", "set_timeout", "get_timeout"]

_TIMEOUT_ENV = "HOSTCB_BARRIER_TIMEOUT_S"
_DEFAULT_TIMEOUT_S = 300.0


def _check_timeout(seconds, what: str) -> float:
  try:
    value = float(seconds)
  except (TypeError, ValueError):
    value = float("nan")
  if not value > 0 or value == float("inf"):
    raise ValueError(
      f"{what} must be a positive, finite number of seconds; got {seconds!r}"
    )
  return value


def _timeout_from_env() -> float:
  raw = os.environ.get(_TIMEOUT_ENV)
  if raw is None:
    return _DEFAULT_TIMEOUT_S
  return _check_timeout(raw, f"environment variable {_TIMEOUT_ENV}")


_timeout_s = _timeout_from_env()
_counter = itertools.count()
_counter_lock = threading.Lock()


def set_timeout(seconds: float) -> None:
  """Sets how long ``barrier_wait(all_processes=True)`` waits for the others.

  Args:
    seconds: a positive number of seconds (default 300, or the
      ``HOSTCB_BARRIER_TIMEOUT_S`` environment variable at import).
  """
  global _timeout_s
  _timeout_s = _check_timeout(seconds, "the barrier timeout")


def get_timeout() -> float:
  """The current timeout of ``barrier_wait(all_processes=True)``, seconds."""
  return _timeout_s


def _next_barrier_id() -> tuple[int, str]:
  with _counter_lock:
    n = next(_counter)
  return n, f"hostcb_barrier_wait_{n}"


def wait_for_all_processes(
  name: str = "", *, timeout_s: float | None = None
) -> None:
  """Waits until every process of the JAX program reaches this barrier.

  In a single-process program (``jax.distributed`` not initialized and one
  process) it returns at once.  The n-th call in each process meets the
  n-th call in every other process.

  Args:
    name: shown in error messages (the ``logging_name`` of
      ``barrier_wait``); it does not need to match across processes.
    timeout_s: how long to wait; default :func:`get_timeout`.

  Raises:
    TimeoutError: some process did not reach its barrier in time (it failed,
      is still busy, or calls ``barrier_wait(all_processes=True)`` fewer
      times).
    RuntimeError: the program runs several processes but
      ``jax.distributed`` is not initialized in this one, or the
      distributed runtime failed (e.g. a process died).
  """
  timeout = (
    _timeout_s if timeout_s is None else _check_timeout(timeout_s, "timeout_s")
  )
  n, barrier_id = _next_barrier_id()
  label = (
    f"barrier_wait({name!r}, all_processes=True)"
    if name
    else "barrier_wait(all_processes=True)"
  )
  try:
    waited = ji.wait_at_process_barrier(
      barrier_id, max(1, round(timeout * 1000))
    )
  except jax.errors.JaxRuntimeError as e:
    where = (
      f"process {jax.process_index()} of {jax.process_count()}, "
      f"call number {n + 1} of {label} in this process"
    )
    if str(e).startswith("DEADLINE_EXCEEDED"):
      raise TimeoutError(
        f"{label} waited {timeout:g} s for the other processes and not all "
        f"came ({where}). Every process must call "
        "barrier_wait(all_processes=True) the same number of times; a "
        "process that failed or is still busy never arrives. Raise the "
        "timeout with hostcb.set_barrier_timeout(seconds) or "
        f"{_TIMEOUT_ENV}."
      ) from e
    raise RuntimeError(
      f"{label} failed in JAX's distributed runtime ({where}): {e}"
    ) from e
  if not waited and jax.process_count() > 1:
    raise RuntimeError(
      f"{label} needs JAX's distributed runtime: this program has "
      f"{jax.process_count()} processes but jax.distributed.initialize() "
      "was not called in this one (expected an initialized "
      "jax.distributed; got none)"
    )
