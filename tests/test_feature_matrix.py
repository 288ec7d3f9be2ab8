"""The feature matrix: every public entry point of hostcb under every option
of ``jax.jit`` that programs use, in both dispatch modes, against the same
program under JAX's own callback and without any callback.

One test, one table.  A row is ``(mode, option, entry point)``:

* ``ENTRIES``: how a program uses an entry point on an array ``x`` (hostcb's
  way and JAX's own way), each returning ``x * 2``;
* ``OPTIONS``: how a program wraps a body ``x -> x * 2`` (``jit`` with
  donation, static arguments, shardings, AOT, a context mesh,
  ``shard_map``, ``pmap``, nested ``jit``...), runs it twice (the second
  call takes jit's cached path, the C++ fast path where the executable
  declares no effect) and waits with the barrier it is given;
* ``MODES``: fast dispatch (the default) and ``hostcb_strict_barrier``.

Each row checks that hostcb's program returns what the program without a
callback returns and what JAX's returns, deletes the donated inputs that
JAX's deletes, prints what JAX's prints and calls the callback as often and
with the same values as JAX's calls its own, and with arguments of the type
JAX's gets (``jax.Array``; NumPy arrays for legacy's ``id_tap`` and
``call``).  A second table, one row per ``(mode, option)``, checks the
exception rule of the drop-ins (docs/jax_callbacks.md, "When a callback
fails"): a ``hostcb.debug.callback`` that raises is logged and fails no
later work, neither the barrier nor the next program.  A new entry point or option
is one more item of ``ENTRIES`` or ``OPTIONS``; a row that fails today is
an item of ``KNOWN_FAILURES`` (strict xfail: the fix must remove it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Any, Callable

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import buffer_callback as _jax_buffer
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb

try:
  from jax import shard_map as _shard_map
except ImportError:  # older JAX
  from jax.experimental.shard_map import shard_map as _shard_map


# ------------------------------------------------------------------ helpers
class Seen:
  """What a callback received, thread-safely (devices run in threads)."""

  def __init__(self):
    self.items: list[np.ndarray] = []
    self.types: set[str] = set()  # the Python types of the arguments
    self._lock = threading.Lock()

  def add(self, a) -> None:
    kind = type(a).__name__
    a = np.array(np.asarray(a))  # a copy: a buffer is valid only now
    with self._lock:
      self.items.append(a)
      self.types.add(kind)

  def twice(self, a):
    """Records ``a`` and returns ``2 * a`` (for callbacks with a result)."""
    self.add(a)
    return np.asarray(a) * 2

  def key(self) -> list:
    """Order-free: callbacks of several devices interleave."""
    return sorted((str(a.dtype), a.shape, a.tolist()) for a in self.items)


def _jax_own(f):
  """JAX's function itself, also while hostcb's is installed in its place
  (``hostcb.install(jax_callbacks=True)`` of another test)."""
  return getattr(f, "_hostcb_replaces", f)


def _sds(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _n() -> int:
  return jax.device_count()


def _mesh() -> Mesh:
  return Mesh(np.array(jax.devices()), ("d",))


def _x():
  """A fresh operand (donation deletes it): 8 floats, whole shards on 2 or
  4 devices."""
  return jnp.arange(8, dtype=jnp.float32)


def _y():
  return jnp.float32(1)


def _np(tree):
  return jax.tree.map(np.asarray, tree)


# ------------------------------------------------------------- entry points
@dataclasses.dataclass(frozen=True)
class Entry:
  """An entry point: ``ours(x, seen)`` uses hostcb's on ``x``, ``theirs(x,
  seen, several_devices)`` JAX's own; both return ``x * 2``."""

  ours: Callable[[Any, Seen], Any]
  theirs: Callable[[Any, Seen, bool], Any]
  # The type of the callback's arguments: JAX's (the drop-ins), "ndarray"
  # (legacy's interface), or None (no array argument to compare).
  arguments: str | None = "jax"


def _buffer_twice(seen):
  def cb(ctx, out, a):
    seen.add(a)
    np.copyto(np.asarray(out), np.asarray(a) * 2)

  return cb


def _jax_io(x, seen, ordered):
  return _jax_own(jax.experimental.io_callback)(
    seen.twice, _sds(x), x, ordered=ordered
  )


