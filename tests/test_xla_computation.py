"""hostcb.xla_computation: HLO of functions, with axis_env collectives."""

from __future__ import annotations

import functools
import re
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
from hostcb import _engine as engine
from hostcb._jax_internals.versions import jax_at_least
from hostcb.xla_computation import XlaComputation, xla_computation

F32 = np.dtype(np.float32)
IJ = [("i", 4), ("j", 2)]


def _entry(text: str) -> str:
  """The ENTRY computation of HLO text."""
  return text[text.index("ENTRY") :]


def _groups(text: str) -> list[str]:
  return re.findall(r"replica_groups=(\{[{}0-9,]*\})", text)


# ----------------------------------------------------------- the basics
def test_hlo_text_of_sin_cos_names_the_function_and_returns_a_tuple():
  def f(x):
    return jnp.sin(jnp.cos(x))

  text = xla_computation(f)(3.0).as_hlo_text()
  assert text.startswith("HloModule xla_computation_f,")
  entry = _entry(text)
  assert "f32[] parameter(0)" in entry
  assert re.search(r"cos\S* = f32\[\] cosine\(", entry)
  assert re.search(r"sin\S* = f32\[\] sine\(", entry)
  assert re.search(r"ROOT \S+ = \(f32\[\]\) tuple\(", entry)


def test_program_shape_result_is_a_tuple_of_the_outputs():
  c = xla_computation(lambda x: (x, x.sum()))(np.ones((2, 3), np.float32))
  shape = c.program_shape()
  assert [repr(s) for s in shape.parameter_shapes()] == ["f32[2,3]{1,0}"]
  result = shape.result_shape()
  assert result.is_tuple()
  assert [(s.dimensions(), s.numpy_dtype()) for s in result.tuple_shapes()] == [
    ((2, 3), F32),
    ((), F32),
  ]


def test_simple_namespace_example_argument_gives_same_hlo_as_a_value():
  scalar = types.SimpleNamespace(shape=(), dtype=np.dtype(np.float32))
  f = lambda x: jnp.sin(x)
  assert (
    xla_computation(f)(scalar).as_hlo_text()
    == xla_computation(f)(np.float32(3.0)).as_hlo_text()
  )


def test_shape_dtype_struct_example_argument():
  c = xla_computation(lambda x: x * 2)(jax.ShapeDtypeStruct((5, 2), jnp.int32))
  assert repr(c.program_shape()) == "(Arg_0: s32[5,2]) -> (s32[5,2])"


def test_pytree_and_keyword_arguments_become_parameters_in_order():
  c = xla_computation(lambda d, *, y: d["a"] + d["b"][0] + y)(
    {"a": 1.0, "b": [jnp.ones(2)]}, y=jnp.ones(2)
  )
  assert (
    repr(c.program_shape())
    == "(Arg_0: f32[], Arg_1: f32[2], Arg_2: f32[2]) -> (f32[2])"
  )


def test_unused_arguments_stay_parameters():
  c = xla_computation(lambda x, y: x)(1.0, jnp.ones(3, jnp.int32))
  assert repr(c.program_shape()) == "(Arg_0: f32[], Arg_1: s32[3]) -> (f32[])"


def test_no_outputs_give_an_empty_result_tuple():
  assert (
    repr(xla_computation(lambda x: ())(1.0).program_shape())
    == "(Arg_0: f32[]) -> ()"
  )


def test_invalid_example_argument_names_its_position():
  with pytest.raises(
    TypeError,
    match=r"argument 0\['a'\]\[1\] must be an "
    r"array, a scalar or an object with shape and dtype; "
    r"got str 'x'",
  ):
    xla_computation(lambda d: d)({"a": [1.0, "x"]})


def test_non_callable_is_rejected():
  with pytest.raises(
    TypeError,
    match=r"^Expected a callable value, got 3 "
    r"\(xla_computation expects a callable\)$",
  ):
    xla_computation(3)


# ------------------------------------------------------------- axis_env
def test_psum_over_i_with_axis_env_of_4_gives_one_group_of_4():
  text = xla_computation(lambda x: x - lax.psum(x, "i"), axis_env=[("i", 4)])(
    2
  ).as_hlo_text()
  entry = _entry(text)
  assert re.search(
    r"s32\[\] all-reduce\(\S+\), replica_groups=\{\{0,1,2,3\}\},"
    r" to_apply=",
    entry,
  )
  assert "channel_id" not in entry
  assert re.search(r"s32\[\] subtract\(", entry)


