"""Scenarios: whole programs, written as users wrote them with host_callback.

Where the other modules test one feature at a time, each program here
combines several, the way training scripts and notebooks did: loops over
steps (``fori_loop``, ``scan``, ``while_loop``) that print their loss and tap
a pytree of metrics with the device, under ``jit(grad(...))``, ``remat`` and
``vmap`` over a batch of models; ``id_print``'s options on many dtypes and on
pytrees with ``None`` leaves; ``call`` with pytrees of result shapes;
``barrier_wait`` between runs and after failing taps; custom derivative
rules; ``cond`` under ``vmap``; ``pmap`` over the 2 devices.

Values are dyadic (integers, halves, quarters, eighths) so that both JAX
versions compute them exactly.
"""

import collections
import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import host_callback as hcb

from registry import scenario

F32 = np.float32
# A tiny regression problem whose gradient steps stay dyadic.
XS = np.array([[1, 0], [0, 1], [1, 1], [2, 0]], dtype=F32)
YS = np.array([1, 2, 3, 2], dtype=F32)
W0 = np.zeros(2, dtype=F32)


def _loss(w, x, y):
  err = x @ w - y
  return jnp.sum(err * err) / 4


# hostcb records a failing call's error for the next barrier_wait too
# (a documented difference: legacy 0.4.30 on CPU only raised in the caller);
# scenarios about the caller's error drain it here.


def _failing_call(ctx, f, *args):
  """Runs ``f(*args)``, logs what it raised, then waits for the callbacks
  and drops what the barrier raises (see above)."""
  try:
    return f(*args)
  except Exception as e:  # noqa: BLE001  (recorded)
    ctx.log("raised", type(e).__name__ + ":", e)
  try:
    hcb.barrier_wait()
  except hcb.CallbackException:  # the caller's error again: see above
    pass
  return None


# ---------------------------------------------------------------- training


@scenario
def prog_train_fori_print_loss(ctx):
  """A jitted fori_loop of gradient steps printing ``(step, loss)``."""

  @jax.jit
  def train(w):
    def step(i, w):
      loss, g = jax.value_and_grad(_loss)(w, XS, YS)
      loss = hcb.id_print((i, loss), what="loss")[1]
      return w - 0.125 * g + 0 * loss

    return jax.lax.fori_loop(0, 3, step, w)

  return train(W0)


@scenario
def prog_train_scan_metrics_with_device(ctx):
  """A scan over steps tapping a dict of metrics with its device."""

  def step(w, i):
    loss, g = jax.value_and_grad(_loss)(w, XS, YS)
    metrics = {"step": i, "loss": loss, "gsq": jnp.sum(g * g)}
    metrics = hcb.id_tap(ctx.tap, metrics, tap_with_device=True)
    return w - 0.125 * g, metrics["loss"]

  return jax.jit(lambda w: jax.lax.scan(step, w, jnp.arange(3)))(W0)


@scenario
def prog_jit_grad_of_scan_print(ctx):
  """``jit(grad(f))`` where ``f`` scans and prints its carry."""

  def f(w):
    def body(c, x):
      c = hcb.id_print(c * x, what="carry")
      return c, c

    c, _ = jax.lax.scan(body, w, jnp.array([2.0, 0.5, 4.0], F32))
    return c

  return jax.jit(jax.grad(f))(F32(1.5))


@scenario
def prog_jit_grad_of_scan_tap_pair(ctx):
  """``jit(grad)`` of a scan that taps a ``(step, value)`` tuple."""

  def f(w):
    def body(c, i):
      i, c = hcb.id_tap(ctx.tap, (i, c * 2))
      return c, None

    c, _ = jax.lax.scan(body, w, jnp.arange(2))
    return c

  return jax.jit(jax.grad(f))(F32(0.5))


@scenario
def prog_remat_step_in_loop_grad(ctx):
  """A remat'd step with a tap, called twice, under ``jit(grad)``."""

  @jax.checkpoint
  def step(w):
    w = hcb.id_tap(ctx.tapper("step"), w)
    return w * w

  return jax.jit(jax.grad(lambda w: step(step(w))))(F32(1.5))


@scenario(
  ours=(
    "docs/guide.md: a tap runs even when its result is unused; legacy's "
    "outside_call had no JAX effect, so the partial evaluation of the "
    "remat'd scan body dropped the forward pass's unused print, and only "
    "the rematerialized (backward) pass printed"
  ),
  expect=(
    "what: body\n0.25\nwhat: body\n0.5\n"
    "what: body\n0.5\nwhat: body\n0.25\n"
    "result: jax.Array(float32, (), weak=False, 8.0)\n"
  ),
)
def prog_remat_scan_body_print(ctx):
  """A scan whose body is remat'd and prints, under grad."""

  def f(w):
    @jax.checkpoint
    def body(c, x):
      hcb.id_print(c, what="body")
      return c * x, None

    return jax.lax.scan(body, w, jnp.array([2.0, 4.0], F32))[0]

  return jax.grad(f)(F32(0.25))


@scenario
def prog_vmap_models_scan(ctx):
  """vmap over 3 models, each training by scan and tapping
  ``(loss, step)`` with its device."""

  def train(w):
    def step(w, i):
      loss, g = jax.value_and_grad(_loss)(w, XS, YS)
      hcb.id_tap(ctx.tap, (loss, i), tap_with_device=True)
      return w - 0.125 * g, loss

    return jax.lax.scan(step, w, jnp.arange(2))

  ws = np.array([[0, 0], [1, 1], [2, 0]], dtype=F32)
  return jax.jit(jax.vmap(train))(ws)


@scenario
def prog_vmap_models_print_unbatched_step(ctx):
  """vmap over models printing a dict with a batched loss and an
  unbatched step counter."""

  def train(w):
    def step(i, w):
      loss, g = jax.value_and_grad(_loss)(w, XS, YS)
      hcb.id_print({"i": i, "loss": loss}, what="m")
      return w - 0.125 * g

    return jax.lax.fori_loop(0, 2, step, w)

  ws = np.array([[0, 0], [1, 1]], dtype=F32)
  return jax.vmap(train)(ws)


@scenario
def prog_while_early_stop_stream(ctx):
  """A while_loop training until the loss is small, printing each step to
  a StringIO; the stream is read after the barrier."""
  out = io.StringIO()

  def cond(c):
    i, w, loss = c
    return (loss > 0.5) & (i < 10)

  def body(c):
    i, w, _ = c
    loss, g = jax.value_and_grad(_loss)(w, XS, YS)
    hcb.id_print((i, loss), output_stream=out, what="while")
    return i + 1, w - 0.125 * g, loss

  r = jax.jit(lambda w: jax.lax.while_loop(cond, body, (0, w, F32(100))))(W0)
  hcb.barrier_wait()
  ctx.log(out.getvalue())
  return r


@scenario
def prog_value_and_grad_aux_metrics(ctx):
  """``value_and_grad(has_aux=True)`` whose aux metrics are tapped inside
  the loss."""

  def loss(w):
    err = XS @ w - YS
    value = jnp.sum(err * err) / 4
    aux = hcb.id_tap(ctx.tap, {"max_err": jnp.max(jnp.abs(err)), "l": value})
    return value, aux

  return jax.jit(jax.value_and_grad(loss, has_aux=True))(W0)


@scenario
def prog_lax_map_print(ctx):
  """``lax.map`` over rows, printing each row's sum with a keyword."""
  return jax.jit(
    lambda m: jax.lax.map(
      lambda r: hcb.id_print(jnp.sum(r), what="row", note="sum"), m
    )
  )(np.arange(6, dtype=np.int32).reshape(3, 2))


# ---------------------------------------------------------------- id_print


@scenario
def prog_print_dtypes_stream_threshold(ctx):
  """A dict of arrays of several dtypes, to a StringIO, with threshold."""
  out = io.StringIO()
  vals = {
    "b": np.array([True, False, True]),
    "i8": np.arange(-3, 3, dtype=np.int8),
    "u32": np.arange(8, dtype=np.uint32) * 1000,
    "f16": np.arange(4, dtype=np.float16) / 4,
    "bf16": jnp.arange(3, dtype=jnp.bfloat16) / 2,
    "empty": np.zeros((0, 3), dtype=F32),
  }
  jax.jit(lambda v: hcb.id_print(v, output_stream=out, threshold=4, step=1))(
    vals
  )
  hcb.barrier_wait()
  ctx.log(out.getvalue())


@scenario
def prog_print_complex64_jit(ctx):
  """A complex64 array printed from jit."""
  jax.jit(lambda z: hcb.id_print(z * 2, what="z"))(
    np.array([1 + 2j, -0.5j], dtype=np.complex64)
  )


@scenario
def prog_print_2d_summarised_default(ctx):
  """A 40x40 array (1600 elements) summarised with the default threshold."""
  jax.jit(lambda m: hcb.id_print(m, what="big"))(
    np.arange(1600, dtype=np.int32).reshape(40, 40)
  )


@scenario
def prog_print_1024_elements_default(ctx):
  """A 32x32 array: 1024 elements, just past numpy's default threshold
  of 1000."""
  jax.jit(lambda m: hcb.id_print(m))(
    np.arange(1024, dtype=np.int32).reshape(32, 32) % 10
  )


@scenario
def prog_print_1001_elements_default(ctx):
  """1001 elements, one past numpy's default threshold."""
  jax.jit(lambda m: hcb.id_print(m))(np.arange(1001, dtype=np.int16) % 10)


@scenario
def prog_print_set_printoptions(ctx):
  """``np.set_printoptions(precision=2)`` in the program, then id_print."""
  old = np.get_printoptions()
  np.set_printoptions(precision=2)
  try:
    jax.jit(lambda x: hcb.id_print(x / 3))(np.arange(3, dtype=F32))
    hcb.barrier_wait()
  finally:
    np.set_printoptions(**old)


@scenario
def prog_print_result_and_kwargs_jit(ctx):
  """``id_print(x, result=y, what=..., step=...)`` returns ``y``."""

  def f(x):
    y = x * 2
    return hcb.id_print(x, result=y, what="x before", step=3)

  return jax.jit(f)(np.arange(3, dtype=F32))


@scenario
def prog_print_result_under_grad(ctx):
  """``id_print(..., result=)`` under grad: prints the operand only."""

  def f(x):
    y = jnp.sin(x) * 0 + x * x
    return hcb.id_print(x, result=y, what="x")

  return jax.grad(f)(F32(1.5))


@scenario
def prog_print_none_leaves_vmap(ctx):
  """A dict with None leaves printed under vmap."""

  def f(x):
    return hcb.id_print({"a": x, "b": None, "c": (None, x * 2)}, what="n")

  return jax.vmap(f)(np.arange(2, dtype=F32))


@scenario
def prog_print_namedtuple_state(ctx):
  """A namedtuple train state printed from a jitted step."""
  State = collections.namedtuple("State", ["step", "w"])

  def step(s):
    s = hcb.id_print(s, what="state")
    return State(s.step + 1, s.w * 2)

  return jax.jit(step)(State(np.int32(0), np.ones(2, F32)))


class Params:
  """A user's pytree class with its own repr."""

  def __init__(self, w, b):
    self.w, self.b = w, b

  def __repr__(self):
    return f"Params(w={self.w!r}, b={self.b!r})"


jax.tree_util.register_pytree_node(
  Params, lambda p: ((p.w, p.b), None), lambda _, c: Params(*c)
)


@scenario
def prog_print_custom_pytree_node(ctx):
  """A registered pytree class is printed with its own str."""
  jax.jit(lambda p: hcb.id_print(p, what="params"))(
    Params(np.arange(2, dtype=F32), F32(0.5))
  )


@scenario
def prog_tap_custom_pytree_node_grad(ctx):
  """A registered pytree class tapped under grad: the tap gets the class."""

  def loss(p):
    p = hcb.id_tap(ctx.tap, p)
    return jnp.sum(p.w) * p.b

  return jax.grad(loss)(Params(np.arange(2, dtype=F32), F32(0.5))).w


@scenario
def prog_print_dict_int_keys(ctx):
  """A dict with integer keys (layer index -> weights)."""
  jax.jit(lambda d: hcb.id_print(d))(
    {2: np.ones(2, F32), 0: np.zeros(1, F32), 1: np.int32(5)}
  )


@scenario
def prog_print_ordered_dict(ctx):
  """An OrderedDict in insertion order (not sorted)."""
  d = collections.OrderedDict([("z", F32(1)), ("a", F32(2))])
  jax.jit(lambda d: hcb.id_print(d))(d)


@scenario
def prog_print_kwarg_array_value(ctx):
  """A keyword argument whose value is a NumPy array and one a dict."""
  jax.jit(
    lambda x: hcb.id_print(x, scale=np.array([1.5, 2.0]), cfg={"lr": 0.1})
  )(F32(1))


@scenario
def prog_print_with_device_and_transforms(ctx):
  """tap_with_device under vmap of jvp: device and transforms both."""

  def f(x):
    return hcb.id_print(x * 2, tap_with_device=True, what="dx")

  return jax.vmap(lambda x: jax.jvp(f, (x,), (x,)))(np.arange(2, dtype=F32))


@scenario
def prog_print_eager_stream_and_stdout(ctx):
  """Eager id_prints, one to a stream and one to stdout, in order."""
  out = io.StringIO()
  hcb.id_print(np.arange(3), what="stdout")
  hcb.id_print(np.float16(0.5), output_stream=out, what="stream")
  hcb.barrier_wait()
  ctx.log(out.getvalue())


# ---------------------------------------------------------------- call


