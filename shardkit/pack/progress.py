"""How a pack reports progress: totals first, then samples and input bytes as shards finish."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from shardkit.sources.base import SourceSample

Progress = Callable[[int], None]
"""Called with the number of samples (packed or skipped) just finished."""


@runtime_checkable
class PackProgress(Protocol):
    """A progress receiver that also learns the totals, so it can show a rate and an ETA.

    ``start`` is called once, before any shard is written, with the number of input samples
    and their input bytes; ``advance`` as each shard finishes (shards kept from an interrupted
    run count at once). Input bytes are the source files' sizes, the best predictor of time.
    """

    def start(self, samples: int, nbytes: int) -> None: ...

    def advance(self, samples: int, nbytes: int) -> None: ...


class _Counting:
    """Adapts a plain :data:`Progress` callable (samples only) to :class:`PackProgress`."""

    def __init__(self, callback: Progress) -> None:
        self.callback = callback

    def start(self, samples: int, nbytes: int) -> None:
        del samples, nbytes

    def advance(self, samples: int, nbytes: int) -> None:
        del nbytes
        self.callback(samples)


def as_pack_progress(progress: Progress | PackProgress | None) -> PackProgress | None:
    """``progress`` as a :class:`PackProgress` (a plain callable gets sample counts only)."""
    if progress is None or isinstance(progress, PackProgress):
        return progress
    return _Counting(progress)


def input_bytes(samples: Iterable[SourceSample]) -> int:
    """The input bytes progress counts for ``samples``: their file sizes (unreadable ones: 0)."""
    return sum(max(s.size, 0) for s in samples)
