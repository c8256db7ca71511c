"""The benchmark report: summary statistics, JSON for machines, a text table for people.

Schema ``shardkit.bench/1`` (a JSON object)::

    {"schema": "shardkit.bench/1", "created": ISO-8601 UTC,
     "config": {...what was asked...}, "conditions": {...machine, versions, data, cache...},
     "pack": null | {"images", "seconds", "images_per_second", "shards", "workers"},
     "baseline": NAME,
     "results": [{"name", "label", "baseline",
                  "images_per_second": {"median", "min", "max", "q1", "q3", "runs": [...]},
                  "ratio_to_baseline": null | {"median", "min", "max", "runs": [...]},
                  "cpu_efficiency_to_baseline": null | {"median", "min", "max", "runs": [...]},
                  "first_batch_s", "cores_busy", "cpu_seconds_per_1k_images",
                  "peak_rss_mib", "peak_pss_mib" (null if unknown), "wait_fraction", "batch_shape",
                  "images_per_run",
                  "stages": null | {...}, "load_average_1min": [...]}]}

Ratios are paired: run *i* of a contender divided by run *i* of the baseline (same repetition),
so drift between repetitions cancels. ``cpu_efficiency_to_baseline`` is the baseline's CPU
seconds per image over the contender's (whole process tree, timed part): on a machine shared
with other work, where wall-clock rates swing with the share of the cores a run gets, it
estimates the speed ratio two CPU-bound loaders would show on the same cores when idle.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import statistics
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from shardkit.bench.finished import interrupted_note
from shardkit.bench.harness import Contender, RunResult

SCHEMA = "shardkit.bench/1"
#: Timed runs shorter than this (seconds) get a note under the table: their figures are noisy.
SHORT_RUN_S = 1.0
#: A run that timed fewer batches than this gets no ratio to the baseline in the table or plot:
#: a handful of batches measures start-up and scheduling, not the loader.
MIN_TIMED_BATCHES = 5


def created() -> str:
    """Now, as a report's ``created`` field: ISO-8601 UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, in the plural (``plural``, else ``noun + "s"``) unless ``n`` is 1.

    Example:
        >>> counted(1, "run"), counted(3, "run"), counted(8, "batch", "batches")
        ('1 run', '3 runs', '8 batches')
    """
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and quartiles (inclusive method) of ``values``, plus the values.

    Example:
        >>> spread([1.0, 2.0, 4.0])["median"]
        2.0
    """
    if not values:
        raise ValueError("no values")
    vals = [float(v) for v in values]
    q1, q3 = ((statistics.quantiles(vals, n=4, method="inclusive")[i] for i in (0, 2))
              if len(vals) > 1 else (vals[0], vals[0]))
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "q1": q1,
            "q3": q3, "runs": vals}


def _paired(values: Sequence[float]) -> dict[str, Any]:
    out = spread(values)
    del out["q1"], out["q3"]
    return out


def summarize(contender: Contender, runs: Sequence[RunResult],
              baseline_runs: Sequence[RunResult] | None) -> dict[str, Any]:
    """One ``results`` entry of the report from a contender's runs (and the baseline's)."""
    rates = [r.images_per_second for r in runs]
    ratio = cpu_ratio = None
    if baseline_runs is not None:
        pairs = list(zip(runs, baseline_runs, strict=False))  # by repetition: a stopped bench's may differ by one
        ratio = _paired([r.images_per_second / b.images_per_second for r, b in pairs])
        if all(r.cpu_seconds > 0 for r in runs):
            cpu_ratio = _paired([(b.cpu_seconds / b.images) / (r.cpu_seconds / r.images)
                                 for r, b in pairs])
    last_stages = runs[-1].stages
    return {
        "name": contender.name, "label": contender.label, "baseline": contender.baseline,
        "images_per_second": spread(rates), "ratio_to_baseline": ratio,
        "cpu_efficiency_to_baseline": cpu_ratio,
        "first_batch_s": statistics.median(r.first_batch_s for r in runs),
        "cores_busy": statistics.median(r.cores_busy for r in runs),
        "cpu_seconds_per_1k_images": statistics.median(1000 * r.cpu_seconds / r.images
                                                       for r in runs),
        "peak_rss_mib": max(r.peak_rss_bytes for r in runs) / 2**20,
        "peak_pss_mib": None if any(r.peak_pss_bytes is None for r in runs)
        else max(r.peak_pss_bytes or 0 for r in runs) / 2**20,
        "wait_fraction": statistics.median(r.wait_fraction for r in runs),
        "batch_shape": list(runs[0].batch_shape), "images_per_run": runs[0].images,
        "stages": last_stages, "load_average_1min": [r.load_average for r in runs],
    }


