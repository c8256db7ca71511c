"""The reliability experiments on hostile data and concurrent use: hostile shards (R12), hostile
index.json, resume states and mix weights (R13), damaged DALI index files (R14), concurrent packs
into one destination (R15) and the shard cache under attack (R16). Run by
``python -m benchmarks.reliability``, which writes the report.
"""

from __future__ import annotations

import collections
import io
import os
import random
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from benchmarks.reliability.report import Row, child_env, fmt_counts
from sample_data.generate import make_indexed_imagefolder
from shardkit import ShardLoader
from shardkit.cli import cli
from shardkit.errors import ShardkitError
from shardkit.index import verify_dataset
from shardkit.index.adopt import adopt_shards
from shardkit.index.manifest import ShardEntry
from shardkit.loader.epochs.mix import epoch_quotas
from shardkit.loader.read import cache as cache_module
from shardkit.loader.read.cache import ShardCache
from shardkit.pack import PackOptions, pack
from tests.conftest import encode_image

#: A call that has not returned after this long counts as a hang.
_HANG_S = 10.0


def _bounded(fn: Callable[[], Any]) -> tuple[str, float]:
    """``(outcome, seconds)`` of ``fn()`` in a thread: ``ok``, the ShardkitError's class name,
    ``FOREIGN <type>``, or ``HANG`` (not returned in :data:`_HANG_S`)."""
    box: list[str] = []

    def run() -> None:
        try:
            result = fn()
            if hasattr(result, "exit_code"):  # a CliRunner result: exit 1 with one `error:` line is a refusal
                lines = [line for line in result.output.splitlines() if line.strip()]
                one_line = result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ")
                box.append("one-line error" if one_line else "ok" if result.exit_code == 0
                           else f"FOREIGN exit {result.exit_code}, {len(lines)} lines")
            elif hasattr(result, "problems"):  # a VerifyReport: problems are findings
                box.append("reported" if result.problems else "ok")
            elif isinstance(result, _Replaced):
                box.append("replaced (counted)" if result.replaced else "ok")
            else:
                box.append("ok")
        except ShardkitError as err:
            box.append(type(err).__name__)
        except Exception as err:  # noqa: BLE001 - the point is to count these
            box.append("FOREIGN " + type(err).__name__)

    t0 = time.perf_counter()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(_HANG_S)
    return (box[0] if box else "HANG"), time.perf_counter() - t0