@scenario
def prog_call_result_dict_structs(ctx):
  """``call`` returning a dict, shapes as ShapeDtypeStructs, in a scan."""

  def host(x):
    return {"sq": x * x, "n": np.int32(x.size)}

  shape = {
    "sq": jax.ShapeDtypeStruct((2,), np.float32),
    "n": jax.ShapeDtypeStruct((), np.int32),
  }

  def body(c, x):
    r = hcb.call(host, x, result_shape=shape)
    return c + r["n"], r["sq"]

  return jax.jit(lambda xs: jax.lax.scan(body, 0, xs))(
    np.arange(4, dtype=F32).reshape(2, 2)
  )


@scenario
def prog_call_numpy_array_shape_tuple(ctx):
  """``result_shape`` a tuple of NumPy arrays (their shape and dtype)."""

  def host(x):
    return x.astype(np.int32).reshape(2, 2), np.float32(x.sum())

  return jax.jit(
    lambda x: hcb.call(
      host, x, result_shape=(np.zeros((2, 2), np.int32), np.float32(0))
    )
  )(np.arange(4, dtype=F32))


@scenario
def prog_call_float64_result_shape(ctx):
  """A float64 NumPy array as ``result_shape`` (x64 off) and a host that
  returns float64."""
  return jax.jit(
    lambda x: hcb.call(
      lambda a: a.astype(np.float64) * 2,
      x,
      result_shape=np.zeros(3, np.float64),
    )
  )(np.arange(3, dtype=F32))


@scenario
def prog_call_with_device_in_loop(ctx):
  """``call_with_device`` in a fori_loop under jit."""

  def host(x, *, device):
    ctx.log("host on", device, x.tolist())
    return x + 1

  def body(i, x):
    return hcb.call(host, x, result_shape=x, call_with_device=True)

  return jax.jit(lambda x: jax.lax.fori_loop(0, 2, body, x))(
    np.zeros(2, np.int32)
  )


@scenario(
  ours=(
    "spec/README.md: legacy 0.4.30 on CPU had no device_index (ValueError: "
    "The device_index feature on CPU works only when using outfeed.); "
    "hostcb supports it everywhere"
  ),
  expect="result: jax.Array(float32, (2,), weak=False, [0.0, 2.0])\n",
)
def prog_call_device_index_1_jit(ctx):
  """``device_index=1`` for a call in a plain jit on 2 devices."""
  return jax.jit(
    lambda x: hcb.call(lambda a: a * 2, x, result_shape=x, device_index=1)
  )(np.arange(2, dtype=F32))


@scenario
def prog_call_in_vmap_of_scan(ctx):
  """``call`` under vmap inside a scan: legacy has no batching for it."""

  def body(c, x):
    return c, hcb.call(lambda a: a, x, result_shape=x)

  return jax.vmap(lambda xs: jax.lax.scan(body, 0, xs))(np.zeros((2, 3), F32))


@scenario
def prog_call_no_result_then_tap(ctx):
  """A ``call`` with ``result_shape=None`` as a side effect, then a tap."""

  def host(x):
    ctx.log("host", x.tolist())

  def f(x):
    r = hcb.call(host, x)
    ctx.log("call returned", r)
    return hcb.id_tap(ctx.tap, x + 1)

  return jax.jit(f)(np.arange(2, dtype=np.int32))


@scenario
def prog_call_host_returns_list(ctx):
  """The host returns a list where the shape is a list of structs."""

  def host(x):
    return [x, x * 2]

  return jax.jit(
    lambda x: hcb.call(
      host, x, result_shape=[jax.ShapeDtypeStruct((2,), np.float32)] * 2
    )
  )(np.ones(2, F32))


@scenario
def prog_call_uses_jnp_on_host(ctx):
  """A host function that computes with jax.numpy and returns a jax.Array."""

  def host(x):
    return jnp.asarray(x) * 3

  return jax.jit(lambda x: hcb.call(host, x, result_shape=x))(
    np.arange(3, dtype=F32)
  )


# ---------------------------------------------------------------- barrier


@scenario
def prog_barrier_between_jits(ctx):
  """Three jitted runs with barriers between: the host-side list grows."""
  seen = []
  f = jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(int(a)), x) + 1)
  x = np.int32(0)
  for _ in range(3):
    x = f(x)
    hcb.barrier_wait()
    ctx.log("seen", seen)
  return x


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=(
    "tap: np.ndarray(int32, (), 0) transforms=()\n"
    "tap: np.ndarray(int32, (), 2) transforms=()\n"
    "barrier_wait raised CallbackException: There were exceptions during "
    "callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: step 1 failed\n"
    "\n"
    "second barrier: ok\n"
    "result: (jax.Array(int32, (), weak=True, 3), "
    "jax.Array(int32, (3,), weak=False, [0, 1, 2]))\n"
  ),
)
def prog_tap_raises_in_scan(ctx):
  """A tap that raises at one step of a scan; the barrier reports it once;
  the other steps' taps still ran."""

  def tap(a, transforms):
    if int(a) == 1:
      raise ValueError("step 1 failed")
    ctx.tap(a, transforms)

  def body(c, i):
    return c + 1, hcb.id_tap(tap, i)

  f = jax.jit(lambda: jax.lax.scan(body, 0, jnp.arange(3)))
  r = None
  try:
    r = f()
    hcb.barrier_wait()
  except Exception as e:  # noqa: BLE001  (recorded)
    ctx.log("barrier_wait raised", type(e).__name__ + ":", e)
  hcb.barrier_wait()
  ctx.log("second barrier: ok")
  return r


@scenario
def prog_callback_exception_type(ctx):
  """``hcb.CallbackException`` is the class barrier_wait raises and a
  subclass of Exception."""
  ctx.log(
    "subclass of Exception:", issubclass(hcb.CallbackException, Exception)
  )
  ctx.log("name:", hcb.CallbackException.__name__)


@scenario
def prog_barrier_logging_name(ctx):
  """``barrier_wait(logging_name=...)`` after taps."""
  jax.jit(lambda x: hcb.id_tap(ctx.tap, x))(np.int32(4))
  hcb.barrier_wait(logging_name="after step")
  ctx.log("done")


# ---------------------------------------------------------------- derivatives


@scenario
def prog_custom_jvp_tap_under_jit_grad(ctx):
  """A custom_jvp whose primal and rule both tap, under ``jit(grad)``."""

  @jax.custom_jvp
  def softplus(x):
    return hcb.id_tap(ctx.tapper("primal"), jnp.log1p(jnp.exp(x * 0)) * 0 + x)

  @softplus.defjvp
  def _(primals, tangents):
    (x,), (t,) = primals, tangents
    hcb.id_tap(ctx.tapper("rule"), (x, t))
    return softplus(x), t * 0.5

  return jax.jit(jax.grad(lambda x: softplus(x) * 2))(F32(3))


@scenario
def prog_custom_vjp_clip_grad_vmap(ctx):
  """A gradient-clipping custom_vjp tapping the cotangent, under vmap of
  grad."""

  @jax.custom_vjp
  def clip(x):
    return x

  def fwd(x):
    return x, None

  def bwd(_, g):
    g = hcb.id_tap(ctx.tapper("g"), g)
    return (jnp.clip(g, -1, 1),)

  clip.defvjp(fwd, bwd)
  return jax.vmap(jax.grad(lambda x: clip(x) * x * 2))(
    np.array([0.25, 2.0], F32)
  )


@scenario
def prog_custom_vjp_in_scan_jit_grad(ctx):
  """A custom_vjp with a tapping bwd used in a scan, under ``jit(grad)``."""

  @jax.custom_vjp
  def scale(x):
    return x * 2

  def fwd(x):
    return x * 2, None

  def bwd(_, g):
    return (hcb.id_print(g * 2, what="bwd"),)

  scale.defvjp(fwd, bwd)

  def f(x):
    return jax.lax.scan(lambda c, _: (scale(c), None), x, None, length=2)[0]

  return jax.jit(jax.grad(f))(F32(1))


@scenario
def prog_hessian_vector_product_tap(ctx):
  """A Hessian-vector product (jvp of grad) of a function with a tap."""

  def f(x):
    x = hcb.id_tap(ctx.tap, x)
    return jnp.sum(x * x * x)

  x = np.array([1, 2], F32)
  return jax.jvp(jax.grad(f), (x,), (np.ones(2, F32),))


@scenario
def prog_stop_gradient_of_tap(ctx):
  """``stop_gradient`` around a tapped value under grad."""

  def f(x):
    y = jax.lax.stop_gradient(hcb.id_tap(ctx.tap, x * 2))
    return x * y

  return jax.grad(f)(F32(1.5))


# ---------------------------------------------------------------- cond/vmap


@scenario
def prog_cond_branches_tap_under_vmap(ctx):
  """Taps in both branches of a cond whose predicate is batched."""

  def f(x):
    return jax.lax.cond(
      x > 1,
      lambda v: hcb.id_tap(ctx.tapper("big"), v * 10),
      lambda v: hcb.id_tap(ctx.tapper("small"), v),
      x,
    )

  return jax.jit(jax.vmap(f))(np.arange(3, dtype=F32))


@scenario
def prog_switch_batched_index_print(ctx):
  """``lax.switch`` with a batched index and prints in each branch."""
  branches = [
    lambda v: hcb.id_print(v, what="b0"),
    lambda v: hcb.id_print(v * 2, what="b1"),
    lambda v: hcb.id_print(v * 3, what="b2"),
  ]
  return jax.vmap(lambda i, v: jax.lax.switch(i, branches, v))(
    np.array([2, 0], np.int32), np.array([1, 1], F32)
  )


@scenario
def prog_cond_unbatched_pred_in_vmap(ctx):
  """A cond with an unbatched predicate under vmap: one branch taps."""

  def f(p, x):
    return jax.lax.cond(
      p,
      lambda v: hcb.id_tap(ctx.tapper("t"), v + 1),
      lambda v: hcb.id_tap(ctx.tapper("f"), v - 1),
      x,
    )

  return jax.vmap(f, in_axes=(None, 0))(True, np.arange(2, dtype=F32))


@scenario
def prog_where_on_tapped_values(ctx):
  """``jnp.where`` between two tapped values, jitted and vmapped."""

  def f(x):
    a = hcb.id_tap(ctx.tapper("a"), x * 2)
    b = hcb.id_tap(ctx.tapper("b"), -x)
    return jnp.where(x > 0, a, b)

  return jax.jit(jax.vmap(f))(np.array([-1, 0, 2], F32))


# ---------------------------------------------------------------- misc jit


@scenario
def prog_tap_bound_method_static_arg(ctx):
  """A bound method as the tap, with jit ``static_argnums`` for the mode."""

  class Logger:
    def __init__(self):
      self.rows = []

    def record(self, arg, transforms):
      self.rows.append((arg.tolist(), transforms))

  log = Logger()

  @functools.partial(jax.jit, static_argnums=1)
  def f(x, mode):
    return hcb.id_tap(log.record, x * (2 if mode == "double" else 1))

  f(np.arange(2, dtype=F32), "double")
  f(np.arange(2, dtype=F32), "same")
  f(np.arange(2, dtype=F32), "double")
  hcb.barrier_wait()
  ctx.log("rows", log.rows)


@scenario
def prog_tap_partial_with_kwargs(ctx):
  """The documented replacement for id_tap's kwargs: a partial."""

  def tap(arg, transforms, *, tag, device=None):
    ctx.log("tag", tag, "arg", arg.tolist(), "device", device)

  f = jax.jit(
    lambda x: hcb.id_tap(
      functools.partial(tap, tag="t1"), x, tap_with_device=True
    )
  )
  return f(np.arange(2, dtype=np.int32))


@scenario
def prog_tap_unused_result_in_jit(ctx):
  """A tap whose result is not used: does it still run under jit?"""

  def f(x):
    hcb.id_tap(ctx.tapper("unused"), x)
    return x + 1

  return jax.jit(f)(np.arange(2, dtype=F32))


@scenario
def prog_tap_donated_argument(ctx):
  """A tap of a donated argument."""
  f = jax.jit(lambda x: hcb.id_tap(ctx.tap, x) * 2, donate_argnums=0)
  return f(jnp.arange(3, dtype=F32))


@scenario
def prog_tap_named_scope_and_named_call(ctx):
  """Taps inside ``jax.named_scope`` and ``jax.named_call``."""

  def layer(x):
    with jax.named_scope("layer"):
      return hcb.id_tap(ctx.tapper("scope"), x + 1)

  g = jax.named_call(lambda x: hcb.id_tap(ctx.tapper("call"), x * 2), name="g")
  return jax.jit(lambda x: g(layer(x)))(F32(1))


@scenario
def prog_tap_int_and_float_under_grad(ctx):
  """A tuple of an int step and a float value tapped under grad."""

  def f(x, i):
    i, x = hcb.id_tap(ctx.tap, (i, x))
    return x * i

  return jax.grad(f)(F32(2), np.int32(3))


@scenario
def prog_tap_jit_retrace_new_shape(ctx):
  """The same jitted tapping function on two shapes (two compilations)."""
  f = jax.jit(lambda x: hcb.id_tap(ctx.tap, x.sum()))
  f(np.arange(2, dtype=np.int32))
  f(np.arange(3, dtype=np.int32))
  return f(np.arange(2, dtype=np.int32))


@scenario
def prog_tap_eval_shape(ctx):
  """``jax.eval_shape`` of a tapping function: no tap runs."""
  r = jax.eval_shape(lambda x: hcb.id_tap(ctx.tap, x * 2), np.ones(2, F32))
  ctx.log("shape", r.shape, r.dtype)