def timed_batches(report: Mapping[str, Any], result: Mapping[str, Any]) -> int:
    """The batches one run of ``result`` (a ``results`` entry of ``report``) timed."""
    return int(result.get("images_per_run", 0)) // max(int(report["config"].get("batch_size") or 1), 1)


def too_few_timed(report: Mapping[str, Any]) -> int | None:
    """The fewest batches a run timed, when under :data:`MIN_TIMED_BATCHES`, else None: then the
    table and the plot print no ratio to the baseline."""
    fewest = min((timed_batches(report, r) for r in report["results"] if "images_per_run" in r), default=None)
    return fewest if fewest is not None and fewest < MIN_TIMED_BATCHES else None


def build_report(config: Mapping[str, Any], conditions: Mapping[str, Any],
                 pack: Mapping[str, Any] | None, contenders: Sequence[Contender],
                 runs: Mapping[str, Sequence[RunResult]]) -> dict[str, Any]:
    """Assemble the report dict (see the module docstring for the schema)."""
    base = next((c for c in contenders if c.baseline), None)
    base_runs = runs[base.name] if base is not None else None
    return {
        "schema": SCHEMA, "created": created(),
        "config": dict(config), "conditions": dict(conditions),
        "pack": dict(pack) if pack else None, "baseline": base.name if base is not None else None,
        "results": [summarize(c, runs[c.name], base_runs) for c in contenders],
    }


def write_json(report: Mapping[str, Any], path: str) -> None:
    """Write ``report`` as indented JSON to ``path``, whole or not at all: a sibling of the file
    (``<file>.tmp-<pid>``, the file a symlink names) is written, given an existing file's mode, then
    renamed over it, so that a bench stopped while it saves (a second Ctrl-C) leaves the file it
    found, never half a report. Written in place, as ``open`` would: a path that is not a regular
    file or is one of the system's (``/dev/stdout``, a FIFO, ``/proc/self/fd/1``: a shell's
    redirection would lose a file replaced under it), a file with other hard links (a rename
    would leave them the old report), and a file whose folder takes no new one. A file replaced
    keeps its owner and group where this process may give them (root saving into a user's
    file); where it may not and the file is writable, it is written in place."""
    text = json.dumps(report, indent=2, sort_keys=False) + "\n"
    try:
        found, target = _stat(path), os.path.realpath(path)
        if _in_place(path, found, target):
            _write_in_place(path, text)
            return
        tmp = f"{target}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:
            if found is None or err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            _write_in_place(path, text)  # a writable file in a folder that takes no new one
            return
        try:
            if found is not None:
                os.chmod(tmp, stat.S_IMODE(found.st_mode))
                if not _same_owner(tmp, found) and os.access(path, os.W_OK):
                    _write_in_place(path, text)  # its owner kept; where not writable, replaced as before
                    return
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    except OSError as err:  # named as the file asked for, not its temporary sibling
        raise OSError(err.errno, err.strerror, path) from err


