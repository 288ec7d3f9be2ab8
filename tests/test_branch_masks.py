"""``hostcb.debug.print``/``callback`` in a branch under ``vmap`` fire only
for the batch elements that take the branch (``cond``, ``switch``, nested
``cond`` s, ``cond`` in ``scan``, ``scan`` in ``cond``, the body of a
``while_loop`` with a batched predicate), with each element's values;
JAX's drop-ins under ``install(jax_callbacks=True)`` keep JAX's behaviour
(every element).  ``hostcb/_jax_internals/branch_masks.py``."""

from __future__ import annotations

import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
from _helpers import run_python

XS = np.array([0.125, 0.875, 0.25, 0.625], np.float32)
MODES = ["eager", "jit"]


def _run(f, mode, *args):
  g = jax.vmap(f)
  out = (jax.jit(g) if mode == "jit" else g)(*args)
  jax.effects_barrier()
  return out


def _printed(capsys) -> list[str]:
  return capsys.readouterr().out.splitlines()


def _big(x):
  return lax.cond(
    x > 0.5, lambda x: hostcb.debug.print("big {}", x), lambda x: None, x
  )


# ------------------------------------------------------------------ cond
@pytest.mark.parametrize("mode", MODES)
def test_print_in_cond_branch_prints_only_the_elements_that_take_it(
  mode, capsys
):
  _run(_big, mode, XS)
  assert _printed(capsys) == ["big 0.875", "big 0.625"]


@pytest.mark.parametrize("mode", MODES)
def test_callback_in_cond_branches_gets_each_taking_elements_value(mode):
  got = []

  def f(x):
    return lax.cond(
      x > 0.5,
      lambda x: (hostcb.debug.callback(lambda v: got.append(("T", v)), x), x)[
        1
      ],
      lambda x: (hostcb.debug.callback(lambda v: got.append(("F", v)), x), -x)[
        1
      ],
      x,
    )

  out = _run(f, mode, XS)
  np.testing.assert_array_equal(out, [-0.125, 0.875, -0.25, 0.625])
  assert sorted((k, float(v)) for k, v in got) == [
    ("F", 0.125),
    ("F", 0.25),
    ("T", 0.625),
    ("T", 0.875),
  ]


@pytest.mark.parametrize("mode", MODES)
def test_print_in_switch_branches_prints_per_taken_index(mode, capsys):
  def f(i, x):
    return lax.switch(
      i,
      [
        lambda x: hostcb.debug.print("zero {}", x) or x,
        lambda x: hostcb.debug.print("one {}", x) or x + 1,
        lambda x: hostcb.debug.print("two {}", x) or x + 2,
      ],
      x,
    )

  out = _run(f, mode, np.array([2, 0, 2, 1], np.int32), XS)
  np.testing.assert_array_equal(out, [2.125, 0.875, 2.25, 1.625])
  assert sorted(_printed(capsys)) == [
    "one 0.625",
    "two 0.125",
    "two 0.25",
    "zero 0.875",
  ]


@pytest.mark.parametrize("mode", MODES)
def test_print_in_nested_conds_prints_where_both_predicates_hold(mode, capsys):
  def f(x, y):
    def outer(x):
      return lax.cond(
        y > 0,
        lambda x: hostcb.debug.print("both {} {}", x, y),
        lambda x: None,
        x,
      )

    return lax.cond(x > 0.5, outer, lambda x: None, x)

  _run(f, mode, XS, np.array([1, 1, 1, -1], np.int32))
  assert _printed(capsys) == ["both 0.875 1"]


@pytest.mark.parametrize("mode", MODES)
def test_print_in_cond_in_scan_body_prints_per_step_where_taken(mode, capsys):
  def f(xs):
    def body(c, x):
      lax.cond(
        x > 1.5, lambda x: hostcb.debug.print("step {}", x), lambda x: None, x
      )
      return c + x, None

    return lax.scan(body, 0.0, xs)[0]

  xs = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 1.0]], np.float32)
  out = _run(f, mode, xs)
  np.testing.assert_array_equal(out, [6.0, 2.0])
  assert _printed(capsys) == ["step 2.0", "step 3.0"]


@pytest.mark.parametrize("mode", MODES)
def test_print_in_scan_in_cond_branch_prints_only_for_taking_elements(
  mode, capsys
):
  def f(x):
    def loop(x):
      def body(c, i):
        hostcb.debug.print("x={} i={}", x, i)
        return c + i, None

      return lax.scan(body, x, jnp.arange(2.0))[0]

    return lax.cond(x > 0.5, loop, lambda x: x, x)

  out = _run(f, mode, XS)
  np.testing.assert_array_equal(out, [0.125, 1.875, 0.25, 1.625])
  assert sorted(_printed(capsys)) == [
    "x=0.625 i=0.0",
    "x=0.625 i=1.0",
    "x=0.875 i=0.0",
    "x=0.875 i=1.0",
  ]


