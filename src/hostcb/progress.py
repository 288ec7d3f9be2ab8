"""Progress bars for compiled loops: ``hostcb.progress.scan``, ``fori_loop``
and ``while_loop``.

Drop-in replacements for ``lax.scan``, ``lax.fori_loop`` and
``lax.while_loop`` (same arguments, same results) that show a tqdm bar
(``tqdm.auto``: a terminal bar, or a widget in a notebook) while the loop
runs on the device::

  from hostcb import progress
  final, ys = progress.scan(step, init, xs, desc="training")

How it works: the wrapper keeps its own step counter in the loop's carry
and taps it to the host with :func:`hostcb.id_tap` (asynchronous, in
program order per device): once before the loop, every ``k`` steps inside a
``lax.cond`` decided on the device (``k`` chosen from the total so that at
most about ``updates`` taps happen), and once after the loop with the final
count, which closes the bar.  The loop's values are those of ``lax``.

Under the transformations:

* ``jit``: one bar per run of the compiled loop.
* ``vmap``: one bar for the whole batch (``batch="each"``: one per element).
  In a ``while_loop`` whose predicate is batched the bar counts the loop's
  iterations (the longest-running element).
* ``pmap`` and ``shard_map``: one bar for all the devices, showing the
  slowest one (``devices="each"``: one bar per device).  Sharded ``jit``
  (no ``shard_map``) runs one loop: one bar.
* several processes: each process shows the bars of its own devices
  (``processes="first"``: only process 0 shows bars).
* nested loops: nested bars (the inner bar is redrawn under the outer one
  at each outer step, and cleared when it ends).
* ``grad``: the bar follows the forward loop.

At the end: the last tap sets the bar to its final count and closes it,
also when the script ends right after the loop (the exit handler waits for
the taps first).  A bar whose loop never ended (an exception, Ctrl-C) is
closed where it stopped before Python prints the traceback, at exit, by the
next run of the same loop, or by :func:`close_all`.

tqdm is an optional dependency: ``pip install hostcb[progress]``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import logging
import math
import operator
import sys
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:
  import tqdm.auto as _tqdm_auto
except ImportError as _e:  # pragma: no cover  (tested in a subprocess)
  raise ImportError(
    "hostcb.progress needs tqdm, which is not installed: "
    "pip install hostcb[progress]  (or: pip install tqdm)"
  ) from _e

from hostcb._engine import wait_for_taps
from hostcb._jax_internals import patches
from hostcb._engine.lifecycle import EXIT_TIMEOUT_SECONDS
from hostcb.host_callback import id_tap


class UnsupportedJax(ImportError):
  """The running JAX cannot carry hostcb.progress's taps: raised when the
  first progress loop is traced (see :func:`_require_supported_jax`).  An
  ``ImportError``, as it was when the import itself checked."""


@functools.cache
def _custom_vmap_keeps_taps() -> bool:
  """Whether ``jax.custom_batching.custom_vmap`` keeps the effect of a tap
  in the function it wraps, which the bars need (a ``vmap`` shows one bar
  for the batch through it).  jax 0.10 and 0.12 keep it; jax 0.8 drops it
  (the wrapped taps would be removed as dead code, and control flow around
  them fails to lower).  Asked once, by the first progress loop: importing
  this module traces nothing, so it starts none of JAX's backends."""

  @jax.custom_batching.custom_vmap
  def probe(x):
    id_tap(lambda a, t: None, x)
    return x

  @probe.def_vmap
  def _probe_batched(axis_size, in_batched, x):
    return probe(x), in_batched[0]

  # Only traced: the probe installs none of hostcb's patches.
  with patches.tracing_only():
    return bool(jax.make_jaxpr(lambda x: (probe(x), x)[1])(1.0).effects)


def _require_supported_jax() -> None:
  """Raises :class:`UnsupportedJax` unless this JAX keeps the bars' taps."""
  if not _custom_vmap_keeps_taps():
    raise UnsupportedJax(
      f"hostcb.progress needs a JAX whose jax.custom_batching.custom_vmap "
      f"keeps the effects of the function it wraps; jax {jax.__version__} "
      "drops them (jax 0.10.2 and 0.12.0.1 keep them): pip install -U jax"
    )


__all__ = [
  "scan",
  "fori_loop",
  "while_loop",
  "close_all",
  "DEFAULT_UPDATES",
  "UnsupportedJax",
]

