"""The `hostcb hlo FILE.py:FUNCTION` command."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from _helpers import hostcb_root
from hostcb.tools import cli, hlo_render

REPO = pathlib.Path(__file__).resolve().parent.parent

MODEL = """
import jax.numpy as jnp
from jax import lax


def step(w, x, scale):
  y = jnp.tanh(x @ w) * scale
  return lax.psum(y.sum(), "i"), y


class Layers:
  @staticmethod
  def double(x):
    return 2 * x
"""

needs_dot = pytest.mark.skipif(
  shutil.which("dot") is None,
  reason="Graphviz's `dot` is not installed (apt-get install graphviz)",
)


@pytest.fixture
def model(tmp_path: pathlib.Path) -> str:
  path = tmp_path / "model.py"
  path.write_text(MODEL)
  return str(path)


def _step_args(model: str) -> list[str]:
  return [
    "hlo",
    f"{model}:step",
    "--arg",
    "f32[3,2]",
    "--arg",
    "f32[4,3]",
    "--static",
    "2=0.5",
    "--axis-env",
    "i=4",
  ]


def test_subprocess_prints_hlo_text_with_the_axis_env_groups(model):
  env = dict(os.environ)
  env["PYTHONPATH"] = hostcb_root() + os.pathsep + env.get("PYTHONPATH", "")
  done = subprocess.run(
    [sys.executable, "-m", "hostcb", *_step_args(model)],
    env=env,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith(
    "HloModule xla_computation_step, entry_computation_layout="
    "{(f32[3,2]{1,0}, f32[4,3]{1,0})->(f32[], f32[4,2]{1,0})}"
  )
  assert "all-reduce(" in done.stdout
  assert "replica_groups={{0,1,2,3}}" in done.stdout


def test_static_value_is_folded_in_as_a_constant(model, capsys):
  assert cli.main(_step_args(model)) == 0
  out = capsys.readouterr().out
  assert "f32[] constant(0.5)" in out
  assert "parameter(2)" not in out


def test_dotted_function_name_is_looked_up_in_the_file(model, capsys):
  assert cli.main(["hlo", f"{model}:Layers.double", "--arg", "i32[]"]) == 0
  assert "HloModule xla_computation_double," in capsys.readouterr().out


def test_format_dot_prints_graphviz_source(model, capsys):
  assert cli.main(_step_args(model) + ["--format", "dot"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("digraph G {")
  assert "replica_groups={{0,1,2,3}}" in out


def test_output_option_writes_the_text_to_a_file(model, tmp_path, capsys):
  out_file = tmp_path / "step.hlo"
  assert cli.main(_step_args(model) + ["-o", str(out_file)]) == 0
  assert out_file.read_text().startswith("HloModule xla_computation_step,")
  assert capsys.readouterr().out == ""


@needs_dot
def test_format_png_renders_a_png_file(model, tmp_path):
  out_file = tmp_path / "step.png"
  assert (
    cli.main(_step_args(model) + ["--format", "png", "-o", str(out_file)]) == 0
  )
  data = out_file.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  assert len(data) > 1000


@needs_dot
def test_format_png_without_output_writes_function_png(
  model, tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path)
  assert cli.main(_step_args(model) + ["--format", "png"]) == 0
  assert (tmp_path / "step.png").read_bytes()[:4] == b"\x89PNG"


@needs_dot
def test_format_svg_prints_an_svg_document(model, capsys):
  assert cli.main(_step_args(model) + ["--format", "svg"]) == 0
  out = capsys.readouterr().out
  assert "<svg" in out
  assert out.rstrip().endswith("</svg>")


def test_missing_dot_says_how_to_install_graphviz(
  model, tmp_path, monkeypatch, capsys
):
  monkeypatch.setenv("PATH", str(tmp_path))  # a directory without `dot`
  assert (
    cli.main(
      _step_args(model) + ["--format", "png", "-o", str(tmp_path / "x.png")]
    )
    == 1
  )
  err = capsys.readouterr().err
  assert "needs Graphviz's `dot` program, which is not on PATH" in err
  assert "apt-get install graphviz" in err
  assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--arg", "float[3]"], "--arg expects DTYPE[DIMS] such as 'f32[4,3]'"),
    (["--arg", "f32[3,]"], "--arg: empty dimension in 'f32[3,]'"),
    (["--static", "x=1"], "--static expects POSITION=VALUE"),
    (["--static", "0=foo"], "'foo' is not a Python literal"),
    (["--static", "5=1"], "--static position 5 is past the last argument"),
    (["--axis-env", "i=0"], "--axis-env expects NAME=SIZE with a positive"),
  ],
)
def test_bad_option_values_exit_2_with_a_message(model, capsys, argv, message):
  assert cli.main(["hlo", f"{model}:step", *argv]) == 2
  err = capsys.readouterr().err
  assert err.startswith("hostcb hlo: error: ")
  assert message in err


def test_missing_function_exits_2(model, capsys):
  assert cli.main(["hlo", f"{model}:nope", "--arg", "f32[]"]) == 2
  assert "has no 'nope'" in capsys.readouterr().err


def test_missing_file_exits_2(tmp_path, capsys):
  assert cli.main(["hlo", f"{tmp_path}/absent.py:f"]) == 2
  assert "no such file:" in capsys.readouterr().err


def test_target_without_function_exits_2(model, capsys):
  assert cli.main(["hlo", model]) == 2
  assert "expected FILE.py:FUNCTION" in capsys.readouterr().err


def test_format_outside_the_choices_is_an_argparse_error(model):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["hlo", f"{model}:step", "--format", "pdf"])
  assert exit_info.value.code == 2


def test_arg_spec_parses_dtype_and_dims():
  spec = hlo_render.parse_arg_spec("bf16[2, 3]")
  assert (spec.shape, str(spec.dtype)) == ((2, 3), "bfloat16")
  scalar = hlo_render.parse_arg_spec("pred[]")
  assert (scalar.shape, str(scalar.dtype)) == ((), "bool")