@pytest.mark.parametrize("mode", MODES)
def test_print_in_checkpoint_in_cond_branch_prints_only_for_taking_elements(
  mode, capsys
):
  inner = jax.checkpoint(lambda x: hostcb.debug.print("ck {}", x) or x * 2)
  out = _run(lambda x: lax.cond(x > 0.5, inner, lambda x: x, x), mode, XS)
  np.testing.assert_array_equal(out, [0.125, 1.75, 0.25, 1.25])
  assert _printed(capsys) == ["ck 0.875", "ck 0.625"]


@pytest.mark.parametrize("mode", MODES)
def test_print_in_jit_in_cond_branch_prints_only_for_taking_elements(
  mode, capsys
):
  inner = jax.jit(lambda x: hostcb.debug.print("inner {}", x) or x * 2)
  _run(lambda x: lax.cond(x > 0.5, inner, lambda x: x, x), mode, XS)
  assert _printed(capsys) == ["inner 0.875", "inner 0.625"]


def test_print_in_cond_under_nested_vmap_prints_where_taken(capsys):
  xs = np.array([[0.125, 0.875], [0.625, 0.25]], np.float32)
  jax.jit(jax.vmap(jax.vmap(_big)))(xs)
  jax.effects_barrier()
  assert sorted(_printed(capsys)) == ["big 0.625", "big 0.875"]


@pytest.mark.parametrize("mode", MODES)
def test_print_in_cond_branch_under_x64_prints_float64_values(mode, capsys):
  with jax.enable_x64(True):
    _run(_big, mode, np.array([0.1, 0.7], np.float64))
  assert _printed(capsys) == ["big 0.7"]


def test_print_without_operands_in_cond_branch_prints_once_per_taking_element(
  capsys,
):
  jax.jit(
    jax.vmap(
      lambda x: lax.cond(
        x > 0.5, lambda: hostcb.debug.print("taken"), lambda: None
      )
    )
  )(XS)
  jax.effects_barrier()
  assert _printed(capsys) == ["taken", "taken"]


# ------------------------------------------------------------ while_loop
@pytest.mark.parametrize("mode", MODES)
def test_print_in_batched_while_body_skips_elements_that_finished(mode, capsys):
  def f(c):
    def body(c):
      hostcb.debug.print("body {}", c)
      return c + 1

    return lax.while_loop(lambda c: c < 3, body, c)

  out = _run(f, mode, np.array([0, 2], np.int32))
  np.testing.assert_array_equal(out, [3, 3])
  # Step 1: both elements; step 2: the first only (the second is at 3);
  # step 3: the first.
  assert _printed(capsys) == ["body 0", "body 2", "body 1", "body 2"]


# ------------------------------------------------------ values unchanged
def test_a_masked_print_changes_no_result():
  def f(x, y, printing):
    def taken(x):
      if printing:
        hostcb.debug.print("{} {}", x, y)
      return jnp.sin(x) * y

    return lax.cond(x > 0.5, taken, lambda x: x - y, x)

  ys = np.array([1.5, -2.0, 3.0, 0.5], np.float32)
  with_print = jax.jit(jax.vmap(lambda x, y: f(x, y, True)))(XS, ys)
  without = jax.jit(jax.vmap(lambda x, y: f(x, y, False)))(XS, ys)
  jax.effects_barrier()
  np.testing.assert_array_equal(with_print, without)
  grads = jax.vmap(jax.grad(lambda x, y: f(x, y, True)))(XS, ys)
  plain = jax.vmap(jax.grad(lambda x, y: f(x, y, False)))(XS, ys)
  jax.effects_barrier()
  np.testing.assert_array_equal(grads, plain)


def test_a_program_without_taps_traces_to_the_same_jaxpr():
  def f(x):
    return lax.cond(x > 0.5, jnp.sin, jnp.cos, x) + lax.while_loop(
      lambda c: c < x, lambda c: c + 1.0, 0.0
    )

  before = str(jax.make_jaxpr(jax.vmap(f))(XS))
  _run(_big, "jit", XS)  # the rules are wrapped by now
  assert str(jax.make_jaxpr(jax.vmap(f))(XS)) == before


