"""Random arrays for the differential tests of array text (NumPy only:
tests/test_native_array_text.py loads it in .venv-legacy too)."""

from __future__ import annotations

import numpy as np


def random_arrays(rng, count: int) -> list[np.ndarray]:
  """Floats from random bits, random magnitudes and short decimals, with
  nan, inf and zeros among them; integers to their limits; bools; in
  shapes of rank 0 to 3."""
  out = []
  for t, u in ((np.float32, np.uint32), (np.float64, np.uint64)):
    bits = rng.integers(0, np.iinfo(u).max, count, dtype=u, endpoint=True)
    with np.errstate(over="ignore"):
      mags = 10.0 ** rng.uniform(-12, 20, count) * rng.choice([-1, 1], count)
    decimals = rng.integers(-(10**6), 10**6, count) / rng.choice(
      [1, 2, 4, 10, 100, 1000], count
    )
    specials = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-4, 1e6, 1e8]
    for pool in (bits.view(t), mags.astype(t), decimals.astype(t)):
      pool = np.concatenate([pool, np.array(specials, t)])
      out += [np.array(v, t) for v in pool[: count // 4]]
      for _ in range(count // 8):
        rank = int(rng.integers(1, 4))
        shape = tuple(rng.integers(1, 6 if rank > 1 else 14, rank))
        out.append(rng.choice(pool, shape).astype(t))
  for t in (np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64):
    info = np.iinfo(t)
    for _ in range(count // 20):
      shape = tuple(rng.integers(0, 6, rng.integers(0, 4)))
      out.append(rng.integers(info.min, info.max, shape, t, endpoint=True))
  out += [rng.integers(0, 2, (k,)).astype(bool) for k in range(20)]
  return out
