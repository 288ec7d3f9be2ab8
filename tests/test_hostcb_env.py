"""The one parser of hostcb's on/off environment switches (src/_hostcb_env.py)
and the switches that go through it."""

from __future__ import annotations

import pytest

import _hostcb_env
from _helpers import run_python


@pytest.mark.parametrize("raw", ["1", "true", "True", " yes ", "y", "on", "T"])
def test_true_spellings_are_true(raw):
  assert _hostcb_env.parse_flag("HOSTCB_X", raw) is True


@pytest.mark.parametrize(
  "raw", ["0", "false", "FALSE", " no", "n", "off", "f", ""]
)
def test_false_spellings_are_false(raw):
  assert _hostcb_env.parse_flag("HOSTCB_X", raw) is False


@pytest.mark.parametrize("raw", ["2", "maybe", "disable", "tru"])
def test_a_value_that_is_no_boolean_is_rejected_naming_the_variable(raw):
  with pytest.raises(ValueError) as e:
    _hostcb_env.parse_flag("HOSTCB_X", raw)
  assert str(e.value) == (
    "environment variable HOSTCB_X must be a boolean such as '1', 'true', "
    f"'0' or 'false'; got {raw!r}"
  )


def test_an_unset_switch_takes_its_default(monkeypatch):
  monkeypatch.delenv("HOSTCB_X_UNSET", raising=False)
  assert _hostcb_env.env_flag("HOSTCB_X_UNSET") is False
  assert _hostcb_env.env_flag("HOSTCB_X_UNSET", True) is True


def test_disable_native_false_keeps_the_engine_on():
  # Before the one parser, any value but "" and "0" turned the engine off.
  proc = run_python(
    """
from hostcb._engine import native
print(native.disabled_by_user())
""",
    env_extra={"HOSTCB_DISABLE_NATIVE": "false"},
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "False\n"


def test_disable_native_with_no_boolean_stops_the_import():
  proc = run_python(
    "import hostcb", env_extra={"HOSTCB_DISABLE_NATIVE": "please"}
  )
  assert proc.returncode != 0
  assert (
    "ValueError: environment variable HOSTCB_DISABLE_NATIVE must be a "
    "boolean such as '1', 'true', '0' or 'false'; got 'please'" in proc.stderr
  ), proc.stderr


def test_no_engine_warning_with_no_boolean_is_rejected():
  proc = run_python(
    """
from hostcb import _engine as engine
from hostcb._engine import native
native._disabled_by_user = False
engine.warn_if_unavailable()
""",
    env_extra={"HOSTCB_NO_ENGINE_WARNING": "quiet"},
  )
  assert proc.returncode != 0
  assert (
    "environment variable HOSTCB_NO_ENGINE_WARNING must be a boolean"
    in proc.stderr
  ), proc.stderr
