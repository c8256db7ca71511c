"""The reliability experiments on shards in this process: hostile pack inputs (R1), damaged shards
(R2), integrity at read time (R3) and hostile manifests and index files (R9). Run by
``python -m benchmarks.reliability``, which writes the report.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from benchmarks.reliability.report import Row, fmt_counts
from sample_data.generate import make_indexed_imagefolder
from shardkit import ShardLoader, transforms
from shardkit.errors import ShardkitError
from shardkit.format.tarread import iter_entries
from shardkit.index.manifest_io import read_manifest
from shardkit.loader.read.reader import ShardReader
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store
from tests.cli.terminal import run_in_pty, shardkit_argv


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except ShardkitError as err:
        return type(err).__name__
    except Exception as err:  # noqa: BLE001 - the point is to count these
        return "FOREIGN " + type(err).__name__
    return "ok"


def _epoch(ds: Path, mode: str,
           replaced: list[int] | None = None) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """One epoch's batches; ``replaced`` (if given) gets the loader's count of replaced samples."""
    out = []
    with ShardLoader(str(ds), batch_size=4, transform=transforms.imagenet_val(32), shuffle=False, keys=True,
                     on_error=mode) as loader:
        for images, labels, keys in loader:
            out.append((images.clone(), labels.clone(), list(keys)))
        if replaced is not None:
            replaced.append(loader.stats.replaced)
    return out


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, b, strict=True))


def r1_pack_inputs(work: Path) -> Row:
    src = work / "r1" / "src"
    make_indexed_imagefolder(src, classes=2, per_class=8, size=(64, 48))
    bad = src / "c000"
    os.mkfifo(bad / "fifo.jpg")
    os.symlink("/dev/zero", bad / "zero.jpg")
    os.symlink("/dev/urandom", bad / "urandom.png")
    with open(bad / "sparse.jpg", "wb") as f:
        f.truncate(6 << 30)
    os.symlink(str(bad / "missing"), bad / "dangling.jpg")
    (bad / "empty.jpg").write_bytes(b"")
    (bad / "text.png").write_bytes(b"not an image at all")
    exif = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x05\x01\x1a\x00\x05\x00\x00\x00\x09\x00\x00\x00\x00"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(bad / "exif.jpg", "JPEG", exif=exif)
    seen = run_in_pty(shardkit_argv("pack", str(src), str(work / "r1" / "dst"), "-q"), timeout=120)
    doc = json.loads((work / "r1" / "dst" / "index.json").read_text())
    screen = [line for line in seen.lines if line.strip()]
    with contextlib.suppress(OSError):
        os.close(os.open(bad / "fifo.jpg", os.O_WRONLY | os.O_NONBLOCK))
    figure = (f"exit {seen.returncode}, 0 hangs, {len(doc['skipped'])} of 7 hostile inputs skipped with a reason "
              f"({len(doc['skipped'])} listed), {doc['num_samples']} samples packed, {len(screen)} lines on the "
              "terminal under `-q`")
    return ("R1", "hostile pack inputs", "16 images + FIFO, links to /dev/zero and /dev/urandom, 6 GiB sparse .jpg, "
            "dangling link, empty file, text named .png, JPEG with corrupt EXIF; `shardkit pack -q` on a pty",
            figure, "0 hangs, 0 tracebacks, every hostile input skipped with a reason, nothing on the terminal")


def packed(work: Path) -> Path:
    """The 32-sample dataset most experiments start from, packed once under ``work``."""
    ds = work / "ds"
    if not ds.exists():
        make_indexed_imagefolder(work / "src", classes=2, per_class=16, size=(64, 48))
        pack(str(work / "src"), str(ds), options=PackOptions(max_count=8, seed=0), workers=1)
    return ds


def _damage(work: Path, kind: str, n: int, seed: int) -> collections.Counter[str]:
    ds = packed(work)
    ref = _epoch(ds, "raise")
    shard = read_manifest(Store(str(ds))).shards[0].url
    data = (ds / shard).read_bytes()
    headers = [e.data_offset - 512 for e in iter_entries(io.BytesIO(data), where="x", read_data=False)]
    rng = random.Random(seed)
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        copy = work / "damaged"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(ds, copy)
        b = bytearray(data)
        if kind == "header":
            b[rng.choice(headers) + rng.randrange(512)] ^= 1 << rng.randrange(8)
        elif kind == "bit":
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        else:
            b = b[: rng.randrange(len(b))]
        (copy / shard).write_bytes(bytes(b))
        for mode in ("raise", "replace"):
            got: list[Any] = []
            replaced: list[int] = []
            result = _outcome(lambda mode=mode, got=got, copy=copy, replaced=replaced:  # type: ignore[misc]
                              got.extend(_epoch(copy, mode, replaced)))
            if result == "ok":
                if _same(got, ref):
                    result = "identical"
                else:
                    result = "replaced (counted)" if replaced and replaced[0] > 0 else "SILENTLY DIFFERENT"
            counts[f"{mode}: {result}"] += 1
    return counts


def r2_damaged(work: Path) -> list[Row]:
    rows = []
    for kind, n, what in (("header", 60, "one bit flipped in a tar header"),
                          ("truncation", 30, "shard truncated at a random byte"),
                          ("bit", 100, "one bit flipped anywhere in the shard")):
        counts = _damage(work, kind, n, seed=14)
        foreign = sum(v for k, v in counts.items() if "FOREIGN" in k)
        rows.append(("R2", f"damaged shards: {what}", f"{n} cases (seed 14), 32-sample dataset, loader in raise "
                     "and replace modes, no workers", f"{fmt_counts(counts)}; foreign exception types: {foreign}",
                     "0 foreign exceptions; silent differences only where integrity is off (see R3)"))
    return rows


def r3_integrity(work: Path) -> Row:
    ds = packed(work)
    shards = read_manifest(Store(str(ds))).shards
    data = (ds / shards[0].url).read_bytes()
    rng = random.Random(3)
    detected = 0
    n = 200
    copy = work / "r3"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(ds, copy)
    for _ in range(n):
        b = bytearray(data)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        (copy / shards[0].url).write_bytes(bytes(b))
        reader = ShardReader(Store(str(copy)), shards, verify_hashes=True)
        detected += _outcome(lambda reader=reader: reader.read(0, 0)) == "LoaderError"  # type: ignore[misc]
        reader.close()
    # Cost: hashing one 256 MiB shard-sized buffer, the extra work per shard per process.
    blob = os.urandom(256 << 20)
    t0 = time.perf_counter()
    hashlib.sha256(blob).hexdigest()
    rate = 256 / (time.perf_counter() - t0)
    return ("R3", "integrity at read time", f"{n} random single-bit flips (seed 3) in a shard, "
            "`ShardReader(verify_hashes=True)`; remote shards are always hashed when cached",
            f"{detected}/{n} detected ({100 * detected / n:.0f}%); cost: one sha256 pass per shard per process, "
            f"{rate:.0f} MiB/s on one core here", "100% detected in the integrity mode")


def r9_security(work: Path) -> Row:
    ds = packed(work)
    cases: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
        ("sha256 ../../owned", lambda d: d["shards"][0].update(sha256="../../owned")),
        ("sha256 absolute path", lambda d: d["shards"][0].update(sha256=str(work / "owned"))),
        ("sha256 upper case", lambda d: d["shards"][0].update(sha256=d["shards"][0]["sha256"].upper())),
        ("url with NUL", lambda d: d["shards"][0].update(url="a\0.tar")),
        ("url ../x.tar", lambda d: d["shards"][0].update(url="../x.tar")),
        ("num_samples 1e12", lambda d: d["shards"][0].update(num_samples=10**12)),
        ("num_samples 2e8 with num_bytes to match", lambda d: d["shards"][0].update(num_samples=2 * 10**8,
                                                                                      num_bytes=1024 * 10**8)),
    ]
    outcomes: collections.Counter[str] = collections.Counter()
    outside = 0
    for _, change in cases:
        copy = work / "r9"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(ds, copy)
        doc = json.loads((copy / "index.json").read_text())
        change(doc)
        doc["num_samples"] = sum(s["num_samples"] for s in doc["shards"])
        doc.pop("table", None)  # the edits are index.json's: a reference kept would refuse the table as stale
        (copy / "index.json").write_text(json.dumps(doc))
        cache = work / "r9cache" / "a" / "b"
        outcomes[_outcome(lambda copy=copy, cache=cache: ShardLoader(  # type: ignore[misc]
            str(copy), batch_size=4, cache_dir=str(cache)).__iter__().__next__())] += 1
        outside += sum(1 for p in work.rglob("owned*"))
    idx_edits: list[tuple[int, Callable[[str, int, int], tuple[str, int, int]]]] = [
        (2, lambda k, o, n: (k, o, 2_500_000_256)),  # a 2.5 GB span
        (2, lambda k, o, n: (k, 513, n)),  # unaligned
        (3, lambda k, o, n: (k, 0, n)),  # overlaps the first sample
        (2, lambda k, o, n: ("99999999", o, n)),  # another key
    ]
    for line, edit in idx_edits:
        copy = work / "r9"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(ds, copy)
        shard = json.loads((copy / "index.json").read_text())["shards"][0]["url"]
        idx = copy / shard.replace(".tar", ".idx")
        lines = idx.read_text().splitlines()
        key, offset, size, *crc = lines[line].split()
        lines[line] = " ".join([*map(str, edit(key, int(offset), int(size))), *crc])
        idx.write_text("\n".join(lines) + "\n")
        outcomes[_outcome(lambda copy=copy: _epoch(copy, "raise"))] += 1  # type: ignore[misc]
    idx_cases = len(idx_edits)
    return ("R9", "security suite", f"{len(cases)} hostile index.json edits (local; the cache path is the one "
            f"memory:// and S3 use) and {idx_cases} hostile .idx edits (2.5 GB span, unaligned, overlapping, "
            "wrong key)", f"{fmt_counts(outcomes)}; files written outside destination/cache: {outside}",
            "every case refused with a ShardkitError naming the shard; 0 writes outside; 0 foreign exceptions")