# --------------------------------------------------- fallback, drop-ins
def test_a_print_in_custom_jvp_in_a_branch_fires_for_all_with_a_warning(
  capsys,
):
  @jax.custom_jvp
  def noisy(x):
    hostcb.debug.print("noisy {}", x)
    return x

  noisy.defjvp(lambda p, t: (noisy(p[0]), t[0]))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jax.jit(jax.vmap(lambda x: lax.cond(x > 0.5, noisy, lambda x: x, x)))(XS)
    jax.effects_barrier()
  assert len(_printed(capsys)) == 4
  assert [w.category for w in caught] == [hostcb.debug.BranchMaskWarning]
  assert str(caught[0].message).startswith(
    "hostcb: a tap inside `custom_jvp_call` (`jax.custom_jvp`) in a branch "
    "of a `cond` "
    "(or the body of a `while_loop`) under `vmap` fires for every batch "
    "element, not only for those that take the branch"
  )


def test_legacy_id_print_in_cond_branch_keeps_the_whole_batch():
  got = []
  jax.jit(
    jax.vmap(
      lambda x: lax.cond(
        x > 0.5,
        lambda x: hostcb.id_tap(lambda v, t: got.append(v), x),
        lambda x: x,
        x,
      )
    )
  )(XS)
  hostcb.barrier_wait()
  assert len(got) == 1
  np.testing.assert_array_equal(got[0], XS)


def test_installed_jax_debug_print_fires_for_every_element_as_jax():
  code = textwrap.dedent(
    """
    import jax, numpy as np, hostcb
    hostcb.install(jax_callbacks=True)
    xs = np.array([0.125, 0.875], np.float32)
    f = lambda x: jax.lax.cond(
      x > 0.5, lambda x: jax.debug.print("big {}", x), lambda x: None, x)
    jax.jit(jax.vmap(f))(xs)
    jax.effects_barrier()
    g = lambda x: jax.lax.cond(
      x > 0.5, lambda x: hostcb.debug.print("ours {}", x), lambda x: None, x)
    jax.jit(jax.vmap(g))(xs)
    jax.effects_barrier()
    """
  )
  done = run_python(code, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines() == ["big 0.125", "big 0.875", "ours 0.875"]


def test_first_debug_print_wraps_the_rules_and_uninstall_restores_them():
  code = textwrap.dedent(
    """
    import jax, numpy as np
    from jax._src.interpreters import batching
    from jax._src.lax.control_flow import conditionals, loops
    rules = batching.fancy_primitive_batchers
    jax_cond, jax_while = rules[conditionals.cond_p], rules[loops.while_p]
    import hostcb
    from hostcb import _jax_internals as ji
    print(rules[conditionals.cond_p] is jax_cond)
    jax.jit(jax.vmap(lambda x: jax.lax.cond(
      x > 0.5, lambda x: hostcb.debug.print("big {}", x), lambda x: None, x
    )))(np.array([0.25, 0.75], np.float32))
    jax.effects_barrier()
    print(sorted(p.target for p in ji.installed() if "branch" in p.name))
    hostcb.uninstall()
    print(rules[conditionals.cond_p] is jax_cond,
          rules[loops.while_p] is jax_while)
    """
  )
  done = run_python(code, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines() == [
    "True",
    "big 0.75",
    "['jax._src.interpreters.batching.fancy_primitive_batchers[cond]', "
    "'jax._src.interpreters.batching.fancy_primitive_batchers[while]']",
    "True True",
  ]


@pytest.mark.skipif(
  not hostcb.engine.available(),
  reason="functions by name are the native engine's handlers, which are "
  f"not built here: {hostcb.engine.unavailable_reason()}",
)
def test_an_exported_program_prints_only_for_taking_elements_when_run():
  pytest.importorskip(
    "flatbuffers",
    reason="flatbuffers is not installed (pip install hostcb[export]): "
    "jax.export cannot serialize",
  )
  code = textwrap.dedent(
    """
    import jax, numpy as np, hostcb
    f = jax.jit(jax.vmap(lambda x: jax.lax.cond(
      x > 0.5, lambda x: hostcb.debug.print("big {}", x) or x * 2,
      lambda x: x, x)))
    exported = jax.export.export(f, disabled_checks=hostcb.export_checks())(
      jax.ShapeDtypeStruct((4,), np.float32))
    back = jax.export.deserialize(exported.serialize())
    print(back.call(np.array([0.125, 0.875, 0.25, 0.625], np.float32)))
    jax.effects_barrier()
    """
  )
  done = run_python(code, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines() == [
    "big 0.875",
    "big 0.625",
    "[0.125 1.75  0.25  1.25 ]",
  ]