def test_psum_over_i_j_and_both_give_legacy_replica_groups():
  def g(x):
    return lax.psum(x, "i"), lax.psum(x, "j"), lax.psum(x, ("i", "j"))

  text = xla_computation(g, axis_env=IJ)(5.0).as_hlo_text()
  assert _groups(text) == [
    "{{0,2,4,6},{1,3,5,7}}",
    "{{0,1},{2,3},{4,5},{6,7}}",
    "{{0,1,2,3,4,5,6,7}}",
  ]


def test_axis_index_groups_select_within_the_axis_groups():
  text = xla_computation(
    lambda x: lax.psum(x, "i", axis_index_groups=[[0, 1], [2, 3]]), axis_env=IJ
  )(1.0).as_hlo_text()
  assert _groups(text) == ["{{0,2},{4,6},{1,3},{5,7}}"]


def test_axis_index_is_computed_from_the_replica_id():
  text = _entry(
    xla_computation(lambda: lax.axis_index("i"), axis_env=IJ)().as_hlo_text()
  )
  assert "replica-id()" in text
  assert "partition-id" not in text
  # replica / 2 (the size of j, after i) % 4 (the size of i)
  assert re.search(r"u32\[\] constant\(2\)", text)
  assert re.search(r"u32\[\] constant\(4\)", text)
  assert re.search(r"u32\[\] divide\(", text)
  assert re.search(r"u32\[\] remainder\(", text)


def test_all_gather_over_j_groups_pairs():
  text = xla_computation(lambda x: lax.all_gather(x, "j"), axis_env=IJ)(
    jnp.ones(3)
  ).as_hlo_text()
  assert re.search(
    r"f32\[2,3\]\{1,0\} all-gather\(\S+\), "
    r"replica_groups=\{\{0,1\},\{2,3\},\{4,5\},\{6,7\}\}, "
    r"dimensions=\{0\}",
    text,
  )


def test_pmax_and_pmin_are_all_reduces_with_max_and_min():
  text = xla_computation(
    lambda x: (lax.pmax(x, "i"), lax.pmin(x, "j")), axis_env=IJ
  )(1.0).as_hlo_text()
  assert _groups(text) == ["{{0,2,4,6},{1,3,5,7}}", "{{0,1},{2,3},{4,5},{6,7}}"]
  assert re.search(r"f32\[\] maximum\(", text)
  assert re.search(r"f32\[\] minimum\(", text)


def test_ppermute_pairs_replicas_within_each_group():
  text = xla_computation(
    lambda x: lax.ppermute(x, "j", [(0, 1), (1, 0)]), axis_env=IJ
  )(1.0).as_hlo_text()
  assert (
    "source_target_pairs={{0,1},{1,0},{2,3},{3,2},{4,5},{5,4},{6,7},{7,6}}"
  ) in text


def test_collectives_inside_scan_lower():
  def f(x):
    def body(c, y):
      return c + lax.psum(y, "i"), lax.axis_index("j")

    return lax.scan(body, x, jnp.ones(3))

  text = xla_computation(f, axis_env=IJ)(1.0).as_hlo_text()
  assert " while(" in text
  assert _groups(text) == ["{{0,2,4,6},{1,3,5,7}}"]
  assert "replica-id()" in text


def test_psum_of_a_constant_is_the_axis_size():
  text = _entry(
    xla_computation(lambda x: x + lax.psum(1, ("i", "j")), axis_env=IJ)(
      1.0
    ).as_hlo_text()
  )
  assert "f32[] constant(8)" in text
  assert "all-reduce" not in text


def test_eight_replicas_lower_whatever_the_device_count():
  assert jax.device_count() != 8
  text = xla_computation(lambda x: lax.psum(x, "k"), axis_env=[("k", 8)])(
    1.0
  ).as_hlo_text()
  assert _groups(text) == ["{{0,1,2,3,4,5,6,7}}"]


def test_collective_inside_jit_uses_the_axis_env():
  text = xla_computation(jax.jit(lambda x: lax.psum(x, "i")), axis_env=IJ)(
    1.0
  ).as_hlo_text()
  assert _groups(text) == ["{{0,2,4,6},{1,3,5,7}}"]


