"""The 64-bit mixers the project hashes with, defined once.

Both are bijections on 64-bit integers whose arithmetic wraps modulo 2**64 on purpose:
- SplitMix64 (Steele, Lea and Flood 2014): add the golden-ratio increment, then the finalizer
  (xor-shift 30, multiply, xor-shift 27, multiply, xor-shift 31);
- fmix64, MurmurHash3's finalizer (xor-shift 33, multiply, xor-shift 33, multiply, xor-shift 33).
Their outputs are part of stored artefacts (shuffle orders, sampler draws, quality features, MinHash
signatures), so the constants never change.
"""

from __future__ import annotations

import numpy as np

GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1
_SPLITMIX_MUL_1 = np.uint64(0xBF58476D1CE4E5B9)
_SPLITMIX_MUL_2 = np.uint64(0x94D049BB133111EB)
_FMIX_MUL_1 = 0xFF51AFD7ED558CCD
_FMIX_MUL_2 = 0xC4CEB9FE1A85EC53


def splitmix64_finalizer(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function alone, elementwise on uint64."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _SPLITMIX_MUL_1
        z = (z ^ (z >> np.uint64(27))) * _SPLITMIX_MUL_2
        return z ^ (z >> np.uint64(31))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 of each uint64: the golden-ratio increment, then the finalizer."""
    with np.errstate(over="ignore"):
        return splitmix64_finalizer(x + np.uint64(GOLDEN_GAMMA))


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's fmix64, elementwise on uint64 (the input is not modified)."""
    h = h ^ (h >> np.uint64(33))
    h *= np.uint64(_FMIX_MUL_1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_FMIX_MUL_2)
    h ^= h >> np.uint64(33)
    return h


def fmix64_int(h: int) -> int:
    """fmix64 of one Python int (the reference the vectorised hashes are tested against)."""
    h ^= h >> 33
    h = (h * _FMIX_MUL_1) & MASK64
    h ^= h >> 33
    h = (h * _FMIX_MUL_2) & MASK64
    h ^= h >> 33
    return h