def hostile_shard(path: Path, *, cls: bytes = b"1", meta: bytes | None = None,
                  pax: dict[str, str] | None = None) -> Path:
    """One shard of two samples at ``path``; the second carries the hostile parts: its ``cls``
    member, a ``json`` member ``meta``, PAX headers ``pax`` on its image."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for key, label, json_member, headers in (("a", b"0", None, None), ("b", cls, meta, pax)):
            members = [("cls", label), ("jpg", encode_image((8, 8)))] + ([("json", json_member)] if json_member else [])
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                if headers and ext == "jpg":
                    info.pax_headers = dict(headers)
                tar.addfile(info, io.BytesIO(data))
    return path


Step = tuple[str, Callable[[], Any]]


def _index_step(root: Path) -> list[Step]:
    return [("index", lambda: CliRunner().invoke(cli, ["index", str(root)]))]


class _Replaced:
    """What a loader epoch in replace mode gives: ``replaced`` samples (counted)."""

    def __init__(self, replaced: int) -> None:
        self.replaced = replaced


def _epoch_replacing(root: Path) -> _Replaced:
    with ShardLoader(str(root), batch_size=2, on_error="replace") as loader:
        for _ in loader:
            pass
        return _Replaced(loader.stats.replaced)


def _published_steps(root: Path) -> list[Step]:
    return [("verify", lambda: verify_dataset(str(root))), ("loader", lambda: _epoch_replacing(root))]


def r12_hostile_shards(work: Path) -> Row:
    """Each hostile shard through `shardkit index`, then (adopted clean and replaced) through
    `verify` and a loader epoch in replace mode; FIFO and /dev/zero shards the same way."""
    cases: list[tuple[str, dict[str, Any]]] = [
        ("PAX size '²'", {"pax": {"size": "\u00b2"}}),
        ("PAX size of 5,000 digits", {"pax": {"size": "9" * 5000}}),
        ("cls of 5,000 digits", {"cls": b"9" * 5000}),
        ("cls 100000000", {"cls": b"100000000"}),
        ("json nested 100,000 deep", {"meta": b"[" * 100_000 + b"]" * 100_000}),
    ]
    outcomes: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    for i, (_, kind) in enumerate(cases):
        root = work / "r12" / f"c{i}"
        root.mkdir(parents=True)
        hostile_shard(root / "x-000000.tar", **kind)
        for name, step in _index_step(root):
            outcome, seconds = _bounded(step)
            outcomes[f"{name}: {outcome}"] += 1
            slowest = max(slowest, seconds)
        hostile_shard(root / "x-000000.tar")
        adopt_shards(str(root), overwrite=True)
        hostile_shard(root / "x-000000.tar", **kind)
        for name, step in _published_steps(root):
            outcome, seconds = _bounded(step)
            outcomes[f"{name}: {outcome}"] += 1
            slowest = max(slowest, seconds)
    for special in ("fifo", "/dev/zero"):
        root = work / "r12" / special.strip("/").replace("/", "-")
        root.mkdir(parents=True)
        shard = root / "x-000000.tar"
        for run in ("index", "published"):
            shard.unlink(missing_ok=True)
            if run == "published":
                hostile_shard(shard)
                adopt_shards(str(root), overwrite=True)
                shard.unlink()
            os.mkfifo(shard) if special == "fifo" else shard.symlink_to(special)
            steps = _index_step(root) if run == "index" else _published_steps(root)
            for name, step in steps:
                outcome, seconds = _bounded(step)
                outcomes[f"{name}: {outcome}"] += 1
                slowest = max(slowest, seconds)
    return ("R12", "hostile shards", f"{len(cases)} hostile shards ({', '.join(c for c, _ in cases)}) through "
            "`shardkit index`, then published and through `verify` and a loader epoch (on_error='replace'); a shard "
            "that is a FIFO or a link to /dev/zero through the same three",
            f"{fmt_counts(outcomes)}; slowest {slowest:.2f} s",
            "0 FOREIGN, 0 HANG: a one-line error, a reported problem or a replaced sample (the deep json is "
            "not read by a classification loader: ok), in seconds")


def _good_manifest() -> bytes:
    from shardkit.index import Manifest

    return Manifest(kind="imagefolder", shards=(ShardEntry("s-000000.tar", 2, 10240, "a" * 64),),
                    classes=("a", "b")).to_json()


def _resuming(ds: Path, state: dict[str, Any]) -> Callable[[], None]:
    return lambda: ShardLoader(str(ds), batch_size=4).load_state_dict(state)


def _quotas(weights: list[Any]) -> Callable[[], list[int]]:
    return lambda: epoch_quotas([10, 10], weights)


def r13_hostile_records(work: Path) -> Row:
    """Hostile index.json files through `info` and the loader; hostile resume states and mix weights."""
    good = _good_manifest()
    manifests = {
        "nested 100,000 deep": good.replace(b'"num_samples": 2', b'"info": ' + b"[" * 100_000 + b"]" * 100_000
                                            + b', "num_samples": 2', 1),
        "num_samples of 5,000 digits": good.replace(b'"num_samples": 2', b'"num_samples": ' + b"9" * 5000, 1),
        "num_bytes 2**63": good.replace(b'"num_bytes": 10240', b'"num_bytes": 9223372036854775808'),
        "300 MB of padding": good + b" " * (300 << 20),
    }
    outcomes: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    for i, data in enumerate(manifests.values()):
        root = work / "r13" / f"m{i}"
        root.mkdir(parents=True)
        (root / "index.json").write_bytes(data)
        for name, step in (("info", lambda root=root: CliRunner().invoke(cli, ["info", str(root)])),
                           ("loader", lambda root=root: ShardLoader(str(root), batch_size=2))):
            outcome, seconds = _bounded(step)
            outcomes[f"{name}: {outcome}"] += 1
            slowest = max(slowest, seconds)
        (root / "index.json").unlink()
    src, ds, other = work / "r13" / "src", work / "r13" / "ds", work / "r13" / "other"
    make_indexed_imagefolder(src, classes=2, per_class=8, size=(32, 24))
    pack(str(src), str(ds), options=PackOptions(max_count=4, seed=1), workers=1)
    pack(str(src), str(other), options=PackOptions(max_count=4, seed=2), workers=1)  # same sizes, other samples
    state = ShardLoader(str(ds), batch_size=4).state_dict()
    states = {"epoch 2**63": {**state, "epoch": 2**63}, "world_size 10**7": {**state, "world_size": 10**7},
              "batches_consumed of 5,000 digits": {**state, "batches_consumed": 10**5000}}
    for hostile in states.values():
        outcome, seconds = _bounded(_resuming(ds, hostile))
        outcomes[f"state: {outcome}"] += 1
        slowest = max(slowest, seconds)
    outcome, seconds = _bounded(_resuming(other, state))
    outcomes[f"state of another dataset, same shard sizes: {outcome}"] += 1
    for weights in ([10**400, 1], [1, -(10**5000)], [float("inf"), 1]):
        outcome, seconds = _bounded(_quotas(weights))
        outcomes[f"mix weights: {outcome}"] += 1
        slowest = max(slowest, seconds)
    return ("R13", "hostile index.json, resume states, mix weights",
            f"{len(manifests)} hostile index.json ({', '.join(manifests)}) through `shardkit info` and ShardLoader; "
            f"{len(states)} hostile states ({', '.join(states)}) and one saved on another pack of the same images "
            "(equal shard sizes, other contents) through load_state_dict; 3 hostile mix weights",
            f"{fmt_counts(outcomes)}; slowest {slowest:.2f} s",
            "every case a one-line error (ShardkitError) in under a second; 0 FOREIGN, 0 HANG")


def r14_dali_index(work: Path) -> Row:
    """Random edits of a packed shard's DALI index: does `verify` see them?"""
    src, ds = work / "r14" / "src", work / "r14" / "ds"
    make_indexed_imagefolder(src, classes=2, per_class=8, size=(32, 24))
    pack(str(src), str(ds), options=PackOptions(max_count=8, dali_index=True, uniform_names=True), workers=1)
    idx = sorted(ds.glob("*.dali.idx"))[0]
    intact = idx.read_bytes()
    rng = random.Random(14)
    caught = changed = 0
    n = 30
    for case in range(n):
        data = bytearray(intact)
        if case % 3 == 2:  # a hand edit: two samples' image entries swapped
            lines = intact.decode().splitlines()
            a, b = rng.sample(range(1, len(lines)), 2)
            la, lb = lines[a].split(), lines[b].split()
            ia, ib = la.index("jpg"), lb.index("jpg")
            la[ia + 1:ia + 3], lb[ib + 1:ib + 3] = lb[ib + 1:ib + 3], la[ia + 1:ia + 3]
            lines[a], lines[b] = " ".join(la), " ".join(lb)
            data = bytearray(("\n".join(lines) + "\n").encode())
        else:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        if bytes(data) == intact:
            continue
        changed += 1
        idx.write_bytes(bytes(data))
        caught += any(idx.name in p for p in verify_dataset(str(ds)).problems)
    idx.write_bytes(intact)
    return ("R14", "damaged DALI index files", f"{n} edits (seed 14) of a packed shard's `.dali.idx`: bit flips, and "
            "every third a hand edit swapping two samples' image entries; `verify` after each",
            f"{caught}/{changed} damaged files reported by verify, naming the file and line",
            "every damaged file reported")


