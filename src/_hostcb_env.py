"""hostcb's one parser of on/off environment switches (``HOSTCB_*``,
``JAX_HOST_CALLBACK_INLINE``).

A top-level module of the standard library alone, so that the import hook
that the ``.pth`` file runs at interpreter start
(:mod:`_hostcb_startup_finder`) can read its switch without importing hostcb
or JAX; :mod:`hostcb.config` and the engine read theirs through it too.

A switch is true for ``1``, ``true``, ``t``, ``yes``, ``y`` or ``on``, false
for ``0``, ``false``, ``f``, ``no``, ``n``, ``off`` or the empty string (any
case, blanks around ignored), and anything else is an error: a misspelt
value must not silently mean the opposite of what was meant (e.g.
``HOSTCB_DISABLE_NATIVE=false`` turning the engine off).
"""

from __future__ import annotations

import os

TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE = frozenset({"0", "false", "f", "no", "n", "off", ""})


def parse_flag(var: str, raw: str) -> bool:
  """The value of switch ``var`` given as ``raw``; ValueError if ``raw`` is
  neither true nor false."""
  value = raw.strip().lower()
  if value in TRUE:
    return True
  if value in FALSE:
    return False
  raise ValueError(
    f"environment variable {var} must be a boolean such as "
    f"'1', 'true', '0' or 'false'; got {raw!r}"
  )


def env_flag(var: str, default: bool = False) -> bool:
  """Switch ``var`` of the environment (``default`` when it is unset)."""
  raw = os.environ.get(var)
  if raw is None:
    return default
  return parse_flag(var, raw)