ENTRIES: dict[str, Entry] = {
  "id_tap": Entry(
    lambda x, s: hostcb.id_tap(lambda a, t: s.add(a), x) * 2,
    lambda x, s, _: (_jax_own(jax.debug.callback)(s.add, x), x * 2)[1],
    arguments="ndarray",
  ),
  # id_print prints an array as jax.debug.print's "{}" does.
  "id_print": Entry(
    lambda x, s: hostcb.id_print(x) * 2,
    lambda x, s, _: (_jax_own(jax.debug.print)("{}", x), x * 2)[1],
    arguments=None,
  ),
  "call": Entry(
    lambda x, s: hostcb.call(s.twice, x, result_shape=_sds(x)),
    lambda x, s, _: _jax_io(x, s, False),
    arguments="ndarray",
  ),
  "debug.print": Entry(
    lambda x, s: (hostcb.debug.print("x={x}", x=x), x * 2)[1],
    lambda x, s, _: (_jax_own(jax.debug.print)("x={x}", x=x), x * 2)[1],
    arguments=None,
  ),
  "debug.callback": Entry(
    lambda x, s: (hostcb.debug.callback(s.add, x), x * 2)[1],
    lambda x, s, _: (_jax_own(jax.debug.callback)(s.add, x), x * 2)[1],
  ),
  "io_callback": Entry(
    lambda x, s: hostcb.io_callback(s.twice, _sds(x), x),
    lambda x, s, _: _jax_io(x, s, False),
  ),
  # JAX refuses ordered effects on several devices, where hostcb keeps
  # each device's callbacks in order (docs/jax_callbacks.md): there the
  # reference is JAX's unordered io_callback.
  "io_callback(ordered)": Entry(
    lambda x, s: hostcb.io_callback(s.twice, _sds(x), x, ordered=True),
    lambda x, s, several: _jax_io(x, s, not several),
  ),
  "pure_callback": Entry(
    lambda x, s: hostcb.pure_callback(s.twice, _sds(x), x),
    lambda x, s, _: _jax_own(jax.pure_callback)(s.twice, _sds(x), x),
  ),
  "buffer_callback": Entry(
    lambda x, s: hostcb.buffer_callback(_buffer_twice(s), _sds(x))(x),
    lambda x, s, _: _jax_buffer.buffer_callback(_buffer_twice(s), _sds(x))(x),
    arguments=None,
  ),
}


# ------------------------------------------------------------------ options
@dataclasses.dataclass(frozen=True)
class Option:
  """How a program uses a body ``x -> 2 * x``: ``run(body, barrier)`` runs
  it twice with fresh operands, calls ``barrier()`` where the program would
  (inside its context), and returns per call what can be compared: the
  results and whether each donated operand was deleted."""

  run: Callable[[Callable, Callable[[], None]], list]
  several_devices: bool = False
  donates: bool = False  # every operand in the donated arguments is deleted
  skip: str | None = None  # why this JAX cannot run the option


def _twice(f, args=lambda: (_x(), _y()), donated=lambda args: ()):
  got = []
  for _ in range(2):
    a = args()
    out = f(*a)
    # Every device's part of the result, not only the replica that
    # np.asarray reads: a call without a side effect (buffer_callback's
    # default) runs in each device's computation, which no barrier waits
    # for (`seen` missed one device's call once in CI).
    jax.block_until_ready(out)
    got.append(
      (_np(out), [leaf.is_deleted() for leaf in jax.tree.leaves(donated(a))])
    )
  return got


def _then(barrier, got):
  barrier()
  return got


def _jit(**kw):
  def run(body, barrier):
    return _then(barrier, _twice(jax.jit(lambda x, y: body(x) + y, **kw)))

  return run


def _donated_x(**kw):
  def run(body, barrier):
    f = jax.jit(lambda x, y: body(x) + y, **kw)
    return _then(barrier, _twice(f, donated=lambda a: a[0]))

  return run