def test_unbound_axis_name_raises_name_error_listing_the_axis_env():
  with pytest.raises(
    NameError,
    match=r"unbound axis name: k.*axis_env, "
    r"here \['i', 'j'\]",
  ):
    xla_computation(lambda x: lax.psum(x, "k"), axis_env=IJ)(1.0)


@pytest.mark.parametrize(
  "axis_env, error, message",
  [
    ("i", TypeError, "got 'i'"),
    ([("i", 0)], ValueError, "axis 'i' has size 0"),
    ([("i",)], TypeError, r"got the entry \('i',\)"),
    ([("i", 2), ("i", 3)], ValueError, "'i' appears more than once"),
  ],
)
def test_malformed_axis_env_is_rejected(axis_env, error, message):
  with pytest.raises(error, match=message):
    xla_computation(lambda x: x, axis_env=axis_env)


# ----------------------------------------------------------- static args
def test_static_argnums_fold_in_constants_and_drop_parameters():
  c = xla_computation(lambda x, n, y: x * n + y, static_argnums=1)(
    1.0, 3, jnp.ones(2)
  )
  assert repr(c.program_shape()) == "(Arg_0: f32[], Arg_1: f32[2]) -> (f32[2])"
  assert "f32[] constant(3)" in c.as_hlo_text()


def test_negative_static_argnum_counts_from_the_end():
  c = xla_computation(lambda x, n: x * n, static_argnums=(-1,))(1.0, 7)
  assert repr(c.program_shape()) == "(Arg_0: f32[]) -> (f32[])"
  assert "f32[] constant(7)" in c.as_hlo_text()


def test_static_argument_need_not_be_hashable_or_an_array():
  c = xla_computation(lambda x, opts: x * opts["scale"][0], static_argnums=1)(
    1.0, {"scale": [5.0]}
  )
  assert "f32[] constant(5)" in c.as_hlo_text()


def test_static_argnum_past_the_arguments_is_rejected():
  with pytest.raises(
    ValueError,
    match="static_argnums refers to argument 3,"
    " but the function was given 1 positional argument",
  ):
    xla_computation(lambda x: x, static_argnums=3)(1.0)


def test_static_argnums_must_be_ints():
  with pytest.raises(
    TypeError,
    match="static_argnums must be an int or a sequence of ints; got 'a'",
  ):
    xla_computation(lambda x: x, static_argnums="a")


# ------------------------------------------------------------ tuple_args
def test_tuple_args_true_gives_one_tuple_parameter():
  c = xla_computation(lambda x, y: x + y, tuple_args=True)(jnp.ones(3), 1.0)
  params = c.program_shape().parameter_shapes()
  assert len(params) == 1
  assert [repr(s) for s in params[0].tuple_shapes()] == ["f32[3]{0}", "f32[]"]
  assert "get-tuple-element(" in c.as_hlo_text()


def test_tuple_args_none_tuples_only_above_100_arguments():
  f = lambda *xs: sum(xs)
  many = xla_computation(f, tuple_args=None)(*range(101)).program_shape()
  few = xla_computation(f, tuple_args=None)(*range(100)).program_shape()
  assert [s.is_tuple() for s in many.parameter_shapes()] == [True]
  assert len(few.parameter_shapes()) == 100
  assert not any(s.is_tuple() for s in few.parameter_shapes())


# ---------------------------------------------------------- return_shape
def test_return_shape_gives_the_output_tree_of_shape_dtype_structs():
  c, shapes = xla_computation(
    lambda x: {"a": x, "b": (x.sum(), x.astype(jnp.int32))}, return_shape=True
  )(np.ones((2, 3), np.float32))
  assert isinstance(c, XlaComputation)
  assert shapes == {
    "a": jax.ShapeDtypeStruct((2, 3), jnp.float32),
    "b": (
      jax.ShapeDtypeStruct((), jnp.float32),
      jax.ShapeDtypeStruct((2, 3), jnp.int32),
    ),
  }


# -------------------------------------------------------- donate_argnums
def test_donated_argument_aliases_a_matching_output():
  text = xla_computation(lambda x, y: x + y, donate_argnums=0)(
    jnp.ones(3), jnp.ones(3)
  ).as_hlo_text()
  assert "input_output_alias={ {0}: (0, {}, may-alias) }" in text