@scenario
def prog_tap_make_jaxpr(ctx):
  """``jax.make_jaxpr`` of a tapping function: no tap runs."""
  jax.make_jaxpr(lambda x: hcb.id_tap(ctx.tap, x * 2))(np.ones(2, F32))
  ctx.log("traced")


# ---------------------------------------------------------------- pmap


@scenario(unordered=True)
def prog_pmap_train_scan_metrics(ctx):
  """pmap over 2 devices of a scan that taps metrics with the device and
  averages the gradient with pmean."""

  def train(w, x, y):
    def step(w, i):
      loss, g = jax.value_and_grad(_loss)(w, x, y)
      g = jax.lax.pmean(g, "d")
      hcb.id_tap(ctx.tap, {"i": i, "loss": loss}, tap_with_device=True)
      return w - 0.125 * g, None

    return jax.lax.scan(step, w, jnp.arange(2))[0]

  ws = np.zeros((2, 2), F32)
  xs = np.stack([XS, XS * 2])
  ys = np.stack([YS, YS])
  return jax.pmap(train, axis_name="d")(ws, xs, ys)


@scenario(unordered=True)
def prog_pmap_print_grad_psum(ctx):
  """pmap of grad with a psum'd loss, printing the gradient per device."""

  def f(w):
    g = jax.grad(lambda w: jax.lax.psum(w * w, "d"))(w)
    return hcb.id_print(g, what="g", tap_with_device=True)

  return jax.pmap(f, axis_name="d")(np.array([1, 2], F32))


@scenario(unordered=True)
def prog_pmap_call_in_cond(ctx):
  """pmap with a call inside one branch of a cond."""

  def host(x):
    ctx.log("host", x.tolist())
    return x * 10

  def f(x):
    return jax.lax.cond(
      x[0] > 0,
      lambda v: hcb.call(host, v, result_shape=v),
      lambda v: v,
      x,
    )

  return jax.pmap(f)(np.array([[0, 1], [2, 3]], F32))


@scenario(unordered=True)
def prog_pmap_of_vmap_print_dict(ctx):
  """pmap of vmap printing a dict with device."""

  def f(x):
    return hcb.id_print({"x": x, "sq": x * x}, tap_with_device=True)

  return jax.pmap(jax.vmap(f))(np.arange(4, dtype=np.int32).reshape(2, 2))


# ---------------------------------------------------------------- more


@scenario
def prog_tap_result_not_a_jax_type(ctx):
  """``id_tap(f, x, result="done")``: a string as the result."""
  return hcb.id_tap(ctx.tap, np.int32(1), result="done")


@scenario
def prog_tap_result_pytree_jit(ctx):
  """``id_tap`` with a pytree ``result`` under jit: the tap sees ``arg``."""
  return jax.jit(
    lambda x: hcb.id_tap(ctx.tap, x, result={"y": x + 1, "z": (x * 2,)})
  )(np.int32(3))


@scenario(
  ours=(
    "legacy's default implementation ignored callback_flavor, whatever "
    "its value; hostcb checks it is a CallbackFlavor (a value that is not "
    "is a mistake that would otherwise pass silently)"
  ),
  expect=(
    "raised TypeError: callback_flavor must be a hostcb.CallbackFlavor; "
    "got 'debug'\n"
  ),
)
def prog_tap_callback_flavor_string(ctx):
  """A string as ``callback_flavor``."""
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, x, callback_flavor="debug"))(
    np.int32(1)
  )


@scenario
def prog_tap_debug_flavor_vmap(ctx):
  """``CallbackFlavor.DEBUG`` for a tap under vmap."""
  return jax.vmap(
    lambda x: hcb.id_tap(ctx.tap, x, callback_flavor=hcb.CallbackFlavor.DEBUG)
  )(np.arange(2, dtype=np.int32))


@scenario
def prog_disable_jit_scan_print(ctx):
  """A training scan under ``jax.disable_jit()``: eager prints per step."""

  def step(w, i):
    loss, g = jax.value_and_grad(_loss)(w, XS, YS)
    hcb.id_print(loss, what="loss", i=2)
    return w - 0.125 * g, loss

  with jax.disable_jit():
    return jax.lax.scan(step, W0, jnp.arange(2))


@scenario
def prog_x64_print_and_call(ctx):
  """With x64 on: float64/int64 prints and a float64 call."""
  jax.config.update("jax_enable_x64", True)
  try:
    x = jnp.arange(3, dtype=jnp.float64) / 3
    jax.jit(lambda x: hcb.id_print((x, jnp.int64(2**40)), what="x64"))(x)
    r = jax.jit(lambda x: hcb.call(lambda a: a * 2, x, result_shape=x))(x)
    t = jax.jit(lambda x: hcb.id_tap(ctx.tap, (x, 1, 0.5)))(x)
    hcb.barrier_wait()
    ctx.log("call", r.dtype, np.asarray(r).tolist())
    ctx.log("tap result", t)
  finally:
    jax.config.update("jax_enable_x64", False)


@scenario
def prog_vmap_in_axes_1_print(ctx):
  """vmap over axis 1 of a matrix, printing each column."""
  return jax.vmap(lambda c: hcb.id_print(c, what="col"), in_axes=1)(
    np.arange(6, dtype=np.int32).reshape(2, 3)
  )


@scenario
def prog_vmap_in_axes_1_tap(ctx):
  """vmap over axis 1 with a tap: what arrives and its batch_dims."""
  return jax.vmap(lambda c: hcb.id_tap(ctx.tap, c * 2), in_axes=1)(
    np.arange(6, dtype=np.int32).reshape(2, 3)
  )


@scenario
def prog_vmap_out_axes_1_tap_dict(ctx):
  """vmap with ``out_axes={"a": 1, "b": 0}`` of a dict-tapping function."""
  return jax.vmap(
    lambda x: hcb.id_tap(ctx.tap, {"a": x, "b": x.sum()}),
    out_axes={"a": 1, "b": 0},
  )(np.arange(6, dtype=np.int32).reshape(3, 2))


@scenario
def prog_nested_tap_in_tap(ctx):
  """A tap function that runs a jitted function (without taps) itself."""
  g = jax.jit(lambda a: a * 2)

  def tap(a, transforms):
    ctx.log("tap got", a.tolist(), "inner", np.asarray(g(a)).tolist())

  return jax.jit(lambda x: hcb.id_tap(tap, x + 1))(np.arange(2, dtype=F32))


@scenario
def prog_scan_reverse_unroll_print(ctx):
  """A reversed, unrolled scan printing each element."""
  return jax.jit(
    lambda xs: jax.lax.scan(
      lambda c, x: (c + hcb.id_print(x, what="x"), c),
      0,
      xs,
      reverse=True,
      unroll=2,
    )
  )(np.arange(4, dtype=np.int32))


@scenario
def prog_grad_argnums_two_taps(ctx):
  """``grad(argnums=(0, 1))`` of a function tapping both arguments."""

  def f(a, b):
    a = hcb.id_tap(ctx.tapper("a"), a)
    b = hcb.id_tap(ctx.tapper("b"), b)
    return a * b * b

  return jax.jit(jax.grad(f, argnums=(0, 1)))(F32(2), F32(3))


@scenario
def prog_custom_jvp_nondiff_argnums(ctx):
  """A custom_jvp with a nondiff argument that taps in its rule."""

  @functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
  def scale(k, x):
    return x * k

  @scale.defjvp
  def _(k, primals, tangents):
    (x,), (t,) = primals, tangents
    t = hcb.id_tap(ctx.tapper("t"), t)
    return x * k, t * k

  return jax.grad(lambda x: scale(3.0, x))(F32(2))


@scenario
def prog_print_in_cond_under_grad(ctx):
  """id_print inside cond branches under jit(grad)."""

  def f(x):
    return jax.lax.cond(
      x > 0,
      lambda v: hcb.id_print(v * v, what="pos"),
      lambda v: hcb.id_print(-v, what="neg"),
      x,
    )

  return jax.jit(jax.grad(f))(F32(1.5))


@scenario
def prog_print_transforms_vmap_grad(ctx):
  """id_print under vmap of grad: the transforms line."""
  return jax.vmap(jax.grad(lambda x: hcb.id_print(x * x, what="sq") * 2))(
    np.array([1, 2], F32)
  )


@scenario
def prog_print_custom_vjp_bwd_vmap(ctx):
  """id_print in a custom_vjp's bwd under vmap: transforms printed."""

  @jax.custom_vjp
  def f(x):
    return x * 2

  f.defvjp(
    lambda x: (x * 2, None),
    lambda _, g: (hcb.id_print(g, what="ct") * 2,),
  )
  return jax.vmap(jax.grad(f))(np.array([1, 2], F32))


@scenario
def prog_print_bool_and_scalar_kinds(ctx):
  """A tuple of bool/int/float scalars and a bool matrix."""
  jax.jit(lambda b, i, f, m: hcb.id_print((b, i, f, m), what="kinds"))(
    np.bool_(True), np.int32(-7), F32(0.1), np.eye(3, dtype=bool)
  )


@scenario
def prog_print_float_precision(ctx):
  """Floats needing many digits, and large and tiny magnitudes."""
  jax.jit(lambda x: hcb.id_print(x))(
    np.array([1 / 3, 1e-8, 123456789.0, -2.5e12, 0.0], F32)
  )


@scenario
def prog_print_float16_bf16_2d(ctx):
  """2-D float16 and bfloat16 arrays in a list."""
  jax.jit(lambda a, b: hcb.id_print([a, b]))(
    (np.arange(6, dtype=np.float16) / 8).reshape(2, 3),
    (jnp.arange(4, dtype=jnp.bfloat16) * 1.5).reshape(2, 2),
  )


@scenario
def prog_print_uint_int8_summarised(ctx):
  """uint32 and int8 arrays summarised with a small threshold."""
  jax.jit(lambda a, b: hcb.id_print((a, b), threshold=3))(
    np.arange(10, dtype=np.uint32) * 4000000000 // 10,
    np.arange(-5, 5, dtype=np.int8),
  )


@scenario
def prog_print_threshold_zero(ctx):
  """``threshold=0``: every array of more than 0 elements summarised?"""
  jax.jit(lambda a: hcb.id_print(a, threshold=0))(np.arange(8, dtype=F32))


@scenario
def prog_print_multiple_streams_order(ctx):
  """Two prints to two streams and one to stdout, in a loop."""
  s1, s2 = io.StringIO(), io.StringIO()

  def body(i, c):
    c = hcb.id_print(c, output_stream=s1, what="one")
    c = hcb.id_print(c + 1, output_stream=s2, what="two")
    return hcb.id_print(c, what="std")

  jax.jit(lambda c: jax.lax.fori_loop(0, 2, body, c))(np.int32(0))
  hcb.barrier_wait()
  ctx.log("s1:", s1.getvalue())
  ctx.log("s2:", s2.getvalue())


@scenario
def prog_print_stream_without_newline_handling(ctx):
  """An output_stream that records each write separately."""
  writes = []

  class Stream:
    def write(self, s):
      writes.append(s)

  jax.jit(lambda x: hcb.id_print(x, output_stream=Stream(), what="w"))(
    np.arange(2, dtype=np.int32)
  )
  hcb.barrier_wait()
  ctx.log("writes", writes)


@scenario
def prog_print_kwarg_device_and_tap_with_device(ctx):
  """A ``device=`` keyword together with ``tap_with_device=True``."""
  jax.jit(lambda x: hcb.id_print(x, device="mine", tap_with_device=True))(
    np.int32(1)
  )


@scenario
def prog_print_eager_python_containers(ctx):
  """Eager id_print of Python ints and floats in a dict with a list."""
  return hcb.id_print({"ints": [1, 2], "f": 0.5, "b": True})


@scenario
def prog_call_no_arg(ctx):
  """A ``call`` with ``arg=None`` returning a host value under jit."""

  def host(a):
    ctx.log("host got", a)
    return np.arange(2, dtype=np.int32)

  return jax.jit(
    lambda: hcb.call(
      host, None, result_shape=jax.ShapeDtypeStruct((2,), np.int32)
    )
  )()


@scenario
def prog_call_empty_tuple_arg(ctx):
  """A ``call`` with ``arg=()`` in a scan (a host counter)."""
  count = [0]

  def host(a):
    count[0] += 1
    return np.int32(count[0])

  return jax.jit(
    lambda: jax.lax.scan(
      lambda c, _: (c, hcb.call(host, (), result_shape=np.int32(0))),
      0,
      None,
      length=3,
    )
  )()


@scenario
def prog_call_result_weak_python_scalar(ctx):
  """``result_shape=1.0`` (a Python float) and a host returning float32."""
  return jax.jit(
    lambda x: hcb.call(lambda a: np.float32(a.sum()), x, result_shape=1.0)
  )(np.arange(3, dtype=F32))


@scenario
def prog_call_result_shape_tuple_numbers(ctx):
  """``result_shape=(0, 0.0)``: an int32 and a float32 scalar."""
  return jax.jit(
    lambda x: hcb.call(
      lambda a: (np.int32(a.size), np.float32(a.sum())),
      x,
      result_shape=(0, 0.0),
    )
  )(np.arange(3, dtype=F32))


@scenario
def prog_call_host_returns_wrong_structure_dict(ctx):
  """A dict expected, the host returns a tuple."""
  return _failing_call(
    ctx,
    jax.jit(
      lambda x: hcb.call(lambda a: (a, a), x, result_shape={"a": x, "b": x})
    ),
    np.arange(2, dtype=F32),
  )