def _donated_state(body, barrier):
  """A training step's pattern: a pytree state donated and returned."""

  def step(state, y):
    return {"w": body(state["w"]) + y, "n": state["n"] + 1}

  f = jax.jit(step, donate_argnums=0)
  got, state = [], {"w": _x(), "n": jnp.int32(0)}
  for _ in range(2):
    new = f(state, _y())
    # A copy to read: a NumPy view of ``new`` would keep JAX from donating
    # it in the next step.
    got.append(
      (
        _np(jax.tree.map(jnp.copy, new)),
        [leaf.is_deleted() for leaf in jax.tree.leaves(state)],
      )
    )
    state = new
  return _then(barrier, got)


def _keep_unused(body, barrier):
  f = jax.jit(lambda x, y, unused: body(x) + y, keep_unused=True)
  return _then(barrier, _twice(f, lambda: (_x(), _y(), jnp.ones(3))))


def _static_argnums(body, barrier):
  f = jax.jit(lambda x, k: body(x) * k, static_argnums=1)
  return _then(barrier, _twice(f, lambda: (_x(), 3)))


def _static_argnames(body, barrier):
  f = jax.jit(lambda x, k: body(x) * k, static_argnames="k")
  return _then(barrier, _twice(lambda x, k: f(x, k=k), lambda: (_x(), 3)))


def _shardings():
  mesh = _mesh()
  return NamedSharding(mesh, P("d")), NamedSharding(mesh, P())


def _sharded_jit(body):
  split, whole = _shardings()
  return jax.jit(
    lambda x, y: body(x) + y, in_shardings=(split, whole), out_shardings=split
  )


def _in_out_shardings(body, barrier):
  return _then(barrier, _twice(_sharded_jit(body)))


def _aot(body, barrier):
  f = jax.jit(lambda x, y: body(x) + y).lower(_x(), _y()).compile()
  return _then(barrier, _twice(f))


def _in_context(context):
  """The sharded jit defined, called and waited for in a context mesh, as
  a program written for ``jax.set_mesh`` does."""

  def run(body, barrier):
    split, whole = _shardings()
    with context(_mesh()):
      return _then(
        barrier,
        _twice(
          _sharded_jit(body),
          lambda: (jax.device_put(_x(), split), jax.device_put(_y(), whole)),
        ),
      )

  return run


def _plain_jit_in_context(body, barrier):
  """A jit without shardings of its own, in a context mesh."""
  with jax.set_mesh(_mesh()):
    return _then(barrier, _twice(jax.jit(lambda x, y: body(x) + y)))


def _shard_map_jit(body, barrier):
  f = _shard_map(
    lambda x, y: body(x) + y,
    mesh=_mesh(),
    in_specs=(P("d"), P()),
    out_specs=P("d"),
  )
  return _then(barrier, _twice(jax.jit(f)))


def _pmap(body, barrier):
  f = jax.pmap(lambda x, y: body(x) + y, in_axes=(0, None))
  return _then(barrier, _twice(f, lambda: (_x().reshape(_n(), -1), _y())))


def _nested_jit(body, barrier):
  return _then(barrier, _twice(jax.jit(jax.jit(lambda x, y: body(x) + y))))


_use_mesh = getattr(jax.sharding, "use_mesh", None)

OPTIONS: dict[str, Option] = {
  "jit": Option(_jit()),
  "donate_argnums": Option(_donated_x(donate_argnums=0), donates=True),
  "donate_argnames": Option(_donated_x(donate_argnames="x"), donates=True),
  "donate_pytree": Option(_donated_state, donates=True),
  "keep_unused": Option(_keep_unused),
  "static_argnums": Option(_static_argnums),
  "static_argnames": Option(_static_argnames),
  "aot": Option(_aot),
  "nested_jit": Option(_nested_jit),
  "in_out_shardings": Option(_in_out_shardings, several_devices=True),
  "set_mesh": Option(_in_context(jax.set_mesh), several_devices=True),
  "set_mesh_plain_jit": Option(_plain_jit_in_context, several_devices=True),
  "use_mesh": Option(
    _in_context(_use_mesh) if _use_mesh else None,
    several_devices=True,
    skip=None
    if _use_mesh
    else f"jax.sharding.use_mesh is not in jax {jax.__version__}",
  ),
  "shard_map": Option(_shard_map_jit, several_devices=True),
  "pmap": Option(_pmap, several_devices=True),
}