def test_donation_with_tuple_args_aliases_the_tuple_element():
  c = xla_computation(lambda x, y: x + y, donate_argnums=1, tuple_args=True)
  text = c(jnp.ones(3), jnp.ones(3)).as_hlo_text()
  assert "input_output_alias={ {0}: (0, {1}, may-alias) }" in text


def test_without_donation_there_is_no_alias():
  text = xla_computation(lambda x, y: x + y)(jnp.ones(3), 1.0).as_hlo_text()
  assert "input_output_alias" not in text


def test_donation_without_a_matching_output_warns_and_records_nothing():
  with pytest.warns(UserWarning, match="Some donated buffers were not usable"):
    text = xla_computation(lambda x: x.sum(), donate_argnums=0)(
      jnp.ones(3)
    ).as_hlo_text()
  assert "input_output_alias" not in text


def test_argument_both_static_and_donated_is_rejected():
  with pytest.raises(
    ValueError,
    match=r"positions \[1\] are in "
    "static_argnums and donate_argnums",
  ):
    xla_computation(lambda x, n: x, static_argnums=1, donate_argnums=1)(1.0, 2)


# ---------------------------------------------------------------- backend
@pytest.mark.parametrize("backend", ["cpu", "cuda", "tpu", "gpu"])
def test_backend_lowers_for_platforms_this_machine_lacks(backend):
  text = xla_computation(
    lambda x: lax.psum(jnp.sin(x), "i"), axis_env=[("i", 2)], backend=backend
  )(jnp.ones(3)).as_hlo_text()
  assert _groups(text) == ["{{0,1}}"]


def test_backend_selects_platform_specific_lowering():
  # A hostcb tap is an FFI custom call whose target depends on the platform.
  f = lambda x: hostcb.id_print(x, output_stream=None)
  cpu = xla_computation(f, backend="cpu")(1.0).as_hlo_text()
  cuda = xla_computation(f, backend="cuda")(1.0).as_hlo_text()
  # On CPU the native engine's handler, where it is built (by name: an
  # id_print needs no registration, docs/export.md).
  cpu_target = (
    "hostcb_tap_v1" if engine.available() else "xla_ffi_python_cpu_callback"
  )
  assert f'custom_call_target="{cpu_target}"' in cpu
  # For CUDA: the GPU engine's handler where this process has an NVIDIA GPU
  # it serves, else XLA's Python callback (the program runs elsewhere).
  cuda_target = (
    "hostcb_tap_v1" if engine.serves("cuda") else "xla_ffi_python_gpu_callback"
  )
  assert f'custom_call_target="{cuda_target}"' in cuda


# The custom call targets of a program lowered for CUDA, two ways.
_CUDA_LOWERINGS = {
  "xla_computation": lambda f: {
    line.split('custom_call_target="')[1].split('"')[0]
    for line in xla_computation(f, backend="cuda")(1.0)
    .as_hlo_text()
    .splitlines()
    if 'custom_call_target="' in line
  },
  "jit lower": lambda f: {
    line.split("stablehlo.custom_call @")[1].split("(")[0]
    for line in jax.jit(f)
    .trace(1.0)
    .lower(lowering_platforms=("cuda",))
    .as_text()
    .splitlines()
    if "stablehlo.custom_call @" in line
  },
}
_CALLBACKS = {
  "id_tap": lambda x: hostcb.id_tap(lambda *a: None, x * 2),
  "id_print": lambda x: hostcb.id_print(x, output_stream=None),
  "call": lambda x: hostcb.call(
    lambda y: y + 1, x, result_shape=jax.ShapeDtypeStruct((), jnp.float32)
  ),
  "debug.print": lambda x: (hostcb.debug.print("{}", x), x)[1],
}


