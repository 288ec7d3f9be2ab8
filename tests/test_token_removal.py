"""A one-device CPU executable's lone tap or call runs without its token
(hostcb._jax_internals.token_removal), and everything else keeps it."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
import test_dispatch
from hostcb import _engine as engine
from hostcb._jax_internals import token_removal

_F32 = jax.ShapeDtypeStruct((), jnp.float32)
# The dispatch mode for a test (test_dispatch's fixtures).
fast, strict = test_dispatch.fast, test_dispatch.strict


def _custom_calls(text: str) -> list[str]:
  return [line for line in text.splitlines() if "stablehlo.custom_call" in line]


def _lowered(f, *args) -> str:
  return jax.jit(f).lower(*args).as_text()


def test_a_lone_tap_takes_and_returns_no_token(fast):
  text = _lowered(lambda x: hostcb.id_tap(lambda a, t: None, x) + 1, 1.0)
  assert "stablehlo.create_token" not in text
  (call,) = _custom_calls(text)
  assert "@hostcb_tap(%arg0)" in call
  assert call.endswith(": (tensor<f32>) -> ()")


def test_a_lone_tap_delivers_its_value_and_changes_none(fast):
  seen = []
  tapped = jax.jit(lambda x: hostcb.id_tap(lambda a, t: seen.append(a), x) * 2)
  plain = jax.jit(lambda x: x * 2)
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  np.testing.assert_array_equal(tapped(x), plain(x))
  hostcb.barrier_wait()
  assert len(seen) == 1
  np.testing.assert_array_equal(seen[0], x)
  assert seen[0].dtype == np.float32


def test_a_lone_call_returns_its_result_without_a_token(fast):
  f = lambda x: hostcb.call(lambda a: a * 3, x, result_shape=_F32) + 1
  text = _lowered(f, jnp.float32(2))
  assert "stablehlo.create_token" not in text
  (call,) = _custom_calls(text)
  assert "@hostcb_call_one(%arg0)" in call
  assert call.endswith(": (tensor<f32>) -> tensor<f32>")
  assert jax.jit(f)(jnp.float32(2)) == 7.0


def test_a_lone_print_prints_its_line(fast, capsys):
  def f(x):
    hostcb.debug.print("x={}", x)
    return x + 1

  assert "stablehlo.create_token" not in _lowered(f, jnp.float32(2))
  assert jax.jit(f)(jnp.float32(2)) == 3.0
  hostcb.barrier_wait()
  assert capsys.readouterr().out == "x=2.0\n"


@pytest.mark.parametrize(
  "kind",
  [
    "debug.callback",
    "debug.callback(ordered=True)",
    "io_callback",
    "io_callback(ordered=True)",
    "pure_callback",
    "id_print",
  ],
)
def test_a_lone_drop_in_takes_and_returns_no_token(fast, kind):
  f = test_dispatch._one_callback(kind, [])
  text = _lowered(f, jnp.float32(2))
  assert "stablehlo.create_token" not in text
  (call,) = _custom_calls(text)
  assert "!stablehlo.token" not in call


def test_a_lone_tap_in_a_nested_jit_keeps_its_token(fast):
  inner = jax.jit(lambda x: hostcb.id_tap(lambda a, t: None, x) + 1)
  text = _lowered(inner, 1.0)  # jit of a jit: the token goes into a call
  assert "stablehlo.create_token" in text


def test_two_taps_keep_the_token_that_orders_them(fast):
  def f(x):
    x = hostcb.id_tap(lambda a, t: None, x)
    return hostcb.id_tap(lambda a, t: None, x)

  text = _lowered(f, 1.0)
  assert "stablehlo.create_token" in text
  assert all("!stablehlo.token" in c for c in _custom_calls(text))


def test_a_tap_in_a_loop_keeps_its_token(fast):
  seen = []

  def f(x):
    def body(c, _):
      return hostcb.id_tap(lambda a, t: seen.append(int(a)), c) + 1, None

    return lax.scan(body, x, None, length=3)[0]

  text = _lowered(f, jnp.int32(0))
  assert "stablehlo.create_token" in text
  assert jax.jit(f)(jnp.int32(0)) == 3
  hostcb.barrier_wait()
  assert seen == [0, 1, 2]


def test_strict_mode_keeps_the_runtime_token(strict):
  text = _lowered(lambda x: hostcb.id_tap(lambda a, t: None, x), 1.0)
  main = next(line for line in text.splitlines() if "@main(" in line)
  assert "!stablehlo.token" in main
  (call,) = _custom_calls(text)
  assert "!stablehlo.token" in call


def test_platforms_read_from_the_last_positional_argument():
  assert token_removal.on_cpu(("jaxpr", "name", ("cpu",)), {})
  assert not token_removal.on_cpu(("jaxpr", "name", ("cuda",)), {})
  assert not token_removal.on_cpu(("jaxpr", "name", ("cpu", "cuda")), {})
  assert token_removal.on_cpu(("jaxpr",), {"platforms": ("cpu",)})


def test_an_unknown_lowering_signature_keeps_tokens_and_says_so_once(
  monkeypatch, caplog
):
  # Fault injection: a JAX whose lowering takes something else last.
  monkeypatch.setattr(token_removal, "_warned", [False])
  with caplog.at_level(logging.WARNING, logger="hostcb"):
    assert not token_removal.on_cpu(("jaxpr", "name", None), {})
    assert not token_removal.on_cpu(("jaxpr", "name", 3), {})
  warnings = [r.getMessage() for r in caplog.records]
  assert len(warnings) == 1
  assert warnings[0].startswith(
    "hostcb: this JAX's _cached_lowering_to_hlo does not take its "
    "platforms last (got 'NoneType')"
  )


def test_a_lone_call_of_several_arrays_returns_them_without_a_token(fast):
  def host(args):
    a, b = args
    return a + b, a * b

  pair = jax.ShapeDtypeStruct((2,), jnp.float32)

  def f(x, y):
    return hostcb.call(host, (x, y), result_shape=(pair, pair))

  x = jnp.array([2, 3], jnp.float32)
  y = jnp.array([4, 5], jnp.float32)
  text = _lowered(f, x, y)
  assert "stablehlo.create_token" not in text
  (call,) = _custom_calls(text)
  assert "!stablehlo.token" not in call
  s, p = jax.jit(f)(x, y)
  np.testing.assert_array_equal(s, np.array([6, 8], np.float32))
  np.testing.assert_array_equal(p, np.array([8, 15], np.float32))


def test_the_targets_are_the_engines_tap_and_call_names():
  assert token_removal.TARGETS == {
    engine.ffi_target_name,
    engine.tap_v1_target_name,
    engine.call_target_name,
    engine.call_one_target_name,
    engine.call_v1_target_name,
    engine.noop_target_name,
  }