def r15_concurrent_packs(work: Path) -> Row:
    """Pairs of `shardkit pack --overwrite` into one destination at the same moment."""
    src = work / "r15" / "src"
    make_indexed_imagefolder(src, classes=3, per_class=150, size=(64, 48))
    pairs = 6
    published_ok = both_zero = refused_naming = 0
    for i in range(pairs):
        dst = work / "r15" / "dst"
        argv = [sys.executable, "-m", "shardkit", "pack", str(src), str(dst), "--workers", "1", "-q"]
        argv += ["--overwrite"] if i % 2 == 0 else []
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
                 for _ in range(2)]
        results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
        codes = [code for code, _ in results]
        both_zero += codes == [0, 0]
        refused_naming += sum(code == 1 and "another pack is writing here (pid " in err for code, err in results)
        published_ok += verify_dataset(str(dst)).ok
    return ("R15", "two packs into one destination at once", f"{pairs} pairs of `shardkit pack` started together "
            "into one directory (with --overwrite, or without on an existing pack, alternately), then `verify`",
            f"{published_ok}/{pairs} published datasets verify; both exited 0 in {both_zero} pairs (the second "
            f"found the first's complete pack, or started after it ended); {refused_naming} refused naming the pack "
            "holding the destination", "every published dataset verifies; a loser refused naming the holder")