@scenario
def prog_call_host_returns_bool_for_int(ctx):
  """The host returns a bool array where int32 is expected."""
  return _failing_call(
    ctx,
    jax.jit(lambda x: hcb.call(lambda a: a > 0, x, result_shape=x)),
    np.arange(2, dtype=np.int32),
  )


@scenario
def prog_call_host_returns_scalar_for_shape_1(ctx):
  """The host returns a scalar where shape (1,) is expected."""
  return _failing_call(
    ctx,
    jax.jit(lambda x: hcb.call(lambda a: np.float32(1), x, result_shape=x)),
    np.zeros(1, F32),
  )


@scenario
def prog_call_with_device_pytree_arg(ctx):
  """``call_with_device`` with a dict argument and tuple result."""

  def host(d, *, device):
    ctx.log("device", device, sorted(d))
    return d["a"] + 1, d["b"] * 2

  return jax.jit(
    lambda d: hcb.call(
      host, d, result_shape=(d["a"], d["b"]), call_with_device=True
    )
  )({"a": np.int32(1), "b": np.ones(2, F32)})


@scenario
def prog_call_in_while_cond(ctx):
  """A ``call`` in a while_loop's cond (a host stopping rule)."""

  def host_should_go(i):
    return np.bool_(i < 3)

  return jax.jit(
    lambda: jax.lax.while_loop(
      lambda i: hcb.call(host_should_go, i, result_shape=np.bool_(True)),
      lambda i: hcb.id_print(i + 1, what="i"),
      0,
    )
  )()


@scenario
def prog_call_then_grad_through_stop_gradient(ctx):
  """A ``call`` used under grad through stop_gradient."""

  def f(x):
    y = hcb.call(lambda a: a * 2, jax.lax.stop_gradient(x), result_shape=x)
    return x * jax.lax.stop_gradient(y)

  return jax.grad(f)(F32(1.5))


@scenario(
  ours=(
    "legacy's default implementation ignored callback_flavor, so call "
    "under vmap raised NotImplementedError (batching rules are "
    "implemented only for id_tap, not for call.) for every flavor; "
    "hostcb's PURE call is batched (hostcb.CallbackFlavor's doc): once "
    "per batch element"
  ),
  expect=(
    "host 0.0\nhost 1.0\n"
    "result: jax.Array(float32, (2,), weak=False, [0.0, 2.0])\n"
  ),
)
def prog_call_pure_flavor_vmap(ctx):
  """``CallbackFlavor.PURE`` call under vmap."""

  def host(a):
    ctx.log("host", a.tolist())
    return a * 2

  return jax.vmap(
    lambda x: hcb.call(
      host, x, result_shape=x, callback_flavor=hcb.CallbackFlavor.PURE
    )
  )(np.arange(2, dtype=F32))


@scenario(
  ours=(
    "documented difference: a failing call raises in the caller and is "
    "recorded for the next barrier_wait too (legacy 0.4.30 on CPU "
    "only raised in the caller)"
  ),
  expect=(
    "call raised JaxRuntimeError\n"
    "barrier raised CallbackException\n"
    "tap: np.ndarray(int32, (), 2) transforms=()\n"
    "result: jax.Array(int32, (), weak=False, 2)\n"
  ),
)
def prog_barrier_after_call_error_then_ok(ctx):
  """A failing call, its error caught, then a good jit with a tap and a
  barrier."""

  def bad(a):
    raise RuntimeError("no host data")

  try:
    jax.jit(lambda x: hcb.call(bad, x, result_shape=x))(np.int32(1))
  except Exception as e:  # noqa: BLE001  (recorded)
    ctx.log("call raised", type(e).__name__)
  try:
    hcb.barrier_wait()
    ctx.log("barrier ok")
  except Exception as e:  # noqa: BLE001  (recorded)
    ctx.log("barrier raised", type(e).__name__)
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, x))(np.int32(2))


@scenario
def prog_stop_outfeed_receiver_then_tap(ctx):
  """``stop_outfeed_receiver()`` and then more taps (it restarts)."""
  jax.jit(lambda x: hcb.id_tap(ctx.tapper("before"), x))(np.int32(1))
  hcb.stop_outfeed_receiver()
  ctx.log("stopped")
  return jax.jit(lambda x: hcb.id_tap(ctx.tapper("after"), x))(np.int32(2))


@scenario
def prog_public_names(ctx):
  """The public names a legacy program used from the module."""
  for n in [
    "id_tap",
    "id_print",
    "call",
    "barrier_wait",
    "stop_outfeed_receiver",
    "CallbackException",
    "CallbackFlavor",
  ]:
    ctx.log(n, hasattr(hcb, n))
  ctx.log(sorted(f.name for f in hcb.CallbackFlavor))


@scenario
def prog_tap_returns_value_ignored(ctx):
  """A tap function that returns something: ignored."""
  return jax.jit(lambda x: hcb.id_tap(lambda a, t: a * 100, x) + 1)(np.int32(1))


@scenario
def prog_tap_arg_is_list_under_jit(ctx):
  """A list argument under jit keeps being a list in tap and result."""
  return jax.jit(lambda a, b: hcb.id_tap(ctx.tap, [a, b]))(np.int32(1), F32(2))


@scenario
def prog_tap_jnp_array_of_python_list_eager(ctx):
  """Eager id_tap of a Python list of floats (each becomes an array)."""
  return hcb.id_tap(ctx.tap, [1.0, 2])


@scenario
def prog_tap_in_jit_inline(ctx):
  """A tap in a ``jit(inline=True)`` function called from a jit."""
  inner = jax.jit(lambda x: hcb.id_tap(ctx.tapper("inner"), x * 2), inline=True)
  return jax.jit(lambda x: inner(x) + hcb.id_tap(ctx.tapper("outer"), x))(
    np.int32(1)
  )


@scenario
def prog_tap_in_linear_transpose(ctx):
  """``jax.linear_transpose`` of a function with a tap."""

  def f(x):
    return hcb.id_tap(ctx.tap, x) * 2

  t = jax.linear_transpose(f, np.ones(2, F32))
  return t(np.array([1, 2], F32))


@scenario
def prog_tap_jacrev_of_dict(ctx):
  """jacrev of a function of a dict that taps the dict."""

  def f(p):
    p = hcb.id_tap(ctx.tap, p)
    return p["a"] * p["b"]

  return jax.jacrev(f)({"a": np.array([1, 2], F32), "b": F32(3)})


@scenario(unordered=True)
def prog_pmap_id_print_result_with_device(ctx):
  """pmap with ``id_print(..., result=)`` and tap_with_device."""
  return jax.pmap(
    lambda x: hcb.id_print(x, result=x * 3, tap_with_device=True, what="r")
  )(np.arange(2, dtype=np.int32))


@scenario(unordered=True)
def prog_pmap_while_loop_taps(ctx):
  """pmap of a while_loop that taps each iteration (different trip counts
  per device)."""

  def f(n):
    return jax.lax.while_loop(
      lambda i: i < n,
      lambda i: hcb.id_tap(ctx.tap, i + 1, tap_with_device=True),
      0,
    )

  return jax.pmap(f)(np.array([1, 3], np.int32))


@scenario(unordered=True)
def prog_pmap_call_with_device_tuple(ctx):
  """pmap of a call with device returning a tuple."""

  def host(x, *, device):
    ctx.log("host", device, x.tolist())
    return x + 1, x.sum()

  return jax.pmap(
    lambda x: hcb.call(
      host, x, result_shape=(x, x.sum()), call_with_device=True
    )
  )(np.arange(4, dtype=np.int32).reshape(2, 2))


# ---------------------------------------------------------------- batch 3


@scenario(
  ours=(
    "README (Migrating, NumPy print options): NumPy 2 keeps print options "
    "per thread, so id_print uses those in effect where it is traced; "
    "legacy (NumPy 1, global options) used those in effect when it printed"
  ),
  expect=(
    "what: p\n[0.         0.33333334 0.6666667 ]\n"
    "what: p\n[0.         0.33333334 0.6666667 ]\n"
    "what: p\n[0.         0.33333334 0.6666667 ]\n"
  ),
)
def prog_print_options_changed_after_compile(ctx):
  """A jitted print compiled under default options, run again after
  ``np.set_printoptions(precision=2)``."""
  f = jax.jit(lambda x: hcb.id_print(x / 3, what="p"))
  x = np.arange(3, dtype=F32)
  f(x)
  hcb.barrier_wait()
  old = np.get_printoptions()
  np.set_printoptions(precision=2)
  try:
    f(x)
    hcb.barrier_wait()
  finally:
    np.set_printoptions(**old)
  f(x)


@scenario(
  ours=(
    "README (Migrating, NumPy print options): NumPy 2 keeps print options "
    "per thread, so id_print uses those in effect where it is traced; "
    "legacy (NumPy 1, global options) used those in effect when it printed"
  ),
  expect=(
    "[0.         0.33333334 0.6666667 ]\n"
    "[0.0000000e+00 3.3333333e-07 6.6666666e-07]\n"
  ),
)
def prog_print_options_context_manager(ctx):
  """A jitted print compiled first, then run inside ``np.printoptions``."""
  f = jax.jit(lambda x: hcb.id_print(x / 3))
  x = np.arange(3, dtype=F32)
  f(x)
  hcb.barrier_wait()
  with np.printoptions(precision=3, suppress=True):
    f(x * 1e-6)
    hcb.barrier_wait()


@scenario
def prog_print_options_various(ctx):
  """Prints under several NumPy print options, each a new jit (not
  ``sign``: NumPy 2 applies it to integers too, NumPy 1 did not)."""
  x = np.array([-1.5, 0.25, 1e-7, 3.0], F32)
  i = np.arange(12, dtype=np.int32)
  for opts in [
    {"floatmode": "fixed", "precision": 3},
    {"suppress": True},
    {"linewidth": 20},
    {"edgeitems": 1, "threshold": 5},
    {"nanstr": "NaN!", "infstr": "INF"},
    {"formatter": {"float": lambda v: f"<{v:.1f}>"}},
  ]:
    with np.printoptions(**opts):
      ctx.log("options", sorted(k for k in opts))
      jax.jit(lambda a, b: hcb.id_print((a, b, a / 0)))(x, i)
      hcb.barrier_wait()


@scenario
def prog_print_line_width_boundary(ctx):
  """Tuples whose one-line form is 78 to 82 columns wide."""
  for n in range(78, 83):
    # "( " + k numbers + " )": the last element's digits fill the width.
    body = n - 4
    k = (body + 1) // 2
    vals = [np.int32(1)] * (k - 1)
    last_width = body - 2 * (k - 1)
    vals.append(np.int32(int("9" * last_width)) if last_width < 10 else 1)
    ctx.log("width", n)
    jax.jit(lambda *a: hcb.id_print(tuple(a)))(*vals)
    hcb.barrier_wait()


@scenario
def prog_print_nested_breaking(ctx):
  """A dict holding a list holding a multi-line array and a wide tuple."""
  jax.jit(lambda d: hcb.id_print(d, what="nested"))(
    {
      "layers": [
        np.arange(6, dtype=F32).reshape(2, 3),
        tuple(np.int32(100000 + i) for i in range(12)),
      ],
      "a": np.int32(1),
    }
  )


@scenario
def prog_print_single_element_containers(ctx):
  """``(x,)``, ``[x]`` and ``{"k": x}`` printed."""
  jax.jit(lambda x: hcb.id_print(((x,), [x], {"k": x})))(np.int32(7))


@scenario
def prog_print_long_kwargs_line(ctx):
  """Many keyword arguments: one long line, not wrapped."""
  jax.jit(
    lambda x: hcb.id_print(
      x, **{f"key_{i}": "value_" + "v" * i for i in range(10)}
    )
  )(np.int32(1))


@scenario
def prog_print_eager_float64_and_big_int(ctx):
  """Eager id_print of a float64 1/3 and an int64 array (x64 off)."""
  hcb.id_print((np.float64(1 / 3), np.array([2**31 - 1, -5], np.int64)))


@scenario
def prog_print_eager_python_int_too_big(ctx):
  """Eager id_print of ``2**40`` with x64 off."""
  hcb.id_print(2**40)


@scenario
def prog_call_host_returns_transposed(ctx):
  """The host returns a transposed (Fortran-ordered) view."""
  return jax.jit(
    lambda x: hcb.call(
      lambda a: np.ascontiguousarray(a).T,
      x,
      result_shape=jax.ShapeDtypeStruct((3, 2), np.float32),
    )
  )(np.arange(6, dtype=F32).reshape(2, 3))


@scenario
def prog_call_host_returns_strided_views(ctx):
  """Reversed, sliced and broadcast views as results."""

  def host(a):
    return a[::-1], a[::2], np.broadcast_to(a[:1], (4,))

  return jax.jit(
    lambda x: hcb.call(
      host,
      x,
      result_shape=(x, jax.ShapeDtypeStruct((2,), F32), x),
    )
  )(np.arange(4, dtype=F32))


@scenario
def prog_call_host_returns_big_endian(ctx):
  """The host returns a big-endian float32 array."""
  return jax.jit(
    lambda x: hcb.call(lambda a: a.astype(">f4") * 2, x, result_shape=x)
  )(np.arange(3, dtype=F32))


@scenario
def prog_call_host_returns_list_for_array(ctx):
  """The host returns a Python list of floats for a (2,) array."""
  return _failing_call(
    ctx,
    jax.jit(lambda x: hcb.call(lambda a: [1.0, 2.0], x, result_shape=x)),
    np.zeros(2, F32),
  )


