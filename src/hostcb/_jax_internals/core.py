"""Effects, primitives and their rule registries, and the jax.config knobs.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.8.0, 0.10.2 and 0.12.0.1.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe

from hostcb._jax_internals import patches
from hostcb._jax_internals.versions import check_shape, require

ShapedArray = _core.ShapedArray
Primitive = _core.Primitive
no_effects = _core.no_effects
not_mapped = None  # how batching rules mark an unbatched operand


# ----------------------------------------------------------------- effects
class HostCallbackEffect(_effects.Effect):
  """The effect of a tap or an impure call: the host sees it happen.

  It is ordered in JAX's sense: a token threads through the callbacks of a
  computation (and from one dispatched computation to the next), because
  XLA may otherwise run independent side-effecting custom calls in any
  order.  It is also "shardable", so that multi-device computations accept
  it; within one device the host still sees its callbacks in program order.
  """

  def __str__(self) -> str:
    return "HostCallback"

  # jax.export serializes an effect that a program keeps in its signature
  # (a tap in shard_map code, for one) by its class's text, and makes it
  # again with the class's nullary constructor, which must give an equal
  # effect (checked with jax 0.8.0, 0.10.2 and 0.12.0.1): every instance
  # is the same effect.
  def __eq__(self, other) -> bool:
    return type(other) is HostCallbackEffect

  def __hash__(self) -> int:
    return hash(HostCallbackEffect.__qualname__)

  # Pickled (jax.experimental.serialize_executable of a program that keeps
  # the effect) as a call of a function of this module, not by the class's
  # name, which says "hostcb" for export's sake (below).
  def __reduce__(self):
    return (the_host_callback_effect, ())


# An exported program names the effect by str(HostCallbackEffect): a text
# that must not change when this module moves (docs/export.md).
HostCallbackEffect.__module__ = "hostcb"

host_callback_effect = HostCallbackEffect()


def the_host_callback_effect() -> HostCallbackEffect:
  """The effect (what an unpickled one is)."""
  return host_callback_effect


def _chain_tokens_between_computations() -> None:
  """Orders the computations that tap, and lets a barrier see all of them.

  JAX passes an ordered effect's token from each dispatched computation to
  the next one of the same thread, so that a device runs them, and their
  taps reach the host, in dispatch order: the CPU otherwise runs
  independent computations side by side.  hostcb keeps that chain with two
  changes:

  * When the previous computation already finished (its token is ready),
    the next one starts from a fresh ready token of its devices, made once
    per device tuple, instead of the previous one: there is nothing left to
    wait for, no copy to make, and an error of a finished computation (a
    ``call`` whose callback raised) does not fail the next one.
  * Every thread's latest token is also kept in :data:`_latest_tokens`, so
    that ``barrier_wait`` in any thread waits for the computations that any
    thread dispatched (a thread may have exited since).
  """
  what = "to order tapping computations and let barrier_wait see every thread's"
  cls = require(_dispatch, "RuntimeTokenSet", what)
  original_get = require(cls, "get_token_input", what)
  original_set = require(cls, "set_token_result", what)
  if patches.is_installed("token chain"):
    return
  fresh_tokens: dict = {}
  symbol = "jax._src.dispatch.RuntimeTokenSet"

  def get_token_input(self, eff, devices):
    if not isinstance(eff, HostCallbackEffect):
      return original_get(self, eff, devices)
    if _dispatch_hook:
      _dispatch_hook[0]()
    key = tuple(devices)
    current = _current_tokens(self)
    token = current.get(eff)
    if token is not None and not _token_buffer(token).is_ready():
      if getattr(self, "_hostcb_devices", None) == key:
        return token  # still running on the same devices: chain to it
      return original_get(self, eff, devices)  # a copy that waits for it
    token = fresh_tokens.get(key)
    if token is None:
      current.pop(eff, None)
      token = fresh_tokens[key] = original_get(self, eff, devices)
    current[eff] = token
    return token

  def set_token_result(self, eff, token):
    original_set(self, eff, token)
    if isinstance(eff, HostCallbackEffect):
      sharding = check_shape(
        _token_buffer(token).sharding,
        "the sharding of jax._src.core.Token._buf",
        what,
        fields=("_device_assignment",),
      )
      devices = tuple(sharding._device_assignment)
      self._hostcb_devices = devices
      _latest_tokens[threading.get_ident()] = token
      if len(devices) > 1 and _after_multi_device_dispatch:
        _after_multi_device_dispatch[0](token)

  def _current_tokens(tokens) -> dict:
    return check_shape(
      getattr(tokens, "current_tokens", None),
      f"{symbol}.current_tokens",
      what,
      types=dict,
    )

  patches.install("token chain", cls, "get_token_input", get_token_input)
  patches.install(
    "token chain (results)", cls, "set_token_result", set_token_result
  )


def _token_buffer(token: Any) -> Any:
  """The array behind one of JAX's tokens (``jax._src.core.Token._buf``),
  checked for what hostcb reads of it."""
  return check_shape(
    getattr(token, "_buf", None),
    "jax._src.core.Token._buf",
    "to tell whether a tapping computation finished",
    fields=("is_ready", "sharding", "block_until_ready"),
  )


# [started]: called by the dispatching thread just before every dispatched
# computation that taps or calls executes (set_dispatch_hook).
_dispatch_hook: list = []
# [dispatched(token)]: called by the dispatching thread once a computation
# over several devices that taps or calls is dispatched, with its token
# (set by hostcb._jax_internals.dispatch, for fast dispatch).
_after_multi_device_dispatch: list = []


def set_dispatch_hook(started: Callable[[], None]) -> None:
  """A function called by the thread that dispatches a computation with
  hostcb's effect (one that taps or calls), just before it executes."""
  _dispatch_hook[:] = [started]


