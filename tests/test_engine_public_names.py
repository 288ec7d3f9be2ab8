"""The public module ``hostcb.engine``: what the docs tell users to read of
the engine, re-exported from the private ``hostcb._engine``."""

from __future__ import annotations

import pathlib
import pickle
import re

import hostcb
import hostcb._engine
import hostcb._engine.gpu
import hostcb._engine.native
import hostcb.engine

_REPO = pathlib.Path(__file__).resolve().parent.parent


def test_each_public_name_is_the_engines_own_object():
  internal = {
    "available": hostcb._engine.available,
    "unavailable_reason": hostcb._engine.unavailable_reason,
    "counters": hostcb._engine.counters,
    "tap_fallbacks": hostcb._engine.tap_fallbacks,
    "counts_executables": hostcb._engine.native.counts_executables,
    "gpu_publication": hostcb._engine.gpu.publication,
    "EngineFallbackWarning": hostcb._engine.EngineFallbackWarning,
    "ProcessLocalFunctionError": hostcb._engine.ProcessLocalFunctionError,
  }
  assert sorted(hostcb.engine.__all__) == sorted(internal)
  for name, obj in internal.items():
    assert getattr(hostcb.engine, name) is obj, name


def test_the_public_classes_are_named_by_their_public_module():
  for cls in (
    hostcb.engine.ProcessLocalFunctionError,
    hostcb.engine.EngineFallbackWarning,
  ):
    assert f"{cls.__module__}.{cls.__qualname__}" == (
      f"hostcb.engine.{cls.__name__}"
    )


def test_the_error_class_pickles_by_its_public_path():
  data = pickle.dumps(hostcb.engine.ProcessLocalFunctionError)
  assert b"hostcb.engine" in data and b"_engine" not in data
  assert pickle.loads(data) is hostcb.engine.ProcessLocalFunctionError


def test_every_engine_name_the_docs_give_is_public():
  pages = [_REPO / "README.md", *sorted((_REPO / "docs").rglob("*.md"))]
  named = {
    (page.name, m)
    for page in pages
    for m in re.findall(r"hostcb\.engine\.(\w+)", page.read_text())
  }
  assert {n for n in named if n[1] not in hostcb.engine.__all__} == set()