MODES = {"default": False, "strict": True}  # hostcb_strict_barrier

# (entry points, options, modes) that fail today, None for all, with why.
_TAPS = (
  "id_tap",
  "id_print",
  "call",
  "debug.print",
  "debug.callback",
  "io_callback",
  "io_callback(ordered)",
)  # hostcb's ordered effect
KNOWN_FAILURES: list[tuple[Any, Any, Any, str]] = [
  # (entries, options, modes, reason): None matches every one.  Empty:
  # every row passes.
]


def _known_failure(mode: str, option: str, entry: str) -> str | None:
  for entries, options, modes, reason in KNOWN_FAILURES:
    if (
      (entries is None or entry in entries)
      and (options is None or option in options)
      and (modes is None or mode in modes)
    ):
      return reason
  return None


def _rows():
  for mode in MODES:
    for option_name, option in OPTIONS.items():
      for entry in ENTRIES:
        marks = []
        if option.several_devices:
          marks.append(pytest.mark.multidevice)
        if option.skip:
          marks.append(pytest.mark.skip(reason=option.skip))
        reason = _known_failure(mode, option_name, entry)
        if reason:
          marks.append(pytest.mark.xfail(strict=True, reason=reason))
        yield pytest.param(
          mode,
          option_name,
          entry,
          marks=marks,
          id=f"{mode}-{option_name}-{entry}",
        )


# ------------------------------------------------------------------ the test
@dataclasses.dataclass
class Observed:
  got: list  # per call: (results, [donated operand deleted])
  printed: list  # printed lines, sorted (devices print side by side)
  seen: list  # what the callback received, sorted
  types: set  # the Python types of the callback's arguments

  @property
  def results(self):
    return [r for r, _ in self.got]

  @property
  def deleted(self):
    return [d for _, d in self.got]


def _observe(capsys, option: Option, body, barrier) -> Observed:
  seen = Seen()
  capsys.readouterr()
  try:
    got = option.run(lambda x: body(x, seen), barrier)
  except BaseException:
    # What the failed run left pending is printed here, not in the next
    # test; the run's own error is the one to report.
    with contextlib.suppress(Exception):
      hostcb.barrier_wait()
    raise
  printed = capsys.readouterr().out.splitlines()
  return Observed(got, sorted(printed), seen.key(), seen.types)


def _assert_same_results(a: list, b: list, what: str) -> None:
  assert len(a) == len(b), what
  for ra, rb in zip(a, b):
    assert jax.tree.structure(ra) == jax.tree.structure(rb), what
    for la, lb in zip(jax.tree.leaves(ra), jax.tree.leaves(rb)):
      assert la.dtype == lb.dtype, what
      np.testing.assert_array_equal(la, lb, err_msg=what)


@pytest.fixture(scope="module", autouse=True)
def _fast_dispatch_used():
  """Every row runs in a process that has used fast dispatch, as every
  program in the default mode has once it tapped on one device (from then
  on the barrier also drains the calling thread's one-device computations):
  the rows do not depend on which rows ran before them."""
  before = hostcb.config.read("hostcb_strict_barrier")
  hostcb.config.update("hostcb_strict_barrier", False)
  try:
    jax.jit(lambda x: hostcb.id_tap(lambda a, t: None, x))(_x())
    hostcb.barrier_wait()
  finally:
    hostcb.config.update("hostcb_strict_barrier", before)
  yield


@pytest.fixture(scope="module")
def mode_switch():
  """Sets ``hostcb_strict_barrier`` for a row; the mode of before is put
  back after the last row (rows come mode by mode: each change of mode
  clears JAX's caches)."""
  before = hostcb.config.read("hostcb_strict_barrier")

  def switch(strict: bool) -> None:
    hostcb.barrier_wait()
    hostcb.config.update("hostcb_strict_barrier", strict)

  yield switch
  try:
    hostcb.barrier_wait()
  finally:
    hostcb.config.update("hostcb_strict_barrier", before)


# JAX's run and the run without a callback do not depend on hostcb's mode:
# each is made once per process.
_theirs: dict[tuple[str, str], Observed] = {}
_plain: dict[str, Observed] = {}


