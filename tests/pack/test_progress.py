"""Pack progress: totals first (samples and input bytes), then every shard exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.pack import PackOptions, PackProgress, SkipBudget, SkipBudgetError, pack
from shardkit.sources import scan_imagefolder


class Recorder:
    def __init__(self) -> None:
        self.started: tuple[int, int] | None = None
        self.steps: list[tuple[int, int]] = []

    def start(self, samples: int, nbytes: int) -> None:
        assert self.started is None and not self.steps, "start comes once, first"
        self.started = (samples, nbytes)

    def advance(self, samples: int, nbytes: int) -> None:
        assert self.started is not None
        self.steps.append((samples, nbytes))


@pytest.mark.parametrize("workers", [1, 2])
def test_totals_then_each_shard(small_tree: Path, tmp_path: Path, workers: int) -> None:
    (small_tree / "class0" / "empty.jpg").write_bytes(b"")  # skipped inputs count as done too
    listing = scan_imagefolder(str(small_tree))
    total_bytes = sum(max(s.size, 0) for s in listing.samples)
    rec = Recorder()
    assert isinstance(rec, PackProgress)
    pack(str(small_tree), str(tmp_path / "out"), options=PackOptions(max_count=4), workers=workers, progress=rec)
    assert rec.started == (13, total_bytes)
    assert len(rec.steps) == 4  # 13 samples in shards of 4
    assert (sum(n for n, _ in rec.steps), sum(b for _, b in rec.steps)) == rec.started


def test_a_resumed_pack_counts_kept_shards_at_once(small_tree: Path, tmp_path: Path) -> None:
    (small_tree / "class2" / "bad.jpg").write_bytes(b"junk")  # 9th of 13 unshuffled: shard 3 of 4
    options = PackOptions(max_count=4, shuffle=False)
    dst = str(tmp_path / "out")
    with pytest.raises(SkipBudgetError):
        pack(str(small_tree), dst, options=options, workers=1, max_skipped=SkipBudget(count=0))
    rec = Recorder()
    result = pack(str(small_tree), dst, options=options, workers=1, progress=rec)
    assert result.reused_shards == 3  # the budget stopped the first run after that shard
    assert rec.started is not None and rec.steps[0][0] == 12  # the three kept shards, in one step
    assert (sum(n for n, _ in rec.steps), sum(b for _, b in rec.steps)) == rec.started


def test_a_plain_callable_gets_sample_counts(small_tree: Path, tmp_path: Path) -> None:
    seen: list[int] = []
    pack(str(small_tree), str(tmp_path / "out"), options=PackOptions(max_count=5), workers=1, progress=seen.append)
    assert sorted(seen) == [2, 5, 5]
