"""``shardkit bench --train``'s table: shares, host-bound steps, loaders against the fastest DALI
row (no timing)."""

from __future__ import annotations

from shardkit.bench import train
from shardkit.bench.report import spread


def test_the_table_calls_a_step_host_bound_when_its_device_time_is_well_under_its_wall_time() -> None:
    from shardkit.bench.train_report import train_table

    def row(synthetic: float, step_gpu_ms: float | None) -> dict[str, object]:
        one = {"median": 1.0, "min": 1.0, "max": 1.0, "runs": [1.0]}
        return {"label": "x", "fed_images_per_second": one, "share": one, "host_wait_fraction": one,
                "synthetic_images_per_second": {**one, "median": synthetic}, "step_gpu_ms": step_gpu_ms,
                "loader_gpu_ms_per_batch": 0.7}

    bound = train_table("t", [row(12800.0, 5.5)], batch_size=128)  # 10 ms of wall time per step
    assert "10.0 (5.5)" in bound and "host-bound" in bound and "GPU time in brackets" in bound
    assert "host-bound" not in train_table("t", [row(12800.0, 9.5)], batch_size=128)
    on_cpu = train_table("t", [row(12800.0, None)], batch_size=128)
    assert "host-bound" not in on_cpu and "brackets" not in on_cpu
    assert "host wait: the part of the fed run the loop spent waiting for its next batch" in on_cpu  # said always


def test_profile_gil_summarises_py_spy_samples_by_thread() -> None:
    from benchmarks.experiments.gil.profile_gil import summarise

    raw = "\n".join([
        "thread (1): MainThread;<module> (x.py:1);step (x.py:2) 50",
        "thread (2);CompiledFunction.backward (y.py:3) 30",
        "thread (3): shardkit-decode;_guard (p.py:1);decode_many (s.py:2);jpegs (q.py:3) 15",
        "thread (4): shardkit-fetch;_guard (p.py:1);stage (q.py:9) 5",
    ])
    text = summarise(raw)
    assert text.splitlines()[:5] == ["100 samples holding the GIL", "   50.0%  training loop (main thread)",
                                     "   30.0%  autograd thread (backward)", "   20.0%  loader threads (shardkit-*)",
                                     "heaviest loader frames (innermost three):"]
    assert "15.0%  _guard > decode_many > jpegs" in text
    assert summarise("") == "no samples (py-spy could not read the process?)"


def test_the_table_gives_each_loader_over_the_fastest_dali_row_of_each_repetition() -> None:
    """Per repetition against the fastest DALI row of that repetition (two thread counts here), as
    a user comparing the two on one machine would: 12/10 and 11/10, not the medians' 11.5/9."""
    from shardkit.bench.train_report import against_best_dali, train_table

    def row(name: str, label: str, fed: list[float]) -> dict[str, object]:
        one = {"median": 1.0, "min": 1.0, "max": 1.0, "runs": [1.0]}
        return {"name": name, "label": label, "fed_images_per_second": {**spread(fed)},
                "host_wait_fraction": one, "share": one, "synthetic_images_per_second": {**one, "median": 1e3},
                "step_gpu_ms": None, "loader_gpu_ms_per_batch": None}

    rows = [row("shardloader", "ShardLoader", [12.0, 11.0]), row("dali_files@8", "DALI, 8 threads", [10.0, 8.0]),
            row("dali_files@12", "DALI, 12 threads", [8.0, 10.0])]
    against_best_dali(rows, train.DALI_CONTENDERS)
    table = train_table("t", rows, batch_size=128)
    assert "over the fastest DALI row's in the same repetition: ShardLoader 1.15x (1.10x–1.20x)." in table
    assert "DALI, 8 threads 1" not in table
    without = [row("shardloader", "ShardLoader", [12.0]), row("imagefolder", "ImageFolder", [3.0])]
    against_best_dali(without, train.DALI_CONTENDERS)
    assert "DALI" not in train_table("t", without, batch_size=128)


def test_the_table_prints_no_share_over_100_percent_and_keeps_long_labels_in_their_column() -> None:
    from shardkit.bench.train_report import train_table

    def row(label: str, share: float) -> dict[str, object]:
        one = {"median": 1.0, "min": 1.0, "max": 1.0, "runs": [1.0]}
        return {"label": label, "fed_images_per_second": one, "host_wait_fraction": one,
                "share": {**one, "median": share, "min": share, "max": share},
                "synthetic_images_per_second": {**one, "median": 1000.0}, "step_gpu_ms": None,
                "loader_gpu_ms_per_batch": None}

    long = "NVIDIA DALI webdataset (.dali.idx made by the bench), 16 threads"  # 63 characters
    table = train_table("t", [row(long, 1.68), row("shardkit ShardLoader", 0.8)], batch_size=128)
    assert "168%" not in table and ">100%" in table and "the machine's speed drifted" in table
    header, first, second = table.splitlines()[1:4]
    assert first.startswith(long + " ") and second.startswith("shardkit ShardLoader ")
    assert len({len(header), len(first), len(second)}) == 1  # one column width for every row


def test_the_table_says_what_the_feeders_trial_timed_and_kept() -> None:
    """Under the table, each run of a loader with ``feeders="auto"``: the trial's two medians and
    the side kept; nothing for a loader without a trial."""
    from shardkit.bench.train_report import train_table

    one = {"median": 1.0, "min": 1.0, "max": 1.0, "runs": [1.0]}
    base = {"fed_images_per_second": one, "share": one, "host_wait_fraction": one,
            "synthetic_images_per_second": {**one, "median": 12800.0}, "step_gpu_ms": None,
            "loader_gpu_ms_per_batch": None}
    auto = {**base, "label": "auto", "runs": [{"feeders": 3, "trial_ms": {"feeders": 8.58, "here": 9.34},
                                               "fed_images_per_second": 11008.0},
                                              {"feeders": 0, "trial_ms": {"feeders": 8.6, "here": 8.5}}]}
    fixed = {**base, "label": "fixed", "runs": [{"feeders": 3, "trial_ms": None}]}
    text = train_table("t", [auto, fixed], batch_size=128)
    # the pace the kept side then fed the step at, beside what the trial timed (where the run has it)
    assert ("auto, feeders='auto' timed a batch fed by its feeders / from the training process: run 1 8.58 / 9.34 ms, "
            "kept 3 feeders, then fed one every 11.63 ms; run 2 8.60 / 8.50 ms, kept none.") in text
    assert "fixed, feeders='auto'" not in text
