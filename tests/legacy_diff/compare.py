"""How two scenario outputs are compared.

Line by line and exactly, with two rules:

* ``unordered`` scenarios (taps from several devices) compare the sorted
  lines;
* an error line (``raised ...``, ``barrier raised ...`` or an exception
  line ``SomeError: ...`` of an embedded traceback) of hostcb matches
  legacy's when it *starts with* legacy's line: hostcb keeps legacy's
  wording and adds its own detail after it.
"""

from __future__ import annotations

import re

_ERROR_LINE = re.compile(
  r"^(raised |barrier raised |[A-Za-z_][\w.]*"
  r"(Error|Exception): )"
)


def _lines(text: str, unordered: bool) -> list[str]:
  lines = text.splitlines()
  return sorted(lines) if unordered else lines


def expected_view(legacy: str, ours: str, unordered: bool) -> str:
  """Legacy's output as hostcb must print it.

  Legacy's lines, where an error line that hostcb extended with its own
  detail (see the module doc) is replaced by hostcb's.  A scenario matches
  when this equals ``ours`` with the same ordering rule applied.
  """
  a, b = _lines(legacy, unordered), _lines(ours, unordered)
  out = []
  for i, line in enumerate(a):
    theirs = b[i] if i < len(b) else None
    if (
      theirs is not None
      and theirs != line
      and _ERROR_LINE.match(line)
      and theirs.startswith(line)
    ):
      out.append(theirs)
    else:
      out.append(line)
  return "\n".join(out)


def ours_view(ours: str, unordered: bool) -> str:
  """hostcb's output with the ordering rule applied."""
  return "\n".join(_lines(ours, unordered))