@pytest.mark.parametrize("route", sorted(_CUDA_LOWERINGS))
@pytest.mark.parametrize("callback", sorted(_CALLBACKS))
def test_lowering_for_cuda_without_a_gpu_warns_nothing_and_takes_xlas_callback(
  route, callback, monkeypatch, capfd
):
  if engine.gpu.has_local_gpu():
    pytest.skip("this process has an NVIDIA GPU: the GPU engine serves it")
  # The messages said once per process, unsaid: any would be said here.
  monkeypatch.setattr(engine, "_warned", [False])
  monkeypatch.setattr(engine.gpu, "_warned", [False])
  monkeypatch.setattr(hostcb._core.by_name, "_warned", set())
  capfd.readouterr()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    targets = _CUDA_LOWERINGS[route](_CALLBACKS[callback])
  assert [str(w.message) for w in caught] == []
  assert capfd.readouterr() == ("", "")
  assert targets == {"xla_ffi_python_gpu_callback"}


def test_lowering_that_needs_the_missing_platform_raises():
  # jax.debug.print asks for the CUDA client while lowering.
  if any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("this machine has a CUDA backend: the lowering would work")
  f = lambda x: (jax.debug.print("{}", x), x)[1]
  with pytest.raises(RuntimeError, match="Unknown backend cuda"):
    xla_computation(f, backend="cuda")(1.0)


def test_unknown_backend_is_rejected():
  with pytest.raises(
    ValueError,
    match="backend must be one of 'cpu', 'gpu',"
    " 'cuda', 'rocm', 'tpu'; got 'metal'",
  ):
    xla_computation(lambda x: x, backend="metal")


# ------------------------------------------------------ in/out partitions
def test_in_parts_become_parameter_shardings():
  text = xla_computation(lambda x, y: x * y, in_parts=((2, 1), None))(
    jnp.ones((4, 2)), 1.0
  ).as_hlo_text()
  assert re.search(
    r"f32\[4,2\]\{1,0\} parameter\(0\), "
    r"sharding=\{devices=\[2,1\]0,1\}",
    text,
  )
  assert re.search(r"f32\[\] parameter\(1\), sharding=\{replicated\}", text)


def test_a_single_in_parts_tuple_applies_to_every_argument():
  text = xla_computation(lambda x, y: x + y, in_parts=(4,))(
    jnp.ones(4), jnp.ones(4)
  ).as_hlo_text()
  assert text.count("sharding={devices=[4]0,1,2,3}") == 2


def test_out_parts_become_result_shardings():
  text = xla_computation(
    lambda x: {"a": x, "b": x}, out_parts={"a": (4,), "b": None}
  )(jnp.ones(4)).as_hlo_text()
  assert re.search(
    r"ROOT \S+ = \(f32\[4\]\{0\}, f32\[4\]\{0\}\) tuple\(.*\), "
    r"sharding=\{\{devices=\[4\]0,1,2,3\}, \{replicated\}\}",
    text,
  )


def test_in_parts_of_the_wrong_rank_is_rejected():
  with pytest.raises(
    ValueError,
    match=r"in_parts: \(2,\) must give a "
    "positive partition count for each of the 2 dimensions",
  ):
    xla_computation(lambda x: x, in_parts=((2,),))(jnp.ones((2, 2)))


def test_in_parts_not_matching_the_arguments_is_rejected():
  with pytest.raises(
    ValueError, match="in_parts must be None, a tuple of partition counts"
  ):
    xla_computation(lambda x: x, in_parts=((2,), (2,)))(jnp.ones(2))


# ------------------------------------------- instantiate_const_outputs
def test_instantiate_const_outputs_is_ignored():
  f = lambda x: (x, 1.0)
  assert (
    xla_computation(f, instantiate_const_outputs=True)(1.0).as_hlo_text()
    == xla_computation(f)(1.0).as_hlo_text()
  )


# ------------------------------------------------ the computation object
def test_module_view_serializes_to_the_same_proto():
  c = xla_computation(lambda x: jnp.exp(x))(1.0)
  proto = c.as_serialized_hlo_module_proto()
  assert isinstance(proto, bytes)
  assert c.as_hlo_module().as_serialized_hlo_module_proto() == proto


def test_dot_graph_is_graphviz_source_of_the_entry_computation():
  dot = xla_computation(lambda x: lax.psum(x, "i"), axis_env=[("i", 4)])(
    1.0
  ).as_hlo_dot_graph()
  assert dot.startswith("digraph G {")
  assert "replica_groups={{0,1,2,3}}" in dot


def test_hlo_module_view_names_the_module_and_its_computations():
  module = xla_computation(lambda x: jnp.sin(x))(1.0).as_hlo_module()
  assert module.name == "xla_computation__lambda_"
  assert module.to_string().startswith("HloModule xla_computation__lambda")
  assert module.computations()[-1].name.startswith("main.")