def check_writable(path: str) -> None:
    """Raise the OSError that :func:`write_json` would meet at ``path``, before a long run rather
    than after it: what it would write, tried without writing (a temporary sibling created and
    removed, or the file opened for writing without truncating it; a FIFO, socket or device is
    checked for permission only, not opened)."""
    try:
        found, target = _stat(path), os.path.realpath(path)
        if not _in_place(path, found, target):
            try:
                fd, probe = tempfile.mkstemp(prefix=f"{os.path.basename(target)}.tmp-", dir=os.path.dirname(target))
            except OSError as err:
                if found is None or err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
            else:
                os.close(fd)
                os.remove(probe)
                return
        if found is None:  # created in place: create it, then remove it
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
            os.remove(path)
        elif stat.S_ISSOCK(found.st_mode):  # open() refuses a socket
            raise OSError(errno.ENXIO, os.strerror(errno.ENXIO), path)
        elif not stat.S_ISREG(found.st_mode):  # opened and closed, a FIFO's reader would see its end
            if not os.access(path, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        else:
            os.close(os.open(path, os.O_WRONLY))
    except OSError as err:
        raise OSError(err.errno, err.strerror, path) from err


def _same_owner(tmp: str, found: os.stat_result) -> bool:
    """Give ``tmp`` the owner and group of the file it replaces; whether it has them now (root
    may give any; others their own groups only)."""
    if (found.st_uid, found.st_gid) == (os.geteuid(), os.getegid()):
        return True
    try:
        os.chown(tmp, found.st_uid, found.st_gid)
    except OSError:
        return False
    return True


def _stat(path: str) -> os.stat_result | None:
    """``path``'s status through a symlink; None where nothing is there yet."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _in_place(path: str, found: os.stat_result | None, target: str) -> bool:
    """Whether ``path`` is written in place rather than through a temporary sibling: it is not a
    regular file, it has other hard links, or it is one of the system's (under /dev or /proc)."""
    return (found is not None and (not stat.S_ISREG(found.st_mode) or found.st_nlink > 1)) or \
        any(p.startswith(("/dev/", "/proc/")) for p in (os.path.abspath(path), target))


def _write_in_place(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def format_table(report: Mapping[str, Any], width: int | None = None) -> str:
    """A fixed-width text table of the results, then one line of conditions; in ``width``
    columns (a terminal's), each loader as a block of short lines instead when the table is wider.

    Example line (the columns as in ``header`` below)::

        ShardLoader (CPU decode)  1,330  1,290–1,372  2.61× (2.50–2.70)  0.41 s  1.97  1.48  2.55×
        640 (1,850) MiB
    """
    header = ("loader", "img/s median", "min–max", "× baseline (min–max)", "1st batch", "CPU cores",
              "CPU ms/img", "× by CPU", "peak PSS (RSS)")
    rows = [header]
    few = too_few_timed(report) is not None
    for r in report["results"]:
        ips, ratio = r["images_per_second"], None if few else r["ratio_to_baseline"]
        rows.append((
            r["label"] + (" [baseline]" if r["baseline"] else ""), f"{ips['median']:,.0f}",
            f"{ips['min']:,.0f}–{ips['max']:,.0f}",
            "—" if ratio is None else f"{ratio['median']:.2f}×" + (
                "" if f"{ratio['min']:.2f}" == f"{ratio['max']:.2f}" else f" ({ratio['min']:.2f}–{ratio['max']:.2f})"),
            f"{r['first_batch_s']:.2f} s", f"{r['cores_busy']:.2f}",
            f"{r['cpu_seconds_per_1k_images']:.2f}",
            "—" if few or r.get("cpu_efficiency_to_baseline") is None
            else f"{r['cpu_efficiency_to_baseline']['median']:.2f}×", _memory(r),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = ("img/s: wall clock, timed part; × baseline: the median of each repetition's ratio to the "
             "baseline's run beside it (so not the ratio of the medians); CPU cores: CPU time of the whole "
             "process tree per wall second; CPU ms/img and × by CPU: CPU cost per image and the baseline's "
             "over it (robust to other load)")
    conditions = format_conditions(report)
    if report.get("interrupted"):
        conditions = f"{interrupted_note(report['interrupted'])}\n{conditions}"
    if width is None or max(map(len, lines)) <= width:
        return "\n".join([*lines, "", notes, conditions])
    blocks = []
    for row in rows[1:]:
        name, median, low_high, ratio, first, cores, ms, by_cpu, memory = row
        spread_ = "" if len(set(low_high.split("–"))) == 1 else f" ({low_high})"  # one run: no range
        blocks += [name, f"    img/s {median}{spread_}   × baseline {ratio}",
                   f"    1st batch {first}   CPU {cores} cores, {ms} ms/img, {by_cpu} by CPU",
                   f"    peak memory {memory} PSS (RSS)"]
    wrap = textwrap.TextWrapper(width=max(width, 40), subsequent_indent="  ", break_on_hyphens=False)
    prose = [wrap.fill(line) for line in [notes, *conditions.splitlines()]]
    return "\n".join([*blocks, "", *prose])


def _memory(r: Mapping[str, Any]) -> str:
    rss = f"{r['peak_rss_mib']:,.0f}"
    return (f"{rss} MiB RSS" if r.get("peak_pss_mib") is None
            else f"{r['peak_pss_mib']:,.0f} ({rss}) MiB")


def format_conditions(report: Mapping[str, Any]) -> str:
    """Conditions and settings in a few lines (what a reader needs to trust the table)."""
    cfg, cond = report["config"], report["conditions"]
    mach, data, ver = cond.get("machine", {}), cond.get("data", {}), cond.get("versions", {})
    if cfg.get("annotations"):
        transform = f"detection_train({cfg.get('size')}, {cfg.get('max_size')}) (IoU crop, resize, flip, sanitize)"
        what = (f"data: {data.get('images', '?'):,} COCO images, {data.get('boxes_per_image', '?')} boxes per image, "
                f"{data.get('classes', '?')} categories, mean {data.get('mean_kb', '?')} KB, "
                f"{data.get('mean_kpix', '?')} kpix")
    else:
        transform = f"{cfg.get('transform')} transform at {cfg.get('size')} px"
        kinds = ("captioned images" if data.get("kind") == "captions"
                 else f"images, {data.get('classes', '?')} classes")
        what = (f"data: {data.get('images', '?'):,} {kinds}, mean "
                f"{data.get('mean_kb', '?')} KB, {data.get('mean_kpix', '?')} kpix")
    lines = [
        f"settings: {transform}, uint8 out, batch "
        f"{cfg.get('batch_size')}, {counted(cfg.get('workers', 0), 'worker')}, device {cfg.get('device')}, "
        f"{cfg.get('epochs')} epoch(s) per run after {cfg.get('warmup')} warm-up batches, "
        f"{counted(cfg.get('repeats', 0), 'repetition')} in alternating order",
        f"{what}; shards {cond.get('shards_location', '?')}; page cache {cond.get('page_cache', '?')}",
        f"machine: {mach.get('usable_cores', '?')} cores ({mach.get('cpu_model', '?')}), load at "
        f"start {mach.get('load_average_at_start', '?')}"
        + (f"; GPU {cond['gpu']['name']}" if cond.get("gpu") else ""),
        "versions: " + ", ".join(f"{k} {v}" for k, v in ver.items() if k != "shardkit_decoder")
        + (f"; decoder: {ver['shardkit_decoder']}" if "shardkit_decoder" in ver else ""),
    ]
    if report.get("pack"):
        p = report["pack"]
        lines.append(f"pack: {p['images']:,} images in {p['seconds']:.1f} s = "
                     f"{p['images_per_second']:,.0f} img/s ({counted(p['shards'], 'shard')}, "
                     f"{counted(p['workers'], 'worker')})")
    lines += [f"note: {text}" for text in cond.get("notes") or ()]  # what the bench changed so all could run
    fewest = too_few_timed(report)
    if fewest is not None:
        lines.append(f"note: a run timed only {counted(fewest, 'batch', 'batches')} after its warm-up, too few for "
                     "a ratio to the baseline (none is given): raise --epochs, lower --warmup or --batch-size, "
                     "or bench a larger dataset")
    run_seconds = [r["images_per_run"] / r["images_per_second"]["median"] for r in report["results"]
                   if r.get("images_per_run") and r["images_per_second"]["median"] > 0]
    if run_seconds and min(run_seconds) < SHORT_RUN_S:
        lines.append(f"note: the shortest timed run took {min(run_seconds):.2f} s: figures this short move a lot "
                     "between runs; raise --epochs (or bench a larger dataset) for a stable figure")
    return "\n".join(lines)
