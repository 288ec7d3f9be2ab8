"""scripts/wheel_smoke.py's check that an install is the production build:
no function of the test build in the engine (tests/native/engine_testing.cc,
added where setup.py builds with ``HOSTCB_TEST_BUILD=1``), and no C++
source in the installed package.  ``make check-wheels`` runs the check on
each wheel and source install; here it runs against the test build that
``make install`` makes, which it must refuse."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

import _native_testing
import hostcb
from _helpers import REPO, SRC

_spec = importlib.util.spec_from_file_location(
  "wheel_smoke", os.path.join(REPO, "scripts", "wheel_smoke.py")
)
wheel_smoke = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheel_smoke)


def _test_build_table() -> list[str]:
  """The names in engine_testing.cc's table of functions, in its order."""
  with open(os.path.join(REPO, "tests", "native", "engine_testing.cc")) as f:
    text = f.read()
  table = text[text.index("PyMethodDef kTestMethods[]") :]
  return re.findall(r'^    \{"(\w+)",', table, re.MULTILINE)


def test_wheel_smoke_names_every_function_of_the_test_build():
  assert list(wheel_smoke.TEST_BUILD_FUNCTIONS) == _test_build_table()


def test_wheel_smoke_refuses_the_test_build():
  module = _native_testing.module()
  with pytest.raises(SystemExit) as refused:
    wheel_smoke.check_production_build()
  assert str(refused.value) == (
    f"wheel_smoke: the native engine {module.__file__} is a test build "
    f"(HOSTCB_TEST_BUILD): it has "
    + ", ".join(wheel_smoke.TEST_BUILD_FUNCTIONS)
  )


def test_the_installed_package_carries_no_cpp_sources():
  root = os.path.dirname(hostcb.__file__)
  if os.path.realpath(root).startswith(os.path.realpath(SRC) + os.sep):
    pytest.skip("hostcb is imported from the clone's src/, not installed")
  assert wheel_smoke.sources_in(root) == []


def test_the_source_finder_finds_sources_in_subfolders(tmp_path):
  (tmp_path / "a" / "b").mkdir(parents=True)
  for name in ("a/x.cc", "a/b/y.h", "a/z.py", "w.cpp", "v.so"):
    (tmp_path / name).write_text("")
  assert wheel_smoke.sources_in(str(tmp_path)) == ["a/b/y.h", "a/x.cc", "w.cpp"]