# thread id -> the token of the last tapping computation it dispatched.
# (Never rebound: the waits of output ordering look in it,
# :func:`.printing_computations.this_threads_notes`.)
_latest_tokens: dict[int, Any] = {}


patches.when_first_needed(_chain_tokens_between_computations)


def wait_for_dispatched_computations() -> None:
  """Waits until every tapping computation dispatched so far, by any
  thread, has finished.

  A computation that failed already reported its error to its caller; its
  error does not make this wait fail.
  """
  for ident, token in list(_latest_tokens.items()):
    try:
      token.block_until_ready()
    except Exception:  # noqa: BLE001  (its caller got the error already)
      pass
    if _latest_tokens.get(ident) is token:
      _latest_tokens.pop(ident, None)


def forget_dispatched_computations() -> None:
  """In a forked child: the parent's computations are not ours to wait for
  (their print outputs: :func:`.printing_computations.forget_print_outputs`)."""
  _latest_tokens.clear()


for _effect_set in (
  _effects.ordered_effects,
  _effects.shardable_ordered_effects,
  _effects.lowerable_effects,
  _effects.control_flow_allowed_effects,
  _effects.remat_allowed_effects,
  _effects.custom_derivatives_allowed_effects,
  _effects.partial_eval_kept_effects,
):
  _effect_set.add_type(HostCallbackEffect)


# -------------------------------------------------------------- primitives
class _HostcbPrimitive(_core.Primitive):
  """A primitive of hostcb's: its first bind in the process (and the first
  after ``hostcb.uninstall()``) installs what programs that use it need
  (:func:`.patches.ensure`); until then hostcb has changed nothing."""

  def bind(self, *args, **params):
    patches.ensure()
    return super().bind(*args, **params)


_DEVICES_SET = "prim_requires_devices_during_lowering"
_DEVICES_WHAT = "to tell jit which primitives lower with their devices"


def lowered_with_devices() -> set:
  """JAX's set of the primitives whose lowering is given the devices
  (``jax._src.dispatch.prim_requires_devices_during_lowering``, a set on
  jax 0.8.0, 0.10.2 and 0.12.0.1)."""
  return check_shape(
    require(_dispatch, _DEVICES_SET, _DEVICES_WHAT, verb="uses"),
    f"jax._src.dispatch.{_DEVICES_SET}",
    _DEVICES_WHAT,
    types=set,
  )