@scenario
def prog_call_small_dtypes(ctx):
  """call results of bool, uint8, int8, float16, bfloat16 and 0-size."""

  def host(a):
    return (
      a > 1,
      a.astype(np.uint8),
      (-a).astype(np.int8),
      a.astype(np.float16) / 4,
      a.astype(jnp.bfloat16) * 2,
      np.zeros((0, 2), np.float32),
    )

  shape = (
    jax.ShapeDtypeStruct((3,), np.bool_),
    jax.ShapeDtypeStruct((3,), np.uint8),
    jax.ShapeDtypeStruct((3,), np.int8),
    jax.ShapeDtypeStruct((3,), np.float16),
    jax.ShapeDtypeStruct((3,), jnp.bfloat16),
    jax.ShapeDtypeStruct((0, 2), np.float32),
  )
  return jax.jit(lambda x: hcb.call(host, x, result_shape=shape))(
    np.arange(3, dtype=np.int32)
  )


@scenario
def prog_call_complex64(ctx):
  """A call with a complex64 operand and result."""
  return jax.jit(lambda z: hcb.call(lambda a: a * 1j, z, result_shape=z))(
    np.array([1 + 1j, 2], np.complex64)
  )


@scenario
def prog_tap_complex_under_grad(ctx):
  """A complex value tapped under grad of its real part."""

  def f(x):
    z = hcb.id_tap(ctx.tap, x * (1 + 1j))
    return jnp.real(z * z)

  return jax.grad(f)(F32(1.5))


@scenario
def prog_tap_eager_dtypes(ctx):
  """Eager taps of NumPy scalars and arrays of several dtypes."""
  return hcb.id_tap(
    ctx.tap,
    (
      np.float64(0.1),
      np.int64(5),
      np.uint64(7),
      np.array([True]),
      np.float16(2),
      np.array([1, 2], np.uint16),
    ),
  )


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=(
    "caught CallbackException\n"
    "tap: np.ndarray(int32, (), 2) transforms=()\n"
    "result: jax.Array(int32, (), weak=False, 2)\n"
  ),
)
def prog_tap_raises_eager_then_jit_ok(ctx):
  """An eager tap that raises, caught at the barrier, then a jitted tap."""

  def bad(a, t):
    raise KeyError("missing")

  try:
    hcb.id_tap(bad, np.int32(1))
    hcb.barrier_wait()
  except Exception as e:  # noqa: BLE001  (recorded)
    ctx.log("caught", type(e).__name__)
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, x))(np.int32(2))


@scenario
def prog_vmap_psum_axis_name_tap(ctx):
  """vmap with an axis name and a psum, tapping per element and total."""

  def f(x):
    total = jax.lax.psum(x, "b")
    return hcb.id_tap(ctx.tap, (x, total))

  return jax.vmap(f, axis_name="b")(np.arange(3, dtype=F32))


@scenario
def prog_scan_carry_with_none_and_dict(ctx):
  """A scan whose carry is a dict with a None leaf, tapped each step."""

  def body(c, x):
    c = {"n": c["n"] + 1, "skip": None, "acc": c["acc"] + x}
    return hcb.id_tap(ctx.tap, c), None

  return jax.jit(
    lambda xs: jax.lax.scan(body, {"n": 0, "skip": None, "acc": F32(0)}, xs)[0]
  )(np.arange(3, dtype=F32))


@scenario(unordered=True)
def prog_grad_of_pmap_tap(ctx):
  """grad of a sum over a pmap'd function that taps."""

  def f(x):
    y = jax.pmap(lambda v: hcb.id_tap(ctx.tapper("in"), v * v))(x)
    return jnp.sum(y)

  r = jax.grad(f)(np.array([1, 2], F32))
  hcb.barrier_wait()
  return r


@scenario
def prog_threads_dispatching_taps(ctx):
  """Two Python threads each run a jitted tapping function; the taps of
  each thread arrive in its order."""
  import threading

  seen = {0: [], 1: []}
  f = jax.jit(
    lambda t, i: hcb.id_tap(
      lambda a, tr: seen[int(a[0])].append(int(a[1])), (t, i)
    )
  )

  def run(t):
    for i in range(5):
      f(np.int32(t), np.int32(i))

  ts = [threading.Thread(target=run, args=(t,)) for t in (0, 1)]
  for t in ts:
    t.start()
  for t in ts:
    t.join(30)
  hcb.barrier_wait()
  ctx.log("seen", seen)


@scenario
def prog_jit_tap_function_equal_but_distinct(ctx):
  """Two equal-comparing tap objects in one jitted function each get
  their own taps."""

  class Tap:
    def __init__(self, name):
      self.name = name

    def __eq__(self, other):
      return isinstance(other, Tap)

    def __hash__(self):
      return 0

    def __call__(self, a, t):
      ctx.log("tap", self.name, a.tolist())

  return jax.jit(
    lambda x: hcb.id_tap(Tap("one"), x) + hcb.id_tap(Tap("two"), x * 2)
  )(np.int32(1))


@scenario
def prog_same_jit_twice_different_closures(ctx):
  """A function re-jitted with a different tap closure each time."""
  out = []
  for k in range(2):
    f = jax.jit(
      lambda x, k=k: hcb.id_tap(lambda a, t: out.append((k, int(a))), x)
    )
    f(np.int32(k))
  hcb.barrier_wait()
  ctx.log("out", out)


# ---------------------------------------------------------------- batch 4


@scenario
def prog_print_then_python_print_no_barrier(ctx):
  """A jitted id_print, then a Python print with no barrier between."""
  f = jax.jit(lambda x: hcb.id_print(x * 2, what="dev"))
  r = f(np.arange(2, dtype=np.int32))
  print("after first")
  f(r)
  print("after second")


@scenario
def prog_print_loop_python_prints_interleaved(ctx):
  """A Python loop of jitted steps that print, with Python prints of the
  step number between (a typical training log)."""
  step = jax.jit(lambda w: hcb.id_print(w - 1, what="w"))
  w = np.int32(3)
  for i in range(3):
    print(f"step {i}")
    w = step(w)
  print("final", int(w))


@scenario
def prog_block_until_ready_then_read(ctx):
  """Taps into a list, then ``block_until_ready`` on the result and read
  the list without barrier_wait."""
  seen = []
  r = jax.jit(
    lambda x: hcb.id_tap(lambda a, t: seen.append(a.tolist()), x * 2)
  )(np.arange(3, dtype=np.int32))
  r.block_until_ready()
  hcb.barrier_wait()
  ctx.log("seen", seen)


@scenario
def prog_effects_barrier_waits_for_taps(ctx):
  """``jax.effects_barrier()`` after a tapping jit."""
  seen = []
  f = jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(int(a)), x + 1) * 2)
  for i in range(3):
    f(np.int32(i))
  jax.effects_barrier()
  ctx.log("seen", seen)


@scenario
def prog_aot_lower_compile_call(ctx):
  """``jit(f).lower(x).compile()`` then calling the compiled function."""
  f = jax.jit(lambda x: hcb.id_tap(ctx.tap, x * 3) + 1)
  x = np.arange(2, dtype=np.int32)
  c = f.lower(x).compile()
  c(x)
  return c(x + 1)


@scenario
def prog_call_fails_twice_same_jit(ctx):
  """The same jitted call failing on two runs: the exception types."""

  def host(a):
    raise ValueError(f"host failed on {a.tolist()}")

  f = jax.jit(lambda x: hcb.call(host, x, result_shape=x))
  for i in range(3):
    _failing_call(ctx, f, np.int32(i))


@scenario
def prog_call_fails_in_scan_step(ctx):
  """A call in a scan that fails at step 2 of 4."""

  def host(a):
    if int(a) == 2:
      raise ValueError("step 2")
    ctx.log("host", int(a))
    return a

  return _failing_call(
    ctx,
    jax.jit(
      lambda: jax.lax.scan(
        lambda c, i: (c, hcb.call(host, i, result_shape=i)),
        0,
        jnp.arange(4),
      )
    ),
  )


@scenario
def prog_print_to_stderr_stream(ctx):
  """``output_stream=sys.stderr`` (redirected here)."""
  import contextlib
  import sys

  with contextlib.redirect_stderr(ctx):
    jax.jit(lambda x: hcb.id_print(x, output_stream=sys.stderr, what="e"))(
      np.int32(5)
    )
    hcb.barrier_wait()


@scenario
def prog_print_what_with_newline(ctx):
  """A ``what`` with a newline and unicode in it."""
  jax.jit(lambda x: hcb.id_print(x, what="line1\nline2 ∂"))(np.int32(1))


@scenario
def prog_vmap_batch_size_one_mixed(ctx):
  """vmap over a batch of one with an unbatched leaf in the tap."""
  return jax.vmap(lambda x, y: hcb.id_tap(ctx.tap, (x, y)), in_axes=(0, None))(
    np.arange(1, dtype=F32), np.int32(4)
  )


@scenario
def prog_deep_combo_jit_vmap_grad_scan_cond(ctx):
  """jit(vmap(grad)) of a scan whose body has a cond with a print in one
  branch and a tap in the other."""

  def f(x):
    def body(c, i):
      c = jax.lax.cond(
        i % 2 == 0,
        lambda v: hcb.id_print(v * 2, what="even"),
        lambda v: hcb.id_tap(ctx.tapper("odd"), v + 1),
        c,
      )
      return c, None

    return jax.lax.scan(body, x, jnp.arange(3))[0]

  return jax.jit(jax.vmap(jax.grad(f)))(np.array([1, 2], F32))


@scenario
def prog_custom_jvp_print_under_vmap_jit(ctx):
  """A custom_jvp whose rule prints the tangent, under jit(vmap(jvp))."""

  @jax.custom_jvp
  def f(x):
    return x * x

  @f.defjvp
  def _(p, t):
    (x,), (dx,) = p, t
    dx = hcb.id_print(dx, what="tangent")
    return x * x, 2 * x * dx

  return jax.jit(jax.vmap(lambda x: jax.jvp(f, (x,), (x + 1,))))(
    np.array([1, 2], F32)
  )


@scenario
def prog_while_batched_pred_body_tap(ctx):
  """vmap of a while_loop with per-element trip counts and a tap of
  ``(i, x)`` in the body."""

  def f(n):
    return jax.lax.while_loop(
      lambda c: c[0] < n,
      lambda c: hcb.id_tap(ctx.tap, (c[0] + 1, c[1] * 2)),
      (0, F32(1)),
    )

  return jax.vmap(f)(np.array([1, 3], np.int32))


@scenario
def prog_fori_dynamic_bound_print_jit(ctx):
  """A fori_loop with a traced upper bound (a while loop) printing."""
  return jax.jit(
    lambda n: jax.lax.fori_loop(
      0, n, lambda i, c: hcb.id_print(c + i, what="c"), 0
    )
  )(np.int32(3))


@scenario
def prog_checkpoint_policy_saveable_print(ctx):
  """remat with ``checkpoint_dots`` policy and a print, under grad."""

  def f(w, x):
    h = jnp.tanh(x @ w) * 0 + x @ w
    h = hcb.id_print(h, what="h")
    return jnp.sum(h * h)

  g = jax.checkpoint(f, policy=jax.checkpoint_policies.checkpoint_dots)
  return jax.grad(g)(np.eye(2, dtype=F32), np.ones((1, 2), F32))


@scenario
def prog_tap_in_pmap_of_scan_print_stream(ctx):
  """pmap of a scan printing to a StringIO with device."""
  out = io.StringIO()
  jax.pmap(
    lambda x: jax.lax.scan(
      lambda c, v: (
        c + hcb.id_print(v, output_stream=out, tap_with_device=True),
        None,
      ),
      0,
      x,
    )[0]
  )(np.arange(4, dtype=np.int32).reshape(2, 2))
  hcb.barrier_wait()
  ctx.log("lines", sorted(out.getvalue().splitlines()))


@scenario
def prog_jit_static_tap_function_argument(ctx):
  """A tap function passed as a static argument to jit."""

  @functools.partial(jax.jit, static_argnums=0)
  def f(tapf, x):
    return hcb.id_tap(tapf, x)

  f(ctx.tapper("one"), np.int32(1))
  return f(ctx.tapper("two"), np.int32(2))


@scenario(
  ours=(
    "README (deliberate differences): tap_with_device/call_with_device "
    "name the device that ran the callback; legacy 0.4.30 on CPU said "
    "device 0 for an operand committed to device 1"
  ),
  expect=(
    "tap: np.ndarray(int32, (), 5) transforms=() device=cpu:1\n"
    "result: jax.Array(int32, (), weak=False, 5)\n"
  ),
)
def prog_tap_of_jnp_array_eager_committed(ctx):
  """Eager tap with device of an array committed to device 1."""
  x = jax.device_put(np.int32(5), jax.devices()[1])
  return hcb.id_tap(ctx.tap, x, tap_with_device=True)


@scenario(
  ours=(
    "README (deliberate differences): tap_with_device/call_with_device "
    "name the device that ran the callback; legacy 0.4.30 on CPU said "
    "device 0 for an operand committed to device 1"
  ),
  expect=(
    "device cpu:1\n"
    "result device {cpu:1}\n"
    "result: jax.Array(int32, (), weak=False, 6)\n"
  ),
)
def prog_call_eager_on_device_1(ctx):
  """Eager call with device of an array committed to device 1."""

  def host(a, *, device):
    ctx.log("device", device)
    return a + 1

  x = jax.device_put(np.int32(5), jax.devices()[1])
  r = hcb.call(host, x, result_shape=x, call_with_device=True)
  ctx.log("result device", r.devices())
  return r


# ---------------------------------------------------------------- batch 5