logger = logging.getLogger("hostcb")

DEFAULT_UPDATES = 200
"""At most about this many bar updates per loop run, by default."""

_NO_TOTAL = -1  # the device's code for "total unknown"


# ------------------------------------------------------------- options
@dataclasses.dataclass(frozen=True)
class _Options:
  desc: str | None
  every: int | None
  updates: int
  devices: str
  batch: str
  processes: str
  tqdm_class: Any
  tqdm_kwargs: tuple  # sorted (key, value) pairs


def _options(
  desc, every, updates, devices, batch, processes, tqdm_class, tqdm_kwargs
) -> _Options:
  if desc is not None and not isinstance(desc, str):
    raise TypeError(f"desc must be a str or None; got {desc!r}")
  if every is not None and (
    isinstance(every, bool) or not isinstance(every, int) or every < 1
  ):
    raise ValueError(f"every must be a positive int or None; got {every!r}")
  if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
    raise ValueError(f"updates must be a positive int; got {updates!r}")
  if devices not in ("combined", "each"):
    raise ValueError(f"devices must be 'combined' or 'each'; got {devices!r}")
  if batch not in ("combined", "each"):
    raise ValueError(f"batch must be 'combined' or 'each'; got {batch!r}")
  if processes not in ("each", "first"):
    raise ValueError(f"processes must be 'each' or 'first'; got {processes!r}")
  if tqdm_class is not None and not callable(tqdm_class):
    raise TypeError(f"tqdm_class must be a tqdm class; got {tqdm_class!r}")
  if tqdm_kwargs is None:
    tqdm_kwargs = {}
  if not isinstance(tqdm_kwargs, dict):
    raise TypeError(f"tqdm_kwargs must be a dict; got {tqdm_kwargs!r}")
  for key in ("total", "initial"):
    if key in tqdm_kwargs:
      raise ValueError(f"tqdm_kwargs may not set {key!r}: the loop sets it")
  return _Options(
    desc,
    every,
    updates,
    devices,
    batch,
    processes,
    tqdm_class,
    tuple(sorted(tqdm_kwargs.items())),
  )


# ------------------------------------------------- nesting (trace time)
_tracing = threading.local()


def _depth() -> int:
  return getattr(_tracing, "depth", 0)


@contextlib.contextmanager
def _inside_loop():
  """While a progress loop's body is traced: bars of loops in it nest."""
  _tracing.depth = _depth() + 1
  try:
    yield
  finally:
    _tracing.depth -= 1


