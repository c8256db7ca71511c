"""Pack progress: totals first (samples and input bytes), then samples as they are written."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.pack import PackOptions, PackProgress, SkipBudget, SkipBudgetError, pack
from shardkit.pack.plan import ShardPlan
from shardkit.pack.pool import _Tally
from shardkit.pack.write import ShardTask
from shardkit.sources import SourceSample, scan_imagefolder
from shardkit.storage import Store


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
    pack(str(small_tree), str(tmp_path / "out"), options=PackOptions(max_count=4), workers=workers,
         progress=rec)
    assert rec.started == (13, total_bytes)
    assert (sum(n for n, _ in rec.steps), sum(b for _, b in rec.steps)) == rec.started
    if workers == 1:  # in this process every sample is reported as it is written
        assert sorted(rec.steps) == sorted((1, max(s.size, 0)) for s in listing.samples)


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
    pack(str(small_tree), str(tmp_path / "out"), options=PackOptions(max_count=5), workers=1,
         progress=seen.append)
    assert seen == [1] * 12


def test_tally_adds_each_shard_up_exactly_once() -> None:
    samples = [SourceSample(f"/x/{i}.jpg", f"{i}.jpg", 100 + i) for i in range(3)]
    task = ShardTask(Store("/unused"), ShardPlan(7, "shard-000007.tar", (0, 1, 2)), samples, 1,
                     None, PackOptions())
    steps: list[tuple[int, int]] = []
    tally = _Tally(lambda n, b: steps.append((n, b)))
    tally.sample(7, 100)  # reported by the worker
    tally.finish(task)  # done before the other two reports were read: the rest at once
    tally.sample(7, 101)  # a late report of a finished shard counts no more
    assert steps == [(1, 100), (2, 203)]


def test_progress_moves_before_the_pack_ends_with_workers(small_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    shards_at_first_report: list[int] = []

    class Watch(Recorder):
        def advance(self, samples: int, nbytes: int) -> None:
            super().advance(samples, nbytes)
            if not shards_at_first_report:
                shards_at_first_report.append(len(list(dst.glob("shard-*.tar"))))

    rec = Watch()
    result = pack(str(small_tree), str(dst), options=PackOptions(max_count=1), workers=2,
                  progress=rec)
    assert result.manifest.num_samples == 12
    # Reports arrive while shards are written; before, the pool reported only once all 12 were done.
    assert shards_at_first_report and shards_at_first_report[0] < 12
    assert (sum(n for n, _ in rec.steps), sum(b for _, b in rec.steps)) == rec.started


def test_a_cancelled_future_failing_in_the_pool_manager_is_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python before 3.12 raises InvalidStateError in the pool's management thread when it fails
    the futures of terminated workers, cancelled ones too: after Ctrl-C or SIGTERM that printed a
    traceback under "interrupted". Only that error of that thread is kept quiet, and only meanwhile."""
    import threading
    from concurrent.futures import InvalidStateError

    from shardkit.pack.pool import _cancelled_futures_quiet

    seen: list[tuple[str, type[BaseException]]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append((args.thread.name, args.exc_type)))

    def raising(exc: type[BaseException]) -> None:
        raise exc("CANCELLED")

    manager = threading.Thread(target=raising, args=(InvalidStateError,), name="manager")
    other = threading.Thread(target=raising, args=(InvalidStateError,), name="other")
    wrong = threading.Thread(target=raising, args=(RuntimeError,), name="manager-too")
    with _cancelled_futures_quiet(manager):
        for t in (manager, other):
            t.start()
            t.join()
    with _cancelled_futures_quiet(wrong):
        wrong.start()
        wrong.join()
    late = threading.Thread(target=raising, args=(InvalidStateError,), name="late")
    late.start()
    late.join()
    assert seen == [("other", InvalidStateError), ("manager-too", RuntimeError), ("late", InvalidStateError)]