def test_hlo_module_view_lists_instructions_and_their_operands():
  entry = (
    xla_computation(lambda x: jnp.sin(x))(1.0)
    .as_hlo_module()
    .computations()[-1]
  )
  try:
    instructions = entry.instructions()
  except NotImplementedError as e:
    pytest.skip(f"jaxlib lacks HloComputation.instructions: {e}")
  texts = [i.to_string() for i in instructions]
  sine = next(i for i in instructions if "sine(" in i.to_string())
  assert [o.to_string() for o in sine.operands()] == [texts[0]]
  assert "parameter(0)" in texts[0]


def test_array_shape_tuple_shapes_raises_instead_of_aborting():
  shape = xla_computation(lambda x: x)(1.0).program_shape()
  with pytest.raises(TypeError, match="needs a tuple shape"):
    shape.parameter_shapes()[0].tuple_shapes()


def test_tuple_shape_dimensions_raise_instead_of_aborting():
  result = xla_computation(lambda x: x)(1.0).program_shape().result_shape()
  with pytest.raises(TypeError, match="needs an array shape"):
    result.dimensions()
  with pytest.raises(TypeError, match="needs an array shape"):
    result.rank()
  with pytest.raises(TypeError, match="needs an array shape"):
    result.element_type()


def test_as_hlo_text_rejects_a_non_bool_flag():
  with pytest.raises(TypeError, match="print_large_constants must be a bool"):
    xla_computation(lambda x: x)(1.0).as_hlo_text("yes")


def test_print_large_constants_shows_the_elements():
  f = lambda x: x + np.arange(20, dtype=np.float32)
  c = xla_computation(f)(jnp.ones(20))
  assert "constant({...})" in c.as_hlo_text()
  assert "constant({0, 1, 2," in c.as_hlo_text(True)


def test_partial_is_named_after_the_wrapped_function():
  def scale(x, k):
    return x * k

  assert (
    xla_computation(functools.partial(scale, k=2.0))(1.0).name()
    == "xla_computation_scale"
  )


def test_install_restores_jax_xla_computation():
  hostcb.install()
  assert jax.xla_computation is xla_computation
  assert _groups(
    jax.xla_computation(lambda x: lax.psum(x, "i"), axis_env=[("i", 2)])(
      1.0
    ).as_hlo_text()
  ) == ["{{0,1}}"]


def test_no_device_transfer_happens_for_example_arguments():
  # A ShapeDtypeStruct has no data; an 8 GiB example would not fit here.
  big = jax.ShapeDtypeStruct((1 << 31,), jnp.float32)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    c = xla_computation(lambda x: x * 2)(big)
  assert (
    repr(c.program_shape()) == "(Arg_0: f32[2147483648]) -> (f32[2147483648])"
  )


# ---------------------------------------------------------- legacy fidelity
def test_module_to_string_takes_hlo_print_options_showing_named_call():
  from hostcb.xla_computation import HloPrintOptions

  @jax.named_call
  def my_test_function(x):
    return x**2

  c = xla_computation(jax.jit(my_test_function))(2.0)
  options = HloPrintOptions.short_parsable()
  options.print_metadata = True
  with_metadata = c.as_hlo_module().to_string(options)
  assert 'op_name="my_test_function/integer_pow"' in with_metadata
  assert "op_name" not in c.as_hlo_module().to_string(
    HloPrintOptions.short_parsable()
  )


def test_module_to_string_rejects_other_options():
  module = xla_computation(lambda x: x)(1.0).as_hlo_module()
  with pytest.raises(
    TypeError,
    match=r"options must be an HloPrintOptions "
    r".* or None; got 'short'",
  ):
    module.to_string("short")


def _pmap_mean(x):
  return jax.pmap(jnp.mean)(x)


needs_pmap_staging = pytest.mark.skipif(
  not jax_at_least(0, 10),
  reason=f"pmap inside xla_computation per replica needs jax >= 0.10 (a "
  f"pmap that is a jit of a shard_map; jax 0.8's pmap lowers by its own "
  f"rules); this is jax {jax.__version__}",
)


