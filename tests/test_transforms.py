"""Taps under vmap, jvp, grad, checkpoint and custom derivatives."""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
from _helpers import Recorder


# -------------------------------------------------------------------- vmap
def test_vmap_calls_tap_once_with_batched_value():
  rec = Recorder()
  out = jax.vmap(lambda x: hostcb.id_tap(rec, x * 2))(jnp.arange(3.0))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [0.0, 2.0, 4.0])
  assert len(rec.calls) == 1
  np.testing.assert_array_equal(rec.args[0], [0.0, 2.0, 4.0])


def test_vmap_transforms_name_batch_dims_per_leaf():
  rec = Recorder()
  jax.vmap(lambda x: hostcb.id_tap(rec, (x, x + 1)))(jnp.arange(3.0))
  hostcb.barrier_wait()
  assert rec.transforms == [(("batch", {"batch_dims": (0, 0)}),)]


def test_vmap_unbatched_leaf_has_batch_dim_none():
  rec = Recorder()
  jax.vmap(lambda x: hostcb.id_tap(rec, (x, 1.0)))(jnp.arange(3.0))
  hostcb.barrier_wait()
  assert rec.transforms == [(("batch", {"batch_dims": (0, None)}),)]
  x, one = rec.args[0]
  np.testing.assert_array_equal(x, [0.0, 1.0, 2.0])
  assert one.shape == () and float(one) == 1.0


def test_vmap_in_axes_one_reports_batch_dim():
  rec = Recorder()
  x = jnp.arange(6.0).reshape(2, 3)
  jax.vmap(lambda r: hostcb.id_tap(rec, r), in_axes=1)(x)
  hostcb.barrier_wait()
  assert rec.transforms == [(("batch", {"batch_dims": (1,)}),)]
  np.testing.assert_array_equal(rec.args[0], np.asarray(x))


def test_nested_vmap_gives_two_entries():
  rec = Recorder()
  jax.vmap(jax.vmap(lambda x: hostcb.id_tap(rec, (x, 2.0))))(jnp.ones((2, 3)))
  hostcb.barrier_wait()
  assert rec.transforms == [
    (("batch", {"batch_dims": (0, None)}), ("batch", {"batch_dims": (0, None)}))
  ]
  assert rec.args[0][0].shape == (2, 3)


def test_nested_vmap_with_inner_unbatched_value():
  rec = Recorder()

  def f(x, y):
    return hostcb.id_tap(rec, (x, y))

  jax.vmap(lambda x, ys: jax.vmap(lambda y: f(x, y))(ys))(
    jnp.arange(2.0), jnp.ones((2, 3))
  )
  hostcb.barrier_wait()
  assert rec.transforms == [
    (("batch", {"batch_dims": (None, 0)}), ("batch", {"batch_dims": (0, 0)}))
  ]


def test_vmap_under_jit_and_jit_under_vmap():
  rec = Recorder()
  f = lambda x: hostcb.id_tap(rec, x)
  jax.jit(jax.vmap(f))(jnp.arange(2))
  jax.vmap(jax.jit(f))(jnp.arange(2))
  hostcb.barrier_wait()
  assert rec.transforms == [(("batch", {"batch_dims": (0,)}),)] * 2


def test_vmap_of_scan_with_tap():
  rec = Recorder()

  def f(x):
    return lax.scan(
      lambda c, _: (hostcb.id_tap(rec, c) + 1, None), x, None, length=2
    )[0]

  jax.vmap(f)(jnp.array([10, 20]))
  hostcb.barrier_wait()
  assert [a.tolist() for a in rec.args] == [[10, 20], [11, 21]]
  assert rec.transforms == [(("batch", {"batch_dims": (0,)}),)] * 2


def test_vmap_result_keeps_its_batching():
  rec = Recorder()
  out = jax.vmap(lambda x: hostcb.id_tap(rec, x, result=x * 3))(jnp.arange(3))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [0, 3, 6])
  np.testing.assert_array_equal(rec.args[0], [0, 1, 2])


# ---------------------------------------------------------- jvp and grad
def test_jvp_taps_primals_once_with_empty_transforms():
  rec = Recorder()
  primal, tangent = jax.jvp(
    lambda x: hostcb.id_tap(rec, x * 2) * x, (3.0,), (1.0,)
  )
  hostcb.barrier_wait()
  assert (float(primal), float(tangent)) == (18.0, 12.0)
  assert len(rec.calls) == 1
  assert float(rec.args[0]) == 6.0
  assert rec.transforms == [()]


def test_grad_taps_primals_once_with_empty_transforms():
  rec = Recorder()

  def f(x):
    y = x * x
    hostcb.id_tap(rec, (x, y))
    return y * x

  assert float(jax.grad(f)(3.0)) == 27.0
  hostcb.barrier_wait()
  assert len(rec.calls) == 1
  assert [float(v) for v in rec.args[0]] == [3.0, 9.0]
  assert rec.transforms == [()]