@scenario
def prog_id_tap_builtin_print(ctx):
  """``id_tap(print, x)``: the quickest debugging tap, under jit and vmap."""
  jax.jit(lambda x: hcb.id_tap(print, x * 2))(np.arange(3, dtype=np.int32))
  hcb.barrier_wait()
  return jax.vmap(lambda x: hcb.id_tap(print, x + 1))(
    np.arange(2, dtype=np.int32)
  )


@scenario
def prog_call_numpy_ufuncs(ctx):
  """NumPy functions as call callbacks: ``np.sin``, ``np.sum``,
  ``np.linalg.norm`` (float32 in, float32 out)."""
  x = np.array([0.0, 0.5], F32)

  def f(x):
    return (
      hcb.call(np.sin, x, result_shape=x) * 0 + x,
      hcb.call(np.sum, x, result_shape=jax.ShapeDtypeStruct((), F32)),
      hcb.call(np.linalg.norm, x * 0 + 2, result_shape=F32(0)) ** 2,
    )

  return jax.jit(f)(x)


@scenario
def prog_call_numpy_mean_of_ints(ctx):
  """``call(np.mean, ints, result_shape=0.0)``: NumPy returns float64."""
  return _failing_call(
    ctx,
    jax.jit(lambda x: hcb.call(np.mean, x, result_shape=0.0)),
    np.arange(4, dtype=np.int32),
  )


@scenario
def prog_host_function_with_custom_jvp(ctx):
  """A host function with a custom_jvp whose tangent is another host
  call, under grad and jit(grad)."""

  @jax.custom_jvp
  def host_sq(x):
    return hcb.call(lambda a: a * a, x, result_shape=x)

  @host_sq.defjvp
  def _(p, t):
    (x,), (dx,) = p, t
    d = hcb.call(lambda a: 2 * a, x, result_shape=x)
    return host_sq(x), d * dx

  return jax.grad(host_sq)(F32(3)), jax.jit(jax.grad(host_sq))(F32(1.5))


@scenario
def prog_host_function_with_custom_vjp_vmap(ctx):
  """A host function with a custom_vjp (fwd and bwd both call the host),
  under vmap of grad: call under vmap."""

  @jax.custom_vjp
  def host_cube(x):
    return hcb.call(lambda a: a**3, x, result_shape=x)

  def fwd(x):
    return host_cube(x), x

  def bwd(x, g):
    return (hcb.call(lambda a: 3 * a * a, x, result_shape=x) * g,)

  host_cube.defvjp(fwd, bwd)
  return jax.vmap(jax.grad(host_cube))(np.array([1, 2], F32))


@scenario
def prog_host_function_custom_vjp_grad(ctx):
  """The same custom_vjp host function under jit(grad) in a scan."""

  @jax.custom_vjp
  def host_cube(x):
    return hcb.call(lambda a: a**3, x, result_shape=x)

  def fwd(x):
    return host_cube(x), x

  def bwd(x, g):
    return (hcb.call(lambda a: 3 * a * a, x, result_shape=x) * g,)

  host_cube.defvjp(fwd, bwd)

  def f(x):
    return jax.lax.scan(lambda c, _: (host_cube(c), None), x, None, length=2)[0]

  return jax.jit(jax.grad(f))(F32(1))


@scenario
def prog_hessian_of_call(ctx):
  """hessian of a function with a call: legacy's jvp error."""
  return jax.hessian(lambda x: hcb.call(lambda a: a, x, result_shape=x))(F32(1))


@scenario(
  ours=(
    "spec/README.md: what legacy could not do hostcb does; legacy's "
    "rewrite of jitted code for its tokens had no rule for "
    "custom_linear_solve (NotImplementedError: outfeed rewrite "
    "custom_linear_solve)"
  ),
  expect="matvec taps 3 transforms [()]\nx [0.0909, 0.6364]\n",
)
def prog_cg_with_tapped_matvec(ctx):
  """``jax.scipy.sparse.linalg.cg`` whose matvec taps how often it runs."""
  calls = []
  a = np.array([[4, 1], [1, 3]], F32)

  def matvec(v):
    hcb.id_tap(lambda x, t: calls.append(t), v)
    return a @ v

  x, _ = jax.jit(lambda b: jax.scipy.sparse.linalg.cg(matvec, b, maxiter=3))(
    np.array([1, 2], F32)
  )
  hcb.barrier_wait()
  ctx.log("matvec taps", len(calls), "transforms", sorted(set(calls)))
  ctx.log("x", [round(float(v), 4) for v in x])


@scenario
def prog_custom_linear_solve_grad_taps(ctx):
  """grad through ``lax.custom_linear_solve`` with a tapped matvec."""
  calls = []
  a = np.array([[2, 0], [0, 4]], F32)

  def matvec(v):
    return hcb.id_tap(lambda x, t: calls.append((x.tolist(), t)), a @ v)

  def solve(mv, b):
    return b / np.diag(a)

  def f(b):
    x = jax.lax.custom_linear_solve(matvec, b, solve, symmetric=True)
    return jnp.sum(x * x)

  g = jax.grad(f)(np.array([1, 2], F32))
  hcb.barrier_wait()
  ctx.log("calls", calls)
  return g


@scenario
def prog_odeint_tapped_dynamics(ctx):
  """``odeint`` with a dynamics function that taps; counts and transforms
  of the taps, forward and under grad (values rounded: XLA's kernels)."""
  from jax.experimental.ode import odeint

  seen = []

  def dyn(y, t):
    y = hcb.id_tap(lambda a, tr: seen.append(tr), y)
    return -y

  def final(y0):
    return odeint(dyn, y0, jnp.array([0.0, 0.5], F32))[-1]

  y = jax.jit(final)(F32(1))
  hcb.barrier_wait()
  ctx.log("forward taps > 0:", len(seen) > 0, sorted(set(seen)))
  n = len(seen)
  g = jax.jit(jax.grad(final))(F32(1))
  hcb.barrier_wait()
  ctx.log("grad taps > 0:", len(seen) > n, sorted(set(seen[n:])))
  ctx.log("y", round(float(y), 4), "g", round(float(g), 4))


@scenario
def prog_bfgs_minimize_print_objective(ctx):
  """``jax.scipy.optimize.minimize`` (BFGS) of an objective that taps its
  value; the number of taps and the minimum (rounded)."""
  seen = []

  def obj(w):
    v = jnp.sum((w - jnp.array([1.0, 2.0])) ** 2)
    return hcb.id_tap(lambda a, t: seen.append(t), v)

  r = jax.jit(lambda w: jax.scipy.optimize.minimize(obj, w, method="BFGS").x)(
    np.zeros(2, F32)
  )
  hcb.barrier_wait()
  ctx.log("taps", len(seen) > 0, sorted(set(seen)))
  ctx.log("x", np.round(np.asarray(r), 3).tolist())


@scenario(unordered=True)
def prog_pmap_broadcast_arg_tap(ctx):
  """pmap with ``in_axes=(0, None)``: the broadcast argument is tapped on
  each device."""
  return jax.pmap(
    lambda x, s: hcb.id_tap(ctx.tap, (x, s), tap_with_device=True),
    in_axes=(0, None),
  )(np.arange(2, dtype=np.int32), np.float32(0.5))


@scenario(unordered=True)
def prog_pmap_all_gather_print(ctx):
  """pmap printing an all_gather result on each device."""
  return jax.pmap(
    lambda x: hcb.id_print(
      jax.lax.all_gather(x, "i"), what="gathered", tap_with_device=True
    ),
    axis_name="i",
  )(np.arange(2, dtype=np.int32))


@scenario(
  ours=(
    "README (deliberate differences): tap_with_device names the device "
    "that ran the tap; legacy 0.4.30 said device 0 for a pmap over "
    "device 1 alone"
  ),
  expect=(
    "tap: np.ndarray(int32, (), 0) transforms=() device=cpu:1\n"
    "result: jax.Array(int32, (1,), weak=False, [0])\n"
  ),
)
def prog_pmap_one_device_1(ctx):
  """pmap over ``devices=[device 1]`` with tap_with_device."""
  return jax.pmap(
    lambda x: hcb.id_tap(ctx.tap, x, tap_with_device=True),
    devices=jax.devices()[1:2],
  )(np.arange(1, dtype=np.int32))


@scenario(unordered=True)
def prog_pmap_static_broadcasted(ctx):
  """pmap with a static broadcasted argument used in the print."""
  f = jax.pmap(
    lambda x, k: hcb.id_print(x * k, what=f"times {k}"),
    static_broadcasted_argnums=1,
  )
  f(np.arange(2, dtype=np.int32), 3)
  hcb.barrier_wait()
  return f(np.arange(2, dtype=np.int32), 4)


@scenario
def prog_vmap_in_axes_dict_prefix(ctx):
  """vmap with a dict in_axes prefix: batched and unbatched leaves."""
  return jax.vmap(
    lambda p: hcb.id_tap(ctx.tap, p), in_axes=({"w": 0, "b": None},)
  )({"w": np.arange(4, dtype=F32).reshape(2, 2), "b": F32(1)})


@scenario
def prog_tap_tree_util_partial(ctx):
  """A ``jax.tree_util.Partial`` as the tap function."""

  def tap(tag, arg, transforms):
    ctx.log("tag", tag, arg.tolist(), transforms)

  return jax.jit(lambda x: hcb.id_tap(jax.tree_util.Partial(tap, "p"), x))(
    np.arange(2, dtype=np.int32)
  )


@scenario
def prog_tap_varargs_function(ctx):
  """A tap function taking ``*args, **kwargs``."""

  def tap(*args, **kwargs):
    ctx.log("args", len(args), "kwargs", sorted(kwargs))

  jax.jit(lambda x: hcb.id_tap(tap, x, tap_with_device=True))(np.int32(1))
  return jax.jit(lambda x: hcb.id_tap(tap, x))(np.int32(2))


# ---------------------------------------------------------------- inline


_INLINE_BROKEN = (
  "legacy 0.4.30's inline mode failed every eager tap and call with "
  "TypeError: _outside_call_run_callback() got an unexpected keyword "
  "argument 'device_index'; hostcb runs them in the calling thread with "
  "the operands that the host sees outside inline mode"
)


def _inline(f):
  """Runs ``f()`` with ``jax_host_callback_inline`` on, then off again."""
  jax.config.update("jax_host_callback_inline", True)
  try:
    return f()
  finally:
    jax.config.update("jax_host_callback_inline", False)


@scenario(
  ours=_INLINE_BROKEN,
  expect=(
    "tap: (np.ndarray(float32, (), 3.0), np.ndarray(int32, (), 2), np.ndarray(float32, (), 0.5), np.ndarray(int32, (2,), [0, 1]), np.ndarray(float32, (2,), [1.0, 1.0])) transforms=()\n"
    "result: (jax.Array(float32, (), weak=True, 3.0), jax.Array(int32, (), weak=True, 2), jax.Array(float32, (), weak=False, 0.5), jax.Array(int32, (2,), weak=False, [0, 1]), jax.Array(float32, (2,), weak=False, [1.0, 1.0]))\n"
  ),
)
def prog_inline_eager_tap_values(ctx):
  """Inline eager taps: what the tap function gets and id_tap returns for
  Python numbers, NumPy values and JAX arrays."""
  return _inline(
    lambda: hcb.id_tap(
      ctx.tap,
      (3.0, 2, np.float64(0.5), np.arange(2, dtype=np.int64), jnp.ones(2)),
    )
  )


@scenario(
  ours=_INLINE_BROKEN,
  expect=(
    "tap: np.ndarray(int32, (), 1) transforms=() device=cpu:0\n"
    "result: jax.Array(int32, (), weak=False, 1)\n"
  ),
)
def prog_inline_eager_tap_with_device(ctx):
  """An inline eager tap with the device."""
  return _inline(lambda: hcb.id_tap(ctx.tap, np.int32(1), tap_with_device=True))


@scenario(
  ours=_INLINE_BROKEN,
  expect=("what: inline\n{ a=1.5 b=[0 1 2] }\nafter\n"),
)
def prog_inline_eager_print(ctx):
  """An inline eager id_print of a dict, then a Python print: in order."""

  def run():
    hcb.id_print({"a": 1.5, "b": np.arange(3)}, what="inline")
    print("after")

  _inline(run)


@scenario(
  ours=_INLINE_BROKEN,
  expect=("host got ndarray 1.5\nresult: np.ndarray(float32, (), 3.0)\n"),
)
def prog_inline_eager_call(ctx):
  """An inline eager call: the host's argument and the returned types."""

  def host(a):
    ctx.log("host got", type(a).__name__, a)
    return np.float64(a) * 2

  return _inline(lambda: hcb.call(host, 1.5, result_shape=1.5))


@scenario(
  ours=_INLINE_BROKEN,
  expect=(
    "host got ndarray\n"
    "result: (np.ndarray(int32, (3,), [1, 2, 3]), np.ndarray(int32, (), 3))\n"
  ),
)
def prog_inline_eager_call_array(ctx):
  """An inline eager call on a JAX array with a tuple result."""

  def host(a):
    ctx.log("host got", type(a).__name__)
    return a + 1, a.sum()

  return _inline(
    lambda: hcb.call(
      host,
      jnp.arange(3, dtype=np.int32),
      result_shape=(
        jax.ShapeDtypeStruct((3,), np.int32),
        jax.ShapeDtypeStruct((), np.int32),
      ),
    )
  )