def new_primitive(name: str) -> Primitive:
  """A multiple-results primitive whose lowering may ask for the devices;
  binding it installs hostcb's patches (:class:`_HostcbPrimitive`)."""
  prim = _HostcbPrimitive(name)
  prim.multiple_results = True
  # Makes jit pass the device assignment to the lowering, even for a single
  # device, so the host side knows which device a callback comes from.
  lowered_with_devices().add(prim)
  prim.def_impl(functools.partial(_dispatch.apply_primitive, prim))
  return prim


def apply_compiled(prim: Primitive, *args, **params):
  """Runs ``prim`` eagerly as a compiled computation (cached per params)."""
  return _dispatch.apply_primitive(prim, *args, **params)


def register_jvp(prim: Primitive, rule: Callable) -> None:
  _ad.primitive_jvps[prim] = rule


def register_transpose(prim: Primitive, rule: Callable) -> None:
  _ad.primitive_transposes[prim] = rule


def register_batching(prim: Primitive, rule: Callable) -> None:
  _batching.primitive_batchers[prim] = rule


def rematerialize_on_backward_pass(prim: Primitive) -> None:
  """Under ``checkpoint``, also run ``prim`` again when residuals are rebuilt.

  ``prim`` is an identity with a side effect (its results are its operands).
  Without this rule partial evaluation keeps an effectful equation only in
  the forward pass; legacy taps ran again during rematerialization.  With
  known operands the equation runs in the forward pass and, when the policy
  does not save its results, once more in the backward pass, where nothing
  reads the copy's results.
  """

  def rule(saveable, unks_in, inst_in, eqn):
    n_out = len(eqn.outvars)
    residuals = _known_residuals(eqn, inst_in)
    if any(unks_in):
      return None, eqn, [True] * n_out, [True] * n_out, residuals
    if saveable(prim, *[v.aval for v in eqn.invars], **eqn.params):
      return eqn, None, [False] * n_out, [False] * n_out, []
    again = eqn.replace(outvars=[_core.DropVar(v.aval) for v in eqn.outvars])
    return eqn, again, [False] * n_out, [False] * n_out, residuals

  _pe.partial_eval_jaxpr_custom_rules[prim] = rule


def _known_residuals(eqn: Any, inst_in: Any) -> list:
  """The known operands of ``eqn`` that the backward pass does not rebuild
  by itself (a checkpoint rule's residuals)."""
  return [
    v
    for v, inst in zip(eqn.invars, inst_in)
    if not inst and isinstance(v, _core.Var)
  ]


_ORDERS_ONLY_WHAT = (
  "to let unused pure calls go and rebuild them under checkpoint"
)


def _recomputes(policy: Any) -> bool:
  """Whether a ``checkpoint`` policy's answer says to recompute (False, or
  JAX's ``Recompute``), not to save or offload."""
  recompute = getattr(_pe, "RecomputeType", None)
  return policy is False or (
    recompute is not None and isinstance(policy, recompute)
  )


def effect_orders_only(prim: Primitive, orders_only: Callable) -> None:
  """Gives the equations of ``prim`` whose effect only orders them
  (``orders_only(params)``: a pure call, which carries hostcb's effect so
  that its token keeps it in program order with the taps) JAX's rules of
  an equation without effects: dead-code elimination drops it when nothing
  uses its results, and under ``checkpoint`` it runs again on the backward
  pass unless the policy saves its results.  Every other equation of
  ``prim`` keeps JAX's rules of an effectful one (never dropped, run once).
  """
  dce_rules = check_shape(
    require(_pe, "dce_rules", _ORDERS_ONLY_WHAT),
    "jax._src.interpreters.partial_eval.dce_rules",
    _ORDERS_ONLY_WHAT,
    types=dict,
  )

  def dce(used_outs, *rest):
    eqn = rest[-1]  # (jax 0.12 passes the operands' liveness before it)
    if not any(used_outs) and orders_only(eqn.params):
      return [False] * len(eqn.invars), None
    return [True] * len(eqn.invars), eqn

  def remat(saveable, unks_in, inst_in, eqn):
    n_out = len(eqn.outvars)
    residuals = _known_residuals(eqn, inst_in)
    if any(unks_in):
      return None, eqn, [True] * n_out, [True] * n_out, residuals
    if orders_only(eqn.params) and _recomputes(
      saveable(prim, *[v.aval for v in eqn.invars], **eqn.params)
    ):
      return eqn, eqn, [False] * n_out, [True] * n_out, residuals
    return eqn, None, [False] * n_out, [False] * n_out, []

  dce_rules[prim] = dce
  _pe.partial_eval_jaxpr_custom_rules[prim] = remat