def test_grad_through_returned_tap_value_is_identity():
  rec = Recorder()
  g = jax.grad(lambda x: jnp.sin(hostcb.id_tap(rec, x)))(0.5)
  hostcb.barrier_wait()
  assert float(g) == float(jnp.cos(0.5))
  assert len(rec.calls) == 1


def test_jit_of_grad_taps_once():
  rec = Recorder()
  jax.jit(jax.grad(lambda x: hostcb.id_tap(rec, x) ** 2))(2.0)
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [2.0]


def test_second_order_grad_taps_primal_values_only():
  rec = Recorder()
  g2 = jax.grad(jax.grad(lambda x: hostcb.id_tap(rec, x) ** 3))(2.0)
  hostcb.barrier_wait()
  assert float(g2) == 12.0
  assert rec.args and all(float(a) == 2.0 for a in rec.args)
  assert all(t == () for t in rec.transforms)


def test_vmap_of_grad_taps_batched_primals():
  rec = Recorder()
  jax.vmap(jax.grad(lambda x: hostcb.id_tap(rec, x) ** 2))(jnp.arange(3.0))
  hostcb.barrier_wait()
  assert len(rec.calls) == 1
  np.testing.assert_array_equal(rec.args[0], [0.0, 1.0, 2.0])
  assert rec.transforms == [(("batch", {"batch_dims": (0,)}),)]


def test_grad_with_tap_inside_scan():
  rec = Recorder()

  def f(x):
    return lax.scan(
      lambda c, _: (hostcb.id_tap(rec, c) * 2.0, None), x, None, length=3
    )[0]

  assert float(jax.grad(f)(1.0)) == 8.0
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [1.0, 2.0, 4.0]


def test_grad_with_tap_inside_cond():
  rec = Recorder()

  def f(x):
    return lax.cond(
      x > 0, lambda x: hostcb.id_tap(rec, x) * 3.0, lambda x: x, x
    )

  assert float(jax.grad(f)(2.0)) == 3.0
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [2.0]


# ---------------------------------------------------------- checkpoint
def test_checkpoint_taps_again_when_rematerializing():
  rec = Recorder()

  def inner(x):
    hostcb.id_tap(rec, x)
    return jnp.sin(x)

  jax.grad(jax.checkpoint(inner))(1.0)
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [1.0, 1.0]


def test_checkpoint_without_grad_taps_once():
  rec = Recorder()
  jax.jit(jax.checkpoint(lambda x: hostcb.id_tap(rec, x) * 2))(1.0)
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [1.0]


def test_remat_alias_under_jit_grad():
  rec = Recorder()

  def inner(x):
    return jnp.sin(hostcb.id_tap(rec, x * 2))

  jax.jit(jax.grad(jax.remat(inner)))(1.0)
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [2.0, 2.0]


# ------------------------------------------------- custom derivatives
def test_tap_inside_custom_jvp_rule_sees_tangent():
  rec = Recorder()

  @jax.custom_jvp
  def f(x):
    return x * 2

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    hostcb.id_tap(rec, t)
    return f(x), t * 2

  jax.jvp(f, (1.0,), (5.0,))
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [5.0]


def test_tap_inside_custom_jvp_primal_runs_without_differentiation():
  rec = Recorder()

  @jax.custom_jvp
  def f(x):
    return hostcb.id_tap(rec, x) * 2

  f.defjvp(lambda p, t: (f(p[0]), t[0] * 2))
  assert float(jax.jit(f)(3.0)) == 6.0
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [3.0]


def test_tap_inside_custom_vjp_bwd_sees_cotangent():
  rec = Recorder()

  @jax.custom_vjp
  def f(x):
    return x * 3

  def fwd(x):
    return f(x), None

  def bwd(_, ct):
    hostcb.id_tap(rec, ct)
    return (ct * 3,)

  f.defvjp(fwd, bwd)
  assert float(jax.grad(lambda x: f(x) * 2.0)(1.0)) == 6.0
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [2.0]


def test_tap_inside_custom_vjp_fwd_runs_once():
  rec = Recorder()

  @jax.custom_vjp
  def f(x):
    return x * 3

  def fwd(x):
    hostcb.id_tap(rec, x)
    return f(x), None

  f.defvjp(fwd, lambda _, ct: (ct * 3,))
  jax.grad(f)(4.0)
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [4.0]


# ------------------------------------------------- while_loop under vmap
def _while_with_tapped_cond(tap):
  return lambda x: lax.while_loop(
    lambda c: (hostcb.id_tap(tap, c), c < 5.0)[1], lambda c: c * 2.0, x
  )


def test_vmap_of_while_with_tap_in_cond_keeps_finished_elements():
  rec = Recorder()
  out = jax.jit(jax.vmap(_while_with_tapped_cond(rec)))(jnp.array([1.0, 3.0]))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [8.0, 6.0])