@scenario(
  ours=_INLINE_BROKEN,
  expect=("id_tap raised ValueError inline boom\nbarrier ok\n"),
)
def prog_inline_eager_tap_raises(ctx):
  """An inline eager tap that raises: where the error shows."""

  def bad(a, t):
    raise ValueError("inline boom")

  def run():
    try:
      hcb.id_tap(bad, np.int32(1))
      ctx.log("id_tap returned")
    except Exception as e:  # noqa: BLE001  (recorded)
      ctx.log("id_tap raised", type(e).__name__, e)
    try:
      hcb.barrier_wait()
      ctx.log("barrier ok")
    except Exception as e:  # noqa: BLE001  (recorded)
      ctx.log("barrier raised", type(e).__name__)

  _inline(run)


@scenario(
  ours=_INLINE_BROKEN,
  expect=("call raised KeyError 'inline call'\nbarrier ok\n"),
)
def prog_inline_eager_call_raises(ctx):
  """An inline eager call that raises."""

  def bad(a):
    raise KeyError("inline call")

  def run():
    try:
      hcb.call(bad, np.int32(1), result_shape=np.int32(0))
    except Exception as e:  # noqa: BLE001  (recorded)
      ctx.log("call raised", type(e).__name__, e)
    try:
      hcb.barrier_wait()
      ctx.log("barrier ok")
    except Exception as e:  # noqa: BLE001  (recorded)
      ctx.log("barrier raised", type(e).__name__)

  _inline(run)


@scenario(
  ours=_INLINE_BROKEN,
  expect=(
    "call raised TypeError Callback func <callback> should have returned a result with abstract values ShapedArray(int32[]) but returned ShapedArray(bool[])\n"
  ),
)
def prog_inline_eager_call_wrong_dtype(ctx):
  """An inline eager call whose host returns the wrong dtype."""

  def run():
    try:
      hcb.call(lambda a: a > 0, np.int32(1), result_shape=np.int32(0))
    except Exception as e:  # noqa: BLE001  (recorded)
      ctx.log("call raised", type(e).__name__, e)
    try:
      hcb.barrier_wait()
    except hcb.CallbackException:  # see _failing_call
      pass

  _inline(run)


@scenario(
  ours=_INLINE_BROKEN,
  expect=(
    "tap[jit]: np.ndarray(int32, (), 4) transforms=()\n"
    "tap[vmap]: np.ndarray(int32, (2,), [1, 2]) transforms=(('batch', {'batch_dims': (0,)}),)\n"
    "result: (jax.Array(int32, (), weak=False, 4), jax.Array(int32, (2,), weak=False, [1, 2]))\n"
  ),
)
def prog_inline_under_jit_and_vmap(ctx):
  """Inline mode under jit and eager vmap: transforms and results."""

  def run():
    a = jax.jit(lambda x: hcb.id_tap(ctx.tapper("jit"), x * 2))(np.int32(2))
    hcb.barrier_wait()  # the jitted tap is not inline: it runs on its own
    b = jax.vmap(lambda x: hcb.id_tap(ctx.tapper("vmap"), x + 1))(
      np.arange(2, dtype=np.int32)
    )
    return a, b

  return _inline(run)


@scenario(
  ours=_INLINE_BROKEN,
  expect=(
    "tap: np.ndarray(float32, (), 2.25) transforms=()\n"
    "result: jax.Array(float32, (), weak=False, 6.0)\n"
  ),
)
def prog_inline_eager_grad(ctx):
  """Inline mode, eager grad of a tapping function (JVP of the tap)."""
  return _inline(
    lambda: jax.grad(lambda x: hcb.id_tap(ctx.tap, x * x) * 2)(F32(1.5))
  )


# ---------------------------------------------------------------- config


def _config_try(ctx, name, value):
  try:
    jax.config.update(name, value)
    ctx.log("set", repr(value), "->", repr(jax.config.values.get(name)))
  except Exception as e:  # noqa: BLE001  (recorded)
    ctx.log("set", repr(value), "raised", type(e).__name__ + ":", e)


_QUEUE = "jax_host_callback_max_queue_byte_size"


@scenario
def prog_config_queue_byte_size(ctx):
  """``jax_host_callback_max_queue_byte_size`` set to a larger and to the
  smallest allowed int; taps still run."""
  old = jax.config.values.get(_QUEUE)
  try:
    for v in [int(1e9), int(16e6)]:
      _config_try(ctx, _QUEUE, v)
    return jax.jit(lambda x: hcb.id_tap(ctx.tap, x))(np.int32(1))
  finally:
    jax.config.update(_QUEUE, old)


@scenario(
  ours=(
    "legacy's option declared its lower bound of 16e6 bytes, which "
    "jax.config.update did not check; hostcb checks it (the engine's "
    "queue holds whole taps)"
  ),
  expect=(
    "set 1000 raised ValueError: jax_host_callback_max_queue_byte_size "
    "must be at least 16000000 bytes; got 1000\n"
  ),
)
def prog_config_queue_byte_size_too_small(ctx):
  """``jax_host_callback_max_queue_byte_size`` set below 16e6 bytes."""
  old = jax.config.values.get(_QUEUE)
  try:
    _config_try(ctx, _QUEUE, 1000)
  finally:
    jax.config.update(_QUEUE, old)


@scenario(
  ours=(
    "JAX's own change: the int options of JAX 0.10 reject a float in "
    "jax.config.update (JAX 0.4.30 stored it); hostcb.config.update "
    "takes it"
  ),
  expect=(
    "set 500000000.0 raised ValueError: new int config value must be None "
    "or of type int, got 500000000.0 of type <class 'float'>\n"
  ),
)
def prog_config_queue_byte_size_float(ctx):
  """``jax_host_callback_max_queue_byte_size`` set to ``5e8``, a float."""
  old = jax.config.values.get(_QUEUE)
  try:
    _config_try(ctx, _QUEUE, 5e8)
  finally:
    jax.config.update(_QUEUE, old)


@scenario
def prog_config_inline_values(ctx):
  """``jax_host_callback_inline`` set to True and False, and read back (not
  1: JAX 0.10's bool options store True, JAX 0.4.30's stored 1)."""
  name = "jax_host_callback_inline"
  try:
    for v in [True, False]:
      _config_try(ctx, name, v)
  finally:
    jax.config.update(name, False)


@scenario
def prog_config_read_defaults(ctx):
  """The two options' default values in ``jax.config.values``."""
  ctx.log(repr(jax.config.values.get("jax_host_callback_inline")))
  ctx.log(repr(jax.config.values.get(_QUEUE)))


# ---------------------------------------------------------------- batch 6


@scenario
def prog_alternating_jits_order(ctx):
  """Two jitted functions with taps called alternately, with eager taps
  between, and no barrier until the end: the taps keep dispatch order."""
  f = jax.jit(lambda x: hcb.id_tap(ctx.tapper("f"), x + 1))
  g = jax.jit(lambda x: hcb.id_tap(ctx.tapper("g"), x * 2))
  x = np.int32(0)
  for _ in range(3):
    x = f(x)
    hcb.id_tap(ctx.tapper("eager"), x)
    x = g(x)
  return x


@scenario
def prog_taps_of_constants(ctx):
  """Taps and prints of constants under jit: Python numbers, a NumPy
  array, a closed-over JAX array, in a cond without operands and in a
  scan."""
  c = jnp.arange(2, dtype=np.int32)

  def f(p):
    hcb.id_tap(ctx.tapper("py"), 3)
    hcb.id_tap(ctx.tapper("np"), np.array([1.5, 2.5], F32))
    hcb.id_tap(ctx.tapper("closed"), c)
    jax.lax.cond(
      p, lambda: hcb.id_print(7, what="t"), lambda: hcb.id_print(8, what="f")
    )
    jax.lax.scan(
      lambda carry, _: (hcb.id_tap(ctx.tapper("scan"), 0.5) * carry, None),
      1.0,
      None,
      length=2,
    )
    return p

  return jax.jit(f)(True)


@scenario
def prog_many_leaves_tap(ctx):
  """A dict of 300 leaves tapped under jit and under vmap."""
  d = {f"k{i:03d}": np.int32(i) for i in range(300)}
  seen = []

  def tap(a, t):
    seen.append((len(a), sum(int(np.sum(v)) for v in a.values()), t[:1]))

  jax.jit(lambda d: hcb.id_tap(tap, d))(d)
  jax.vmap(lambda d: hcb.id_tap(tap, d))(
    {k: np.stack([v, v]) for k, v in d.items()}
  )
  hcb.barrier_wait()
  ctx.log("seen", [(n, s, [tr[0] for tr in t]) for n, s, t in seen])


@scenario
def prog_zero_trip_loops(ctx):
  """A scan of length 0 and a while_loop that never runs: no taps."""
  a = jax.jit(
    lambda xs: jax.lax.scan(
      lambda c, x: (c + hcb.id_tap(ctx.tapper("scan"), x), None), 0.0, xs
    )[0]
  )(np.zeros(0, F32))
  b = jax.jit(
    lambda n: jax.lax.while_loop(
      lambda i: i < n, lambda i: hcb.id_tap(ctx.tapper("while"), i + 1), 0
    )
  )(np.int32(0))
  return a, b


@scenario
def prog_alternating_devices_order(ctx):
  """Computations alternating between device 0 (values from 0) and device 1
  (values from 100), each with a tap, then a barrier: each device's order
  (taps run asynchronously, one thread per device, so the order between
  the devices' taps is not kept; legacy 0.4.30 ran them synchronously)."""
  seen = []
  f = jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(int(a)), x + 1))
  x0 = jax.device_put(np.int32(0), jax.devices()[0])
  x1 = jax.device_put(np.int32(100), jax.devices()[1])
  for _ in range(3):
    x0 = f(x0)
    x0.block_until_ready()
    x1 = f(x1)
    x1.block_until_ready()
  hcb.barrier_wait()
  ctx.log("device 0", [v for v in seen if v < 100])
  ctx.log("device 1", [v for v in seen if v >= 100])


# ---------------------------------------------------------------- formatting


def _print_each(values, **kw):
  """Prints each value from one jitted function, in order."""
  leaves = list(values)

  def f(*a):
    for v in a:
      hcb.id_print(v, **kw)

  jax.jit(f)(*leaves)


@scenario
def prog_print_float32_scalars(ctx):
  """float32 scalars around NumPy's switches between positional and
  scientific notation, and special values (not 1e-4 and 1e7: NumPy 2
  writes those float32 0-d arrays otherwise than NumPy 1 did)."""
  _print_each(
    F32(v)
    for v in [
      0.0,
      -0.0,
      1.0,
      1.0000001,
      0.1,
      9.9999e-5,
      1e-5,
      123456.79,
      1e15,
      1e16,
      1.5e16,
      3.4e38,
      -1e-30,
      np.nan,
      np.inf,
      -np.inf,
      1 / 3,
      2 / 3,
    ]
  )


@scenario
def prog_print_int_rows_widths(ctx):
  """int32 rows around the 75-column line width, with negatives."""
  _print_each(
    [
      np.arange(n, dtype=np.int32) * k - (k if neg else 0)
      for n, k, neg in [
        (24, 1, False),
        (25, 1, False),
        (26, 1, False),
        (18, 11, False),
        (19, 11, False),
        (20, 11, True),
        (15, 1000, True),
        (16, 1000, True),
        (13, 100000, True),
      ]
    ]
  )


@scenario
def prog_print_extreme_ints(ctx):
  """int8/uint8/int32/uint32 extremes in rows and scalars."""
  _print_each(
    [
      np.array([-128, 127, 0], np.int8),
      np.array([0, 255], np.uint8),
      np.array([-(2**31), 2**31 - 1], np.int32),
      np.array([0, 2**32 - 1], np.uint32),
      np.int32(-(2**31)),
      np.uint32(2**32 - 1),
    ]
  )


@scenario
def prog_print_bool_rows(ctx):
  """bool rows: short, at the line width, longer."""
  _print_each(
    [
      np.array([True]),
      np.array([False, True]),
      np.arange(12) % 3 == 0,
      np.arange(13) % 2 == 0,
      np.arange(30) % 2 == 0,
      np.bool_(False),
    ]
  )


@scenario
def prog_print_float_rows(ctx):
  """float32 rows mixing magnitudes (the scientific switch of a row)."""
  _print_each(
    [
      np.array([1, 2.5, 1e-5], F32),
      np.array([1e8, 1], F32),
      np.array([0.1, 0.25, 100], F32),
      np.array([np.nan, 1, -np.inf], F32),
      np.arange(30, dtype=F32) / 7,
    ]
  )


@scenario
def prog_print_threshold_boundaries(ctx):
  """Arrays of exactly ``threshold`` and ``threshold + 1`` elements."""
  _print_each([np.arange(10, dtype=np.int32)], threshold=10)
  _print_each([np.arange(11, dtype=np.int32)], threshold=10)
  _print_each([np.arange(7, dtype=F32)], threshold=6)
  _print_each([np.arange(12, dtype=np.int32).reshape(3, 4)], threshold=11)


# ---------------------------------------------------------------- nesting


@scenario
def prog_call_host_runs_tapping_jit_and_barrier(ctx):
  """A call's host function runs a jitted function that taps, then
  barrier_wait, then returns."""
  inner = jax.jit(lambda a: hcb.id_tap(ctx.tapper("inner"), a * 2))

  def host(a):
    r = inner(a)
    hcb.barrier_wait()
    ctx.log("host after barrier", np.asarray(r).tolist())
    return a + 1

  jax.jit(lambda x: hcb.id_tap(ctx.tapper("first"), x))(np.int32(1))
  return jax.jit(lambda x: hcb.call(host, x, result_shape=x))(np.int32(5))