def is_undefined_primal(x: Any) -> bool:
  """Whether ``x`` is a linear input of a transpose rule (no value)."""
  return _ad.is_undefined_primal(x)


def is_symbolic_zero(x: Any) -> bool:
  """Whether a cotangent is JAX's symbolic zero (nothing flowed back)."""
  return type(x) is _ad.Zero


def instantiate_zeros(x: Any) -> Any:
  return _ad.instantiate_zeros(x)


def register_lowering(prim: Primitive, rule: Callable) -> None:
  """Registers the lowering of one of hostcb's primitives; lowering it
  installs hostcb's patches if they are not in place (a program traced
  before ``hostcb.uninstall()`` and lowered after it)."""

  @functools.wraps(rule)
  def lowering(*args, **kwargs):
    patches.ensure()
    return rule(*args, **kwargs)

  _mlir.register_lowering(prim, lowering)


# ----------------------------------------------------------- jax.config
_CONFIG_HELP = "hostcb: see hostcb.config"


def register_config_options(
  on_update: Callable[[str, Any], None], inline: bool, max_queue_bytes: int
) -> None:
  """Makes ``jax.config.update('jax_host_callback_...', v)`` work again.

  An option that hostcb defined already (hostcb imported again, e.g. after
  a reload) is kept; one that JAX itself defines, or a JAX whose option
  constructors changed, stops hostcb here: ``jax.config.update`` would
  otherwise silently stop reaching hostcb's options.
  """
  config = _config.config
  holders = require(
    config,
    "_value_holders",
    "to tell whether its jax.config options are defined",
    verb="uses",
  )
  meta = require(
    config, "meta", "to tell which jax.config options are its own", verb="uses"
  )
  for name, make, default in (
    ("jax_host_callback_inline", _config.bool_state, inline),
    (
      "jax_host_callback_max_queue_byte_size",
      _config.int_state,
      max_queue_bytes,
    ),
  ):
    if name in holders:
      kwargs = meta.get(name, (None, None, {}))[2]
      if kwargs.get("help") == _CONFIG_HELP:
        continue
      import jax  # noqa: PLC0415  (public API, for its version)

      raise RuntimeError(
        f"hostcb: jax {jax.__version__} defines the option {name} itself; "
        "hostcb cannot make jax.config.update reach its own option of "
        "that name. Install a jax in the range that hostcb supports."
      )
    make(
      name=name,
      default=default,
      help=_CONFIG_HELP,
      update_global_hook=functools.partial(on_update, name),
    )


def is_tracer(x: Any) -> bool:
  return isinstance(x, _core.Tracer)


def wait_at_process_barrier(barrier_id: str, timeout_ms: int) -> bool:
  """Waits in JAX's distributed runtime until every process reaches
  ``barrier_id`` (each id may be used once).

  Returns False at once, without waiting, if ``jax.distributed`` is not
  initialized in this process.  Raises ``jax.errors.JaxRuntimeError``
  (``DEADLINE_EXCEEDED: ...``) if some process is not there within
  ``timeout_ms``.
  """
  from jax._src import distributed as _distributed  # noqa: PLC0415  (rare)

  client = _distributed.global_state.client
  if client is None:
    return False
  client.wait_at_barrier(barrier_id, int(timeout_ms))
  return True
