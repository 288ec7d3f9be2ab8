"""Huge pages for large buffers about to be written: used by the
lowering of calls (``hostcb._core.lowering``) and by
``hostcb.buffer_callback``.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Callable

import numpy as np


# ------------------------------------------------ writing fresh buffers fast
# XLA allocates each large output buffer afresh, so the first write into it
# faults in every 4 KiB page, which costs several times the copy itself
# (about 40 ms for 64 MB here, against 9 ms for the copy).  Asking Linux
# for transparent huge pages on the buffer (madvise MADV_HUGEPAGE, a hint
# that only changes the page size of that range) makes it 512 times fewer
# faults.  Applied to output buffers of at least HUGE_PAGE_MIN_BYTES.
HUGE_PAGE_MIN_BYTES = 4 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def _load_madvise() -> Callable[[int, int], int] | None:
  if not sys.platform.startswith("linux"):
    return None
  try:
    fn = ctypes.CDLL(None, use_errno=True).madvise
  except (OSError, AttributeError):  # no madvise in this libc: not advised
    return None
  fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  fn.restype = ctypes.c_int
  return lambda addr, length: fn(addr, length, _MADV_HUGEPAGE)


_madvise_huge = _load_madvise()


def advise_huge_pages(array: np.ndarray) -> None:
  """Hints the OS to back a large, about-to-be-written array with huge pages.

  Only the whole 2 MiB pages inside the array are advised; does nothing
  off Linux, for small arrays, or if the kernel says no.
  """
  if _madvise_huge is None or array.nbytes < HUGE_PAGE_MIN_BYTES:
    return
  addr = array.ctypes.data
  start = -(-addr // _HUGE_PAGE) * _HUGE_PAGE
  end = (addr + array.nbytes) // _HUGE_PAGE * _HUGE_PAGE
  if end > start:
    _madvise_huge(start, end - start)