def test_vmap_of_while_with_tap_in_cond_gives_values_of_untapped_loop():
  f = lambda x: lax.while_loop(
    lambda c: hostcb.id_print(c < 2), lambda c: c + 1, x
  )
  untapped = lambda x: lax.while_loop(lambda c: c < 2, lambda c: c + 1, x)
  xs = jnp.arange(5, dtype=jnp.int32)
  with contextlib.redirect_stdout(io.StringIO()):
    out = jax.jit(jax.vmap(f))(xs)
    hostcb.barrier_wait()
  np.testing.assert_array_equal(out, jax.jit(jax.vmap(untapped))(xs))
  np.testing.assert_array_equal(out, [2, 2, 2, 3, 4])


def test_vmap_of_while_cond_tap_sees_body_results_of_every_element():
  # As legacy: finished elements are computed (and tapped) but not kept.
  rec = Recorder()
  jax.jit(jax.vmap(_while_with_tapped_cond(rec)))(jnp.array([1.0, 3.0]))
  hostcb.barrier_wait()
  assert [a.tolist() for a in rec.args] == [
    [1.0, 3.0],
    [2.0, 6.0],
    [4.0, 12.0],
    [8.0, 12.0],
  ]
  assert rec.transforms == [(("batch", {"batch_dims": (0,)}),)] * 4


def test_vmap_of_while_with_tapped_cond_never_restarts_a_finished_element():
  # Element 1 finishes at 7; the body would bring it back to 0 < 5.
  rec = Recorder()
  f = lambda x: lax.while_loop(
    lambda c: hostcb.id_tap(rec, c) < 5, lambda c: (c + 3) % 10, x
  )
  out = jax.jit(jax.vmap(f))(jnp.array([1, 4]))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [7, 7])
  assert [a.tolist() for a in rec.args] == [[1, 4], [4, 7], [7, 0]]


# ---------------------------------------------------------- transposition
@jax.custom_jvp
def _double(x):
  return 2.0 * x


_tangent_taps = Recorder()


@_double.defjvp
def _double_jvp(primals, tangents):
  (x,) = primals
  xt = hostcb.id_tap(_tangent_taps, tangents[0])
  return _double(x), 2.0 * xt


@pytest.fixture
def tangent_taps():
  _tangent_taps.calls.clear()
  yield _tangent_taps
  _tangent_taps.calls.clear()


def test_grad_taps_cotangent_of_tapped_tangent(tangent_taps):
  assert float(jax.grad(_double)(3.0)) == 2.0
  hostcb.barrier_wait()
  assert tangent_taps.transforms == [(("transpose", {}),)]
  assert [float(a) for a in tangent_taps.args] == [2.0]


def test_grad_through_scan_taps_each_cotangent(tangent_taps):
  f = lambda x: lax.scan(lambda c, _: (_double(c), None), x, None, length=2)[0]
  assert float(jax.grad(f)(3.0)) == 4.0
  hostcb.barrier_wait()
  assert [float(a) for a in tangent_taps.args] == [2.0, 4.0]
  assert tangent_taps.transforms == [(("transpose", {}),)] * 2


def test_vjp_taps_the_given_cotangent(tangent_taps):
  _, pullback = jax.vjp(_double, 3.0)
  assert float(pullback(5.0)[0]) == 10.0
  hostcb.barrier_wait()
  assert [float(a) for a in tangent_taps.args] == [10.0]


def test_grad_of_vmap_lists_batch_then_transpose(tangent_taps):
  g = jax.grad(lambda x: jnp.sum(jax.vmap(_double)(x)))(jnp.arange(2.0))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(g, [2.0, 2.0])
  assert tangent_taps.transforms == [
    (("batch", {"batch_dims": (0,)}), ("transpose", {}))
  ]
  np.testing.assert_array_equal(tangent_taps.args[0], [2.0, 2.0])


def test_jvp_and_linearize_tap_the_tangent_without_transpose(tangent_taps):
  _, t = jax.jvp(_double, (3.0,), (1.0,))
  jax.linearize(_double, 3.0)[1](2.0)
  hostcb.barrier_wait()
  assert float(t) == 2.0
  assert [float(a) for a in tangent_taps.args] == [1.0, 2.0]
  assert tangent_taps.transforms == [(), ()]


def test_tapped_tangent_whose_result_is_unused_is_not_tapped_under_grad():
  rec = Recorder()

  @jax.custom_jvp
  def f(x):
    return 2.0 * x

  @f.defjvp
  def f_jvp(primals, tangents):
    hostcb.id_tap(rec, tangents[0])
    return f(primals[0]), 2.0 * tangents[0]

  assert float(jax.grad(f)(3.0)) == 2.0
  hostcb.barrier_wait()
  assert rec.calls == []
