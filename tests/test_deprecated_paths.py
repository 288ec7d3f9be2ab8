"""The old paths of names that moved behind ``hostcb._core`` (issue 35)
still work, with a DeprecationWarning naming the public name to use."""

# moves.sh: names the old paths on purpose

from __future__ import annotations

import importlib
import re

import pytest

import hostcb

# (old module, name, the public name now)
_MOVED = [
  ("hostcb.import_hook", "install_jax_callbacks", "install_jax_callbacks"),
  ("hostcb.import_hook", "uninstall_jax_callbacks", "uninstall_jax_callbacks"),
  ("hostcb.import_hook", "jax_callbacks_installed", "jax_callbacks_installed"),
  ("hostcb.distributed", "set_timeout", "set_barrier_timeout"),
  ("hostcb.distributed", "get_timeout", "get_barrier_timeout"),
  ("hostcb.lowering", "BUFFER_CALL_MIN_BYTES", "BUFFER_CALL_MIN_BYTES"),
]


@pytest.mark.parametrize(("old", "name", "public"), _MOVED)
def test_an_old_path_warns_and_gives_the_public_object(old, name, public):
  module = importlib.import_module(old)
  with pytest.warns(
    DeprecationWarning,
    match=re.escape(f"{old}.{name} is deprecated: use hostcb.{public}"),
  ):
    value = getattr(module, name)
  assert value is getattr(hostcb, public)
  assert public in hostcb.__all__


def test_an_old_module_is_reachable_as_an_attribute_of_hostcb():
  with pytest.warns(
    DeprecationWarning,
    match=re.escape(
      "hostcb.distributed.get_timeout is deprecated: use "
      "hostcb.get_barrier_timeout"
    ),
  ):
    seconds = hostcb.distributed.get_timeout()
  assert seconds == hostcb.get_barrier_timeout()


def test_a_private_name_through_an_old_path_names_its_private_module():
  module = importlib.import_module("hostcb.lowering")
  with pytest.warns(
    DeprecationWarning,
    match=re.escape("hostcb.lowering.BUFFER_CALL_MIN_BYTES is deprecated"),
  ):
    module.BUFFER_CALL_MIN_BYTES
  with pytest.warns(
    DeprecationWarning,
    match=re.escape(
      "hostcb.lowering._nbytes is deprecated: use "
      "hostcb._core.lowering._nbytes (private)"
    ),
  ):
    module._nbytes


def test_a_name_that_never_was_there_raises_attribute_error():
  module = importlib.import_module("hostcb.lowering")
  with pytest.raises(AttributeError):
    module.no_such_name