@scenario(
  ours=(
    "docs/guide.md (Tap functions may tap and call): a tap made by a tap "
    "function is queued behind the taps before it and runs after that "
    "function (the barrier waits for it); legacy 0.4.30 ran CPU taps "
    "synchronously, so the inner tap ran first"
  ),
  expect=(
    "outer done: [0, 2]\n"
    "tap[inner]: np.ndarray(int32, (2,), [0, 2]) transforms=()\n"
    "result: jax.Array(int32, (2,), weak=False, [0, 1])\n"
  ),
)
def prog_tap_function_runs_tapping_jit(ctx):
  """A tap function that runs a jitted function with its own tap."""
  inner = jax.jit(lambda a: hcb.id_tap(ctx.tapper("inner"), a * 2))

  def outer(a, t):
    ctx.log("outer done:", np.asarray(inner(a)).tolist())

  return jax.jit(lambda x: hcb.id_tap(outer, x))(np.arange(2, dtype=np.int32))


@scenario(
  ours=(
    "docs/guide.md: barrier_wait cannot be called from a tap function (it "
    "would wait for that function): it raises RuntimeError, which the "
    "next barrier_wait reports; legacy 0.4.30's barrier waited for nothing "
    "on CPU"
  ),
  expect=(
    "raised CallbackException: There were exceptions during callback "
    "processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "RuntimeError: barrier_wait() was called from a tap function; it would "
    "wait for that function itself. Call it from the thread that runs the "
    "computation.\n"
    "\n"
  ),
)
def prog_tap_function_calls_barrier_wait(ctx):
  """A tap function that calls barrier_wait."""

  def tap(a, t):
    hcb.barrier_wait()
    ctx.log("tap after barrier", a.tolist())

  jax.jit(lambda x: hcb.id_tap(tap, x))(np.int32(1))
  hcb.barrier_wait()


# ---------------------------------------------------------------- batch 7


@scenario
def prog_checkify_with_taps(ctx):
  """A checkify'd function that taps and checks its input."""
  from jax.experimental import checkify

  def f(x):
    x = hcb.id_tap(ctx.tap, x * 2)
    checkify.check(jnp.all(x > 0), "x must be positive")
    return hcb.id_print(x + 1, what="after check")

  err, out = jax.jit(checkify.checkify(f))(np.array([1, 2], F32))
  hcb.barrier_wait()
  ctx.log("error", err.get())
  err, out = jax.jit(checkify.checkify(f))(np.array([-1, 2], F32))
  hcb.barrier_wait()
  ctx.log("error", err.get())
  return out


@scenario
def prog_print_prng_keys(ctx):
  """id_print of raw PRNGKeys under jit (not split ones: JAX changed how
  it splits by default)."""
  jax.jit(lambda k: hcb.id_print((k, k + 1), what="keys"))(
    jax.random.PRNGKey(3)
  )


@scenario
def prog_tap_bfloat16_under_grad(ctx):
  """A bfloat16 value tapped under jit(grad)."""

  def f(x):
    y = hcb.id_tap(ctx.tap, x.astype(jnp.bfloat16) * 2)
    return jnp.sum(y.astype(F32) ** 2)

  return jax.jit(jax.grad(f))(np.array([0.5, 1.5], F32))


@scenario
def prog_id_tap_positional_extra(ctx):
  """``id_tap(f, x, y)``: a third positional argument."""
  return hcb.id_tap(ctx.tap, np.int32(1), np.int32(2))


@scenario
def prog_scan_pytree_xs_unrolled(ctx):
  """A fully unrolled scan over a pytree of xs, tapping each slice."""
  xs = {"a": np.arange(3, dtype=np.int32), "b": np.ones((3, 2), F32)}
  return jax.jit(
    lambda xs: jax.lax.scan(
      lambda c, x: (c + hcb.id_tap(ctx.tap, x)["a"], None), 0, xs, unroll=True
    )[0]
  )(xs)


@scenario(unordered=True)
def prog_tap_in_vmap_of_pmap(ctx):
  """vmap of a pmap whose function taps with its device."""
  return jax.vmap(
    jax.pmap(lambda x: hcb.id_tap(ctx.tap, x * 2, tap_with_device=True))
  )(np.arange(4, dtype=np.int32).reshape(2, 2))


@scenario
def prog_call_missing_arg_and_print_positional(ctx):
  """``call(f)`` without its argument, and ``id_print(x, y)``."""
  for run in [
    lambda: hcb.call(lambda a: a),
    lambda: hcb.id_print(np.int32(1), np.int32(2)),
  ]:
    try:
      run()
    except TypeError as e:
      ctx.log("raised", e)


@scenario
def prog_call_host_reuses_its_buffer(ctx):
  """A host function that returns (and later overwrites) one buffer of
  its own: each result keeps the value it had when returned."""
  buf = np.zeros(2, F32)

  def host(a):
    buf[:] = a * 10
    return buf

  ys = jax.jit(
    lambda xs: jax.lax.scan(
      lambda c, x: (c, hcb.call(host, x, result_shape=x)), 0, xs
    )[1]
  )(np.arange(6, dtype=F32).reshape(3, 2))
  r1 = hcb.call(host, np.ones(2, F32), result_shape=np.ones(2, F32))
  r2 = jax.jit(lambda x: hcb.call(host, x, result_shape=x))(np.full(2, 2, F32))
  buf[:] = -1
  return ys, r1, r2


@scenario
def prog_call_host_returns_its_input(ctx):
  """A host function that returns its input array itself (and one that
  returns a view of it), in a loop."""

  def body(i, x):
    x = hcb.call(lambda a: a, x + 1, result_shape=x)
    return hcb.call(lambda a: a[::-1][::-1], x * 2, result_shape=x)

  return jax.jit(lambda x: jax.lax.fori_loop(0, 3, body, x))(
    np.arange(3, dtype=F32)
  )


@scenario
def prog_tap_function_keeps_arrays(ctx):
  """A tap function that keeps every array it gets, in a scan: each kept
  array keeps its own value."""
  kept = []
  jax.jit(
    lambda xs: jax.lax.scan(
      lambda c, x: (c + hcb.id_tap(lambda a, t: kept.append(a), x)[0], None),
      F32(0),
      xs,
    )
  )(np.arange(8, dtype=F32).reshape(4, 2))
  hcb.barrier_wait()
  ctx.log("kept", [k.tolist() for k in kept])


# ---------------------------------------------------------------- remat mixes


@scenario
def prog_remat_of_cond_with_taps_grad(ctx):
  """grad of a remat'd function whose cond branches tap their operand."""

  @jax.checkpoint
  def f(x):
    y = jax.lax.cond(
      x > 1,
      lambda v: hcb.id_tap(ctx.tapper("big"), v * v),
      lambda v: hcb.id_tap(ctx.tapper("small"), v + v),
      x,
    )
    return y * 3

  return jax.grad(f)(F32(2)), jax.grad(f)(F32(0.5))


@scenario
def prog_remat_static_argnums_tap(ctx):
  """``jax.remat`` with a static argument, tapping, under jit(grad)."""

  @functools.partial(jax.remat, static_argnums=(1,))
  def f(x, k):
    return hcb.id_tap(ctx.tapper(f"k={k}"), x * k) * x

  return jax.jit(jax.grad(lambda x: f(x, 2) + f(x, 3)))(F32(1.5))


@scenario
def prog_vjp_function_called_twice(ctx):
  """A vjp function (with a custom_vjp whose bwd taps) called twice."""

  @jax.custom_vjp
  def f(x):
    return x * 2

  f.defvjp(
    lambda x: (x * 2, x),
    lambda x, g: (hcb.id_tap(ctx.tapper("bwd"), (x, g))[1] * 2,),
  )
  y, vjp = jax.vjp(lambda x: f(hcb.id_tap(ctx.tapper("fwd"), x)), F32(1.5))
  return y, vjp(F32(1)), vjp(F32(0.5))


@scenario
def prog_remat_custom_vjp_fwd_tap(ctx):
  """A custom_vjp whose fwd taps, inside jax.checkpoint, under grad."""

  @jax.custom_vjp
  def f(x):
    return jnp.sin(x) * 0 + x * x

  f.defvjp(
    lambda x: (hcb.id_tap(ctx.tapper("fwd"), x * x), x),
    lambda x, g: (2 * x * g,),
  )
  return jax.grad(jax.checkpoint(lambda x: f(x) * 2))(F32(1.5))


@scenario
def prog_x64_print_scalars_and_rows(ctx):
  """With x64 on: float64 scalars and int64/uint64 rows printed."""
  jax.config.update("jax_enable_x64", True)
  try:
    vals = [
      np.float64(v)
      for v in [0.1, 1 / 3, 1e-4, 1e-5, 1e7, 1e16, 123456789.123, -0.0, np.nan]
    ] + [
      np.array([-(2**63), 2**63 - 1], np.int64),
      np.array([0, 2**64 - 1], np.uint64),
      np.arange(30, dtype=np.int64) * 10**9,
    ]
    _print_each(vals)
    hcb.barrier_wait()
  finally:
    jax.config.update("jax_enable_x64", False)


@scenario
def prog_import_styles(ctx):
  """The ways legacy programs imported the module and its functions."""
  import jax.experimental.host_callback as hcb2
  from jax.experimental.host_callback import barrier_wait, id_print

  import jax.experimental

  ctx.log("same module:", hcb2 is hcb)
  ctx.log("attribute:", jax.experimental.host_callback is hcb)
  ctx.log(
    "same functions:",
    id_print is hcb.id_print,
    barrier_wait is hcb.barrier_wait,
  )
  jax.jit(lambda x: id_print(x, what="imported"))(np.int32(1))
  barrier_wait()


@scenario
def prog_replicated_jit_tap_and_call(ctx):
  """A jit over 2 devices with a replicated operand and a sharded output:
  one tap and one call, each with the whole value."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  mesh = Mesh(jax.devices()[:2], ("d",))
  x = jax.device_put(np.arange(4, dtype=F32), NamedSharding(mesh, P()))

  def host(a, *, device):
    ctx.log("host", device, a.tolist())
    return a * 10

  def f(x):
    y = hcb.id_tap(ctx.tap, x + 1, tap_with_device=True)
    return hcb.call(host, y, result_shape=y, call_with_device=True)

  r = jax.jit(f, out_shardings=NamedSharding(mesh, P("d")))(x)
  hcb.barrier_wait()
  ctx.log("result sharding spec", tuple(r.sharding.spec))
  return r


@scenario
def prog_sharded_jit_scan_print_with_device(ctx):
  """A sharded jit running a scan that prints a reduction each step."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  mesh = Mesh(jax.devices()[:2], ("d",))
  x = jax.device_put(
    np.arange(8, dtype=np.int32).reshape(4, 2), NamedSharding(mesh, P("d"))
  )

  def f(x):
    def body(c, i):
      s = hcb.id_print(jnp.sum(x) * i, what="step", tap_with_device=True)
      return c + s, None

    return jax.lax.scan(body, 0, jnp.arange(2))[0]

  return jax.jit(f)(x)


@scenario
def prog_call_common_mistakes(ctx):
  """Common mistakes with call: no result_shape for a host that returns a
  value, a host without the ``device`` keyword, a non-callable."""
  x = np.arange(2, dtype=F32)
  _failing_call(ctx, jax.jit(lambda x: hcb.call(lambda a: a * 2, x)), x)
  _failing_call(
    ctx,
    jax.jit(
      lambda x: hcb.call(lambda a: a, x, result_shape=x, call_with_device=True)
    ),
    x,
  )
  _failing_call(
    ctx, jax.jit(lambda x: hcb.call("np.sin", x, result_shape=x)), x
  )
  _failing_call(
    ctx,
    jax.jit(lambda x: hcb.call(lambda a: None, x, result_shape=x)),
    x,
  )


@scenario
def prog_redirect_stdout_captures_prints(ctx):
  """``contextlib.redirect_stdout`` around jitted and eager id_prints (as
  tests of a program capture what it prints), without barrier_wait."""
  import contextlib

  f = jax.jit(lambda x: hcb.id_print(x * 2, what="captured"))
  for _ in range(3):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
      f(np.int32(1))
      hcb.id_print(np.int32(5), what="eager")
    ctx.log("captured", repr(buf.getvalue()))


@scenario
def prog_redirect_stdout_then_python_print(ctx):
  """A jitted id_print inside ``redirect_stdout`` followed by a Python
  print inside it: both captured, in order."""
  import contextlib

  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    jax.jit(lambda x: hcb.id_print(x, what="in"))(np.int32(1))
    print("python print")
  ctx.log("captured", repr(buf.getvalue()))


@scenario
def prog_redirect_stdout_captures_id_tap_print(ctx):
  """``id_tap(print, x)`` inside ``redirect_stdout``, without a barrier,
  then a Python print of the result: the order and the capture."""
  import contextlib

  f = jax.jit(lambda x: hcb.id_tap(print, x * 2))
  for i in range(2):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
      f(np.int32(i))
    ctx.log("captured", repr(buf.getvalue()))
  print("result", f(np.int32(5)))


@scenario
def prog_redirect_stdout_pmap_and_scan_prints(ctx):
  """A pmap and a jitted scan that print, inside ``redirect_stdout``,
  without a barrier: the lines captured (sorted: 2 devices)."""
  import contextlib

  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    jax.pmap(lambda x: hcb.id_print(x, what="pmap"))(np.arange(2))
    jax.jit(
      lambda xs: jax.lax.scan(
        lambda c, x: (c + hcb.id_print(x, what="scan"), None), 0, xs
      )[0]
    )(np.arange(3))
  ctx.log("captured", sorted(buf.getvalue().splitlines()))