@needs_pmap_staging
def test_pmap_of_more_replicas_than_devices_stages_out():
  assert jax.local_device_count() < 8
  c = xla_computation(_pmap_mean)(jnp.arange(8))
  assert repr(c.program_shape()) == "(Arg_0: s32[8]) -> (f32[8])"
  text = c.as_hlo_text()
  assert _groups(text) == ["{{0,1,2,3,4,5,6,7}}"]
  assert "s32[1]{0} dynamic-slice(" in text
  assert "f32[8]{0} dynamic-update-slice(" in text


@needs_pmap_staging
def test_pmap_axis_is_inner_to_the_axis_env():
  def f(x):
    return jax.pmap(lambda a: lax.psum(a, ("i", "j")), "j")(x)

  text = xla_computation(f, axis_env=[("i", 2)])(jnp.ones(3)).as_hlo_text()
  # legacy: the psum over both axes, then the unsharding sum over 'j'
  assert _groups(text) == ["{{0,1,2,3,4,5}}", "{{0,1,2},{3,4,5}}"]


@needs_pmap_staging
def test_pmap_with_unmapped_argument_and_output():
  def f(x, y):
    return jax.pmap(
      lambda a, b: (a + b, lax.psum(b, "i")),
      "i",
      in_axes=(0, None),
      out_axes=(0, None),
    )(x, y)

  c = xla_computation(f)(jnp.ones((4, 3)), jnp.ones(3))
  assert repr(c.program_shape()) == (
    "(Arg_0: f32[4,3], Arg_1: f32[3]) -> (f32[4,3], f32[3])"
  )
  assert _groups(c.as_hlo_text()) == ["{{0,1,2,3}}", "{{0,1,2,3}}"]


@needs_pmap_staging
def test_pmap_axis_index_counts_replicas():
  text = xla_computation(
    lambda x: jax.pmap(lambda a: a * lax.axis_index("i"), "i")(x)
  )(jnp.ones(8)).as_hlo_text()
  assert "u32[] replica-id()" in text
  assert "u32[] constant(8)" in text


@needs_pmap_staging
def test_nested_pmap_is_refused_with_a_hint():
  f = lambda x: jax.pmap(jax.pmap(lambda a: a, "j"), "i")(x)
  with pytest.raises(
    NotImplementedError,
    match=r"a pmap inside another pmap"
    r" is not supported \(inner axis 'j'\); give the outer "
    r"axes in axis_env",
  ):
    xla_computation(f)(jnp.ones((2, 3)))


@needs_pmap_staging
def test_pmap_still_runs_after_xla_computation_staged_one():
  xla_computation(_pmap_mean)(jnp.arange(8))
  n = jax.local_device_count()
  np.testing.assert_array_equal(
    jax.pmap(lambda x: x * 2)(jnp.arange(n)), 2 * np.arange(n)
  )


def test_lambda_module_name_keeps_the_trailing_underscore():
  assert (
    xla_computation(lambda x: x)(1.0)
    .as_hlo_text()
    .startswith("HloModule xla_computation__lambda_, ")
  )


def test_program_shape_names_a_tupled_parameter_arg_tuple():
  c = xla_computation(lambda x, y: x + y, tuple_args=True)(1.0, 2.0)
  assert repr(c.program_shape()) == "(arg_tuple: (f32[], f32[])) -> (f32[])"


def test_static_argnum_out_of_range_says_what_legacy_said():
  with pytest.raises(
    ValueError,
    match=re.escape(
      "jitted function has static_argnums=(2,), donate_argnums=() but was "
      "called with only 2 positional arguments."
    ),
  ):
    xla_computation(lambda x, n: x * n, static_argnums=2)(1.0, 3)


def test_non_array_argument_says_what_legacy_said():
  with pytest.raises(
    TypeError,
    match=re.escape(
      "Argument 'a' of type <class 'str'> is not a valid JAX type (argument "
      "0 must be"
    ),
  ):
    xla_computation(lambda x: x)("a")


def test_unbound_axis_name_says_what_legacy_said():
  with pytest.raises(
    NameError,
    match=re.escape(
      "unbound axis name: k. The following axis names (e.g. defined by pmap)"
      " are available to collective operations: ['i', 'j']. "
    ),
  ):
    xla_computation(lambda x: lax.psum(x, "k"), axis_env=IJ)(1.0)