def _jax_barrier():
  _jax_own(jax.effects_barrier)()


@pytest.mark.parametrize("mode, option_name, entry_name", list(_rows()))
def test_matrix(capsys, mode_switch, mode, option_name, entry_name):
  """hostcb's entry point under the option behaves as JAX's own callback
  under it, and the values are those of the program without a callback."""
  option, entry = OPTIONS[option_name], ENTRIES[entry_name]
  if option.several_devices and _n() < 2:
    pytest.skip("needs at least 2 CPU devices (HOSTCB_TEST_DEVICES>=2)")
  if option_name not in _plain:
    _plain[option_name] = _observe(
      capsys, option, lambda x, s: x * 2, _jax_barrier
    )
  key = (option_name, entry_name)
  if key not in _theirs:
    _theirs[key] = _observe(
      capsys,
      option,
      lambda x, s: entry.theirs(x, s, option.several_devices),
      _jax_barrier,
    )
  plain, theirs = _plain[option_name], _theirs[key]
  assert theirs.printed or theirs.seen  # the reference did call back
  _assert_same_results(theirs.results, plain.results, "JAX's vs none")
  if option.donates:  # JAX does donate on CPU
    assert all(d and all(d) for d in plain.deleted), plain.deleted

  mode_switch(MODES[mode])
  ours = _observe(capsys, option, entry.ours, hostcb.barrier_wait)
  _assert_same_results(ours.results, plain.results, "hostcb's vs none")
  assert ours.deleted == theirs.deleted == plain.deleted
  assert ours.printed == theirs.printed
  assert ours.seen == theirs.seen
  if entry.arguments == "jax":
    assert theirs.types == {"ArrayImpl"}, theirs.types
    assert ours.types == theirs.types
  elif entry.arguments is not None:
    assert ours.types == {entry.arguments}


# ------------------------------------------------- the exception rule
def _raises(a):
  raise ValueError("this callback fails")


def _failure_rows():
  for mode in MODES:
    for option_name, option in OPTIONS.items():
      marks = []
      if option.several_devices:
        marks.append(pytest.mark.multidevice)
      if option.skip:
        marks.append(pytest.mark.skip(reason=option.skip))
      yield pytest.param(
        mode, option_name, marks=marks, id=f"{mode}-{option_name}"
      )


@pytest.mark.parametrize("mode, option_name", list(_failure_rows()))
def test_a_failed_debug_callback_fails_no_later_work(
  capsys, caplog, mode_switch, mode, option_name
):
  """Under the option, a ``hostcb.debug.callback`` that raises is logged
  where JAX logs it, its program raises JAX's ``JaxRuntimeError`` (at a
  read of its results, or at the barrier after it), a barrier after that
  returns, and the next program's callbacks are JAX's calls."""
  option = OPTIONS[option_name]
  if option.several_devices and _n() < 2:
    pytest.skip("needs at least 2 CPU devices (HOSTCB_TEST_DEVICES>=2)")
  entry = ENTRIES["debug.callback"]
  if option_name not in _plain:
    _plain[option_name] = _observe(
      capsys, option, lambda x, s: x * 2, _jax_barrier
    )
  key = (option_name, "debug.callback")
  if key not in _theirs:
    _theirs[key] = _observe(
      capsys,
      option,
      lambda x, s: entry.theirs(x, s, option.several_devices),
      _jax_barrier,
    )
  mode_switch(MODES[mode])
  caplog.set_level(logging.ERROR, logger="jax._src.debugging")
  with pytest.raises(jax.errors.JaxRuntimeError, match="this callback fails"):
    _observe(
      capsys,
      option,
      lambda x, s: (hostcb.debug.callback(_raises, x), x * 2)[1],
      hostcb.barrier_wait,
    )
  jax.effects_barrier()
  logged = [r for r in caplog.records if r.name == "jax._src.debugging"]
  assert logged and all(
    r.getMessage() == "jax.debug.callback failed"
    and str(r.exc_info[1]) == "this callback fails"
    for r in logged
  )
  later = _observe(capsys, option, entry.ours, hostcb.barrier_wait)
  _assert_same_results(
    later.results, _plain[option_name].results, "the next program's vs none"
  )
  assert later.seen == _theirs[key].seen