class _Endless:
    """A store whose object never ends (larger than any manifest entry)."""

    served = 0

    def open_read(self, name: str) -> io.RawIOBase:
        outer = self

        class Stream(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def read(self, n: int = -1) -> bytes:
                outer.served += n
                return b"z" * n

        return Stream()

    def path(self, name: str) -> str:
        return f"memory://x/{name}"


def r16_cache(work: Path) -> Row:
    """A planted shard in the cache, temporary files of killed fetches, an oversized object."""
    src, ds, cache = work / "r16" / "src", "memory://reliability-r16/ds", work / "r16" / "cache"
    make_indexed_imagefolder(src, classes=2, per_class=8, size=(32, 24))
    manifest = pack(str(src), ds, options=PackOptions(max_count=8, seed=1), workers=1).manifest
    true_labels = sorted(int(label) for _, labels in ShardLoader(ds, batch_size=4, cache_dir=str(cache))
                         for label in labels)
    planted = 0
    for entry in manifest.shards:  # the same bytes with every label 0 -> 1, 1 -> 0: the same size
        path = cache / f"{entry.sha256}.tar"
        data = bytearray(path.read_bytes())
        offset = 0
        while (offset := data.find(b".cls\0", offset + 1)) >= 0:
            start = offset - offset % 512 + 512  # the cls member's data block
            data[start:start + 1] = b"1" if data[start:start + 1] == b"0" else b"0"
            planted += 1
        path.write_bytes(bytes(data))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for entry in manifest.shards:
        tmp = cache / f"{entry.sha256}.tar.tmp-{dead.pid}"
        tmp.write_bytes(b"x" * 1000)
        old = time.time() - 3600
        os.utime(tmp, (old, old))
    cache_module._VERIFIED.clear()  # as a new process: memory:// lives in this one, so it is read here
    served = sorted(int(label) for _, labels in ShardLoader(ds, batch_size=4, cache_dir=str(cache)) for label in labels)
    left = len(list(cache.glob("*.tmp-*")))
    endless = _Endless()
    entry = manifest.shards[0]
    outcome, _ = _bounded(lambda: ShardCache(str(work / "r16" / "c2")).open(endless, entry))  # type: ignore[arg-type]
    return ("R16", "shard cache under attack", f"a cached copy of each of {len(manifest.shards)} shards replaced by "
            f"bytes of the same size with every label swapped ({planted} labels), in a new process's cache; "
            f"{len(manifest.shards)} `*.tar.tmp-PID` files of a dead process; an object larger than its manifest "
            "entry", f"labels served {'as packed' if served == true_labels else 'CHANGED'} (planted copies fetched "
            f"again); temporary files left: {left}; oversized object: {outcome} after {endless.served} bytes read "
            f"(manifest: {entry.num_bytes})",
            "packed labels served; 0 temporary files left; a fetch stops at the manifest's size")
