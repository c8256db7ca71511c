"""Per-sample augmentation seeds: a 64-bit seed for each place in an epoch, from ``(seed, epoch)``.

Pure integer hashing (splitmix64's finaliser), so a sample's augmentation depends only on the run's
seed, the epoch and its place in the epoch's stream, never on workers, ranks' timing or the OS.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shardkit.errors import LoaderError

__all__ = ["check_seed", "sample_seed", "sample_seeds"]

_MASK64 = (1 << 64) - 1


def check_seed(seed: int, epoch: int) -> None:
    """Raise LoaderError unless ``seed`` and ``epoch`` are in [0, 2**64)."""
    if not 0 <= seed <= _MASK64:
        raise LoaderError(f"seed must be in [0, 2**64), got {seed}")
    if not 0 <= epoch <= _MASK64:
        raise LoaderError(f"epoch must be in [0, 2**64), got {epoch}")


def _mix64(z: int) -> int:
    """splitmix64's finaliser (Steele et al. 2014): a bijection on 64-bit ints that avalanches."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """64-bit seed of the augmentation RNG of the sample at global ``position`` of an epoch.

    ``position`` is the sample's place in the padded epoch stream shared by all ranks (see
    :func:`~shardkit.loader.epochs.plan.stream_positions`), so it never depends on workers and
    padded repeats get their own seeds. Raises LoaderError for arguments outside [0, 2**64).

    >>> sample_seed(0, 0, 1) != sample_seed(0, 0, 2) != sample_seed(0, 1, 1)
    True
    """
    check_seed(seed, epoch)
    if not 0 <= position <= _MASK64:
        raise LoaderError(f"position must be in [0, 2**64), got {position}")
    return _mix64(_mix64(_mix64(seed) ^ epoch) ^ position)


def sample_seeds(seed: int, epoch: int, positions: npt.ArrayLike) -> np.ndarray:
    """Vectorised :func:`sample_seed`: uint64 array, equal element-wise to the scalar version.

    >>> int(sample_seeds(3, 1, [7])[0]) == sample_seed(3, 1, 7)
    True
    """
    check_seed(seed, epoch)
    pos = np.asarray(positions)
    if pos.size and (pos.dtype.kind not in "iu" or pos.min() < 0):
        raise LoaderError("positions must be non-negative integers")
    z = pos.astype(np.uint64).reshape(-1) ^ np.uint64(_mix64(_mix64(seed) ^ epoch))
    z = z + np.uint64(0x9E3779B97F4A7C15)  # uint64 arrays wrap modulo 2**64, as intended
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).reshape(pos.shape)