def _tapping_devices() -> int:
  """How many devices of this process run the code being traced: in
  per-device code (``pmap``, ``shard_map``) the devices of the mesh, shared
  evenly among the processes; elsewhere 1 (sharded ``jit`` taps on one
  device)."""
  get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
  if get_mesh is None:  # an older JAX: the host counts the devices it sees
    return 1
  mesh = get_mesh()
  if not getattr(mesh, "manual_axes", ()):
    return 1
  return max(1, math.prod(mesh.shape.values()) // jax.process_count())


# ------------------------------------------------------ the host's side
_open_lock = threading.RLock()
_open_runs: set = set()  # the runs whose bar is open, of every loop
_traced = [False]  # a progress loop was traced in this process


class _Run:
  """One run of a loop, as one bar: its sources (devices) and their
  steps."""

  def __init__(self, bar, expected: int):
    self.bar = bar
    self.expected = expected
    self.steps: dict = {}
    self.ended: set = set()
    self.closed = False

  def count(self) -> int:
    """The slowest running device's step; once all have ended, the
    furthest one's."""
    if len(self.steps) < self.expected:
      return 0  # a device that has not started is at step 0
    running = [s for d, s in self.steps.items() if d not in self.ended]
    return min(running) if running else max(self.steps.values())

  def show(self) -> None:
    n = self.count()
    if n > self.bar.n:
      self.bar.update(n - self.bar.n)

  def close(self) -> None:
    if not self.closed:
      self.closed = True
      _open_runs.discard(self)
      self.bar.close()


class _Site:
  """The host side of one progress loop as traced: its bars, one per
  group (a device with ``devices="each"``, a batch element with
  ``batch="each"``), each fed by one or several devices."""

  def __init__(
    self,
    opts: _Options,
    expected_devices: int,
    depth: int,
    silent: bool = False,
  ):
    self.opts = opts
    self.silent = silent
    self.expected = 1 if opts.devices == "each" else expected_devices
    self.depth = depth
    self.runs: dict = {}  # (group, run index) -> _Run
    self.started: dict = {}  # (where, device) -> the run index it is in
    self.devices: dict = {}  # group -> the devices that reported for it
    self.done: set = set()  # (group, run index) of the runs that ended

  # Tap functions: ``arg`` is (steps, totals), of equal shapes: one entry
  # per batch element with batch="each", else scalars.  A group is
  # (where, element): ``where`` the device with devices="each" (else
  # None), ``element`` the batch element with batch="each" (else None).
  # Every start tap of a device begins its next run, for all the elements
  # it carries; an element that the start did not carry (the loop is
  # batched only inside its body, e.g. through a closure) gets its bar at
  # its first update.
  def on_start(self, arg, transforms, *, device=None) -> None:
    del transforms
    with _open_lock:
      entries = self._entries(arg, device)
      if not entries:
        return
      where = entries[0][0][0]
      r = self.started.get((where, device), 0) + 1
      self.started[(where, device)] = r
      for (group, run_index), run in list(self.runs.items()):
        if (
          group[0] == where
          and run_index < r
          and device in run.steps
          and device not in run.ended
        ):
          # This device started again without ending its previous run:
          # that run stopped (an exception); its bar stays where it was.
          run.close()
          del self.runs[(group, run_index)]
      self.done = {(g, i) for g, i in self.done if g[0] != where or i >= r}
      for group, step, total in entries:
        self._report(group, r, device, step, total)

  def on_update(self, arg, transforms, *, device=None) -> None:
    del transforms
    with _open_lock:
      for group, step, total in self._entries(arg, device):
        run = self._run(group, device, total)
        if run is None or run.closed:  # closed meanwhile (close_all, or
          continue  # its device failed): not shown
        run.steps[device] = step
        run.show()

  def on_end(self, arg, transforms, *, device=None) -> None:
    del transforms
    with _open_lock:
      for group, step, total in self._entries(arg, device):
        run = self._run(group, device, total)
        if run is None:
          continue
        r = self.started[(group[0], device)]
        if run.closed:  # by close_all: forgotten
          del self.runs[(group, r)]
          self.done.add((group, r))
          continue
        run.steps[device] = step
        run.ended.add(device)
        if len(run.ended) >= run.expected:
          n = run.count()
          if run.bar.total is None:  # a while_loop without total
            run.bar.total = n
          if n != run.bar.n:
            run.bar.update(n - run.bar.n)
          run.close()
          del self.runs[(group, r)]
          self.done.add((group, r))
        else:
          run.show()

  def _run(self, group, device, total: int):
    """The run that an update or end of ``group`` from ``device`` belongs
    to, made now for an element that its run's start did not carry; None
    if that device has not started or the run has ended."""
    r = self.started.get((group[0], device))
    if r is None or (group, r) in self.done:
      return None
    run = self.runs.get((group, r))
    if run is None:
      run = self._report(group, r, device, 0, total)
    return run

  def _report(self, group, r: int, device, step: int, total: int) -> _Run:
    """Makes the run ``(group, r)`` if it has no bar yet and notes that
    ``device`` is at ``step`` in it."""
    self.devices.setdefault(group, set()).add(device)
    run = self.runs.get((group, r))
    if run is None:
      run = self.runs[(group, r)] = _Run(self._bar(group, total), self.expected)
      _open_runs.add(run)
    elif total > (run.bar.total or 0) >= 0:  # devices of other totals:
      run.bar.total = total  # the largest
    run.steps.setdefault(device, step)
    self._grow(run, group)
    return run

  def _grow(self, run: _Run, group) -> None:
    # More devices than the trace saw (JAX without abstract meshes, where
    # pmap is not a shard_map): count every device that reported for it.
    run.expected = max(run.expected, len(self.devices[group]))

  def _entries(self, arg, device) -> list:
    """(group, step, total) per bar that ``arg`` updates."""
    if self.silent:
      return []
    steps, totals = arg
    where = device if self.opts.devices == "each" else None
    if np.ndim(steps) == 0 and np.ndim(totals) == 0:  # the common case
      return [
        (
          (where, 0 if self.opts.batch == "each" else None),
          int(steps),
          int(totals),
        )
      ]
    steps, totals = np.broadcast_arrays(steps, totals)
    return [
      ((where, i), int(s), int(t))
      for i, (s, t) in enumerate(
        zip(steps.ravel().tolist(), totals.ravel().tolist())
      )
    ]

  def _bar(self, group, total: int):
    device, element = group
    desc = self.opts.desc or ""
    parts = []
    if device is not None:
      parts.append(
        f"{device.platform}:{device.id}"
        if hasattr(device, "platform")
        else str(device)
      )
    elif self.expected > 1:
      parts.append(f"{self.expected} devices")
    if element is not None:
      parts.append(f"#{element}")
    if parts:
      desc = f"{desc} [{', '.join(parts)}]".strip()
    kwargs = {"desc": desc or None, "leave": self.depth == 0}
    kwargs.update(dict(self.opts.tqdm_kwargs))
    kwargs["total"] = None if total < 0 else total
    make = self.opts.tqdm_class or _tqdm_auto.tqdm
    return make(**kwargs)


def close_all() -> None:
  """Closes every open bar where it stands (e.g. in a notebook, after a
  loop stopped with an exception); taps of their runs that still arrive are
  ignored."""
  with _open_lock:
    for run in list(_open_runs):
      run.close()


def _at_exit() -> None:
  """Lets the taps of the loops still running reach their bars (hostcb's
  own exit handler runs after this one), then closes what stays open."""
  if not _traced[0]:
    return
  try:
    if not wait_for_taps(timeout=EXIT_TIMEOUT_SECONDS):
      logger.error(
        "hostcb.progress: at exit, taps still pending after %s s",
        EXIT_TIMEOUT_SECONDS,
      )
  except Exception:
    # Logged with its traceback; the bars are closed below all the same.
    logger.exception("hostcb.progress: waiting for taps at exit")
  close_all()


_previous_excepthook: list = []


def _excepthook(kind, value, traceback) -> None:
  """An uncaught exception: the bars of loops that will not end are
  closed first, so that the traceback starts on a line of its own."""
  try:
    close_all()
  finally:
    _previous_excepthook[0](kind, value, traceback)


def _install_hooks() -> None:
  """The exit handler and ``sys.excepthook`` of the bars: installed when
  the first progress loop is traced (importing this module changes no
  hook), recorded in :mod:`hostcb._jax_internals.patches`, undone by
  ``hostcb.uninstall()``."""
  if patches.is_installed("progress: at exit"):
    return
  with patches.lock:
    if patches.is_installed("progress: at exit"):
      return
    atexit.register(_at_exit)
    patches.record(
      "progress: at exit",
      "atexit (hostcb.progress._at_exit)",
      lambda: atexit.unregister(_at_exit),
    )
    if sys.excepthook is sys.__excepthook__:  # not where a tool set one
      _previous_excepthook[:] = [sys.excepthook]
      patches.install("progress: excepthook", sys, "excepthook", _excepthook)


# ---------------------------------------------------- the device's side
def _period(opts: _Options, static_total: int | None) -> Callable:
  """``pred(step, total)``: whether step ``step`` taps (device code)."""
  if opts.every is not None:
    k = opts.every
    return lambda step, total: step % k == 0
  if static_total is not None:
    if static_total < 0:
      return _geometric
    k = max(1, -(-static_total // opts.updates))
    return lambda step, total: step % k == 0

  def pred(step, total):
    k = jnp.maximum(1, (total + opts.updates - 1) // opts.updates)
    return jnp.where(total > 0, step % k == 0, _geometric(step, total))

  return pred


def _geometric(step, total):
  """Without a total: every step up to 32, then about 16 taps for each
  doubling of the step count."""
  del total
  log2 = 31 - lax.clz(jnp.maximum(step, 1))
  k = jnp.maximum(jnp.left_shift(jnp.int32(1), log2) >> 4, 1)
  return (step & (k - 1)) == 0


class _Ticks:
  """The taps of one progress loop: ``start``, ``update``, ``end``, each
  ``(steps, totals, witness)``; under ``vmap`` they tap once for the batch
  (its largest step), or, with ``batch="each"``, the step of every element
  (``witness``: values that are batched exactly when the loop is)."""

  def __init__(self, site: _Site, opts: _Options, static_total):
    each = opts.batch == "each"
    self.start = self._make(site.on_start, None, each)
    self.update = self._make(site.on_update, _period(opts, static_total), each)
    self.end = self._make(site.on_end, None, each)

  @staticmethod
  def _make(func, period, each: bool):

    def emit(steps, totals):
      if period is None:
        id_tap(func, (steps, totals), tap_with_device=True)
        return
      pred = period(jnp.max(steps), jnp.max(totals))
      lax.cond(
        pred,
        lambda: id_tap(func, (steps, totals), tap_with_device=True),
        lambda: (steps, totals),
      )

    @jax.custom_batching.custom_vmap
    def tick(steps, totals, witness):
      del witness
      emit(steps, totals)
      return steps

    @tick.def_vmap
    def _batched(axis_size, in_batched, steps, totals, witness):
      del witness
      steps_batched = in_batched[0]
      if each:  # one entry per element, at the front
        shape = (axis_size,) + np.shape(steps)[steps_batched:]
        s = steps if steps_batched else jnp.broadcast_to(steps, shape)
        t = totals if in_batched[1] else jnp.broadcast_to(totals, shape)
        tick(s, jnp.broadcast_to(t, shape), ())
      else:  # the batch as one loop: its furthest element
        tick(jnp.max(steps), jnp.max(totals), ())
      return steps, steps_batched

    return tick


def _witness(opts: _Options, *trees):
  return jax.tree_util.tree_leaves(trees) if opts.batch == "each" else ()


def _total_operand(total) -> Any:
  if total is None:
    return jnp.int32(_NO_TOTAL)
  return jnp.asarray(total).astype(jnp.int32)


def _prepare(opts: _Options, static_total) -> _Ticks:
  """The taps of a progress loop about to be traced.  Every process
  traces the same program (multi-process SPMD code must be the same
  everywhere): with ``processes="first"`` the others' taps show nothing."""
  _require_supported_jax()
  _traced[0] = True
  _install_hooks()
  silent = opts.processes == "first" and jax.process_index() != 0
  site = _Site(opts, _tapping_devices(), _depth(), silent)
  return _Ticks(site, opts, static_total)


def _static_int(x) -> int | None:
  """``x`` as a Python int if it is known while tracing, else None."""
  try:
    return operator.index(x)
  except Exception:  # noqa: BLE001  (a tracer: the value is known only on
    return None  # the device, which computes the update period itself)


# -------------------------------------------------------------- loops
def scan(
  f: Callable,
  init,
  xs=None,
  length: int | None = None,
  reverse: bool = False,
  unroll: int | bool = 1,
  _split_transpose: bool = False,
  *,
  desc: str | None = None,
  every: int | None = None,
  updates: int = DEFAULT_UPDATES,
  devices: str = "combined",
  batch: str = "combined",
  processes: str = "each",
  tqdm_class=None,
  tqdm_kwargs: dict | None = None,
):
  """``lax.scan`` with a progress bar: same arguments and results.

  Args:
    f, init, xs, length, reverse, unroll, _split_transpose: as
      ``lax.scan``.
    desc: the bar's description.
    every: tap every ``every`` steps (default: from the length, at most
      about ``updates`` taps).
    updates: at most about this many bar updates per run.
    devices: ``"combined"``: under ``pmap``/``shard_map``, one bar that
      shows the slowest device; ``"each"``: one bar per device.
    batch: ``"combined"``: under ``vmap``, one bar for the batch;
      ``"each"``: one bar per batch element.
    processes: ``"each"``: every process shows the bars of its devices;
      ``"first"``: only process 0 shows bars.
    tqdm_class: the bar class (default ``tqdm.auto.tqdm``).
    tqdm_kwargs: more keyword arguments for the bars (``file``, ``unit``,
      ``leave``...).
  """
  opts = _options(
    desc, every, updates, devices, batch, processes, tqdm_class, tqdm_kwargs
  )
  extra = {"_split_transpose": True} if _split_transpose else {}
  total = _scan_length(xs, length)
  if total is None:  # lax.scan says what is wrong
    return lax.scan(f, init, xs, length, reverse, unroll, **extra)
  ticks = _prepare(opts, total)
  totals = jnp.int32(total)
  ticks.start(jnp.int32(0), totals, _witness(opts, init, xs))

  def body(carry, x):
    step, c = carry
    c, y = f(c, x)
    step = step + 1
    ticks.update(step, totals, _witness(opts, c, y))
    return (step, c), y

  with _inside_loop():
    (step, out), ys = lax.scan(
      body, (jnp.int32(0), init), xs, length, reverse, unroll, **extra
    )
  ticks.end(step, totals, _witness(opts, out, ys))
  return out, ys


def _scan_length(xs, length) -> int | None:
  if length is not None:
    return _static_int(length)
  leaves = jax.tree_util.tree_leaves(xs)
  if not leaves or not np.shape(leaves[0]):
    return None
  return int(np.shape(leaves[0])[0])


def fori_loop(
  lower,
  upper,
  body_fun: Callable,
  init_val,
  *,
  unroll: int | bool | None = None,
  desc: str | None = None,
  every: int | None = None,
  updates: int = DEFAULT_UPDATES,
  devices: str = "combined",
  batch: str = "combined",
  processes: str = "each",
  tqdm_class=None,
  tqdm_kwargs: dict | None = None,
):
  """``lax.fori_loop`` with a progress bar: same arguments and results;
  the bar counts ``upper - lower`` steps.  The other keyword arguments are
  those of :func:`scan`."""
  opts = _options(
    desc, every, updates, devices, batch, processes, tqdm_class, tqdm_kwargs
  )
  extra = {} if unroll is None else {"unroll": unroll}
  lo, hi = _static_int(lower), _static_int(upper)
  static_total = None if lo is None or hi is None else max(hi - lo, 0)
  ticks = _prepare(opts, static_total)
  if static_total is not None:
    totals = jnp.int32(static_total)
  else:
    totals = jnp.maximum(jnp.asarray(upper) - jnp.asarray(lower), 0).astype(
      jnp.int32
    )
  ticks.start(jnp.int32(0), totals, _witness(opts, init_val))

  def body(i, val):
    val = body_fun(i, val)
    step = (jnp.asarray(i) - jnp.asarray(lower) + 1).astype(jnp.int32)
    if static_total is None:
      # Batched bounds under vmap: every element runs the body until the
      # last one is done; a finished element's step stays at its total.
      step = jnp.minimum(step, totals)
    ticks.update(step, totals, _witness(opts, val, step))
    return val

  with _inside_loop():
    out = lax.fori_loop(lower, upper, body, init_val, **extra)
  ticks.end(totals, totals, _witness(opts, out))
  return out


def while_loop(
  cond_fun: Callable,
  body_fun: Callable,
  init_val,
  *,
  total=None,
  desc: str | None = None,
  every: int | None = None,
  updates: int = DEFAULT_UPDATES,
  devices: str = "combined",
  batch: str = "combined",
  processes: str = "each",
  tqdm_class=None,
  tqdm_kwargs: dict | None = None,
):
  """``lax.while_loop`` with a progress bar: same arguments and results.

  Args:
    total: the expected number of iterations (an int, or a traced value);
      None: unknown, the bar counts iterations (about 16 updates for each
      doubling of the count) and its total is the final count.  A loop
      that ends before ``total`` leaves its bar at the count it reached.
    The other keyword arguments are those of :func:`scan`.
  """
  opts = _options(
    desc, every, updates, devices, batch, processes, tqdm_class, tqdm_kwargs
  )
  static_total = _NO_TOTAL if total is None else _static_int(total)
  # The predicate travels in the carry: evaluated on the initial value
  # here and at the end of each step, as often and in the same order as
  # lax.while_loop evaluates it.  Under vmap with a batched predicate every
  # element runs the body until the last one is done (lax then keeps the
  # finished elements' values); the predicate in the carry says which
  # elements are still running, so that each element's step stops at its
  # own count (and its bar with batch="each").
  pred = cond_fun(init_val)
  if np.shape(pred) != () or jnp.result_type(pred) != jnp.bool_:
    return lax.while_loop(cond_fun, body_fun, init_val)  # lax's error
  ticks = _prepare(opts, static_total)
  totals = _total_operand(total)
  ticks.start(jnp.int32(0), totals, _witness(opts, init_val, pred))

  def body(carry):
    step, running, val = carry
    val = body_fun(val)
    step = step + running.astype(jnp.int32)
    ticks.update(step, totals, _witness(opts, val, running))
    return step, jnp.asarray(cond_fun(val), jnp.bool_), val

  pred = jnp.asarray(pred, jnp.bool_)
  # The counter starts as varying (shard_map) or batched as the predicate
  # that moves it: a loop's carry keeps its type.
  step0 = pred.astype(jnp.int32) * 0
  with _inside_loop():
    step, _, out = lax.while_loop(lambda c: c[1], body, (step0, pred, init_val))
  ticks.end(step, totals, _witness(opts, out))
  return out
