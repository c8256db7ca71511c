"""The reliability experiments on what the loader delivers: resume (R6), rank equality (R7) and
reproducibility of pack and loader (R11). Run by ``python -m benchmarks.reliability``, which writes
the report. Everything here goes through the public API only.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.reliability.report import Row
from sample_data.generate import make_indexed_imagefolder
from shardkit import ShardLoader, transforms
from shardkit.pack import PackOptions, pack

EPOCHS = 2
Digest = tuple[tuple[str, ...], str]  # a batch's keys and the sha256 of its pixels and labels


def _digest(batch: Any) -> Digest:
    images, labels, keys = batch
    h = hashlib.sha256(images.contiguous().numpy().tobytes())
    h.update(labels.numpy().tobytes())
    return tuple(keys), h.hexdigest()


def _loader(ds: Path, workers: int, **kw: Any) -> ShardLoader:
    options: dict[str, Any] = {"batch_size": 4, "transform": transforms.imagenet_train(32), "seed": 7, "keys": True,
                               **kw}
    return ShardLoader(str(ds), num_workers=workers, **options)


def _epochs(loader: ShardLoader, stop: int | None = None) -> list[Digest]:
    """Digests of the batches of ``EPOCHS`` epochs (the first ``stop`` only, when given)."""
    got: list[Digest] = []
    for epoch in range(loader.epoch, EPOCHS):
        if len(got) == stop:
            break
        loader.set_epoch(epoch)
        for batch in loader:
            got.append(_digest(batch))
            if len(got) == stop:  # stop asking: the state counts the batches handed out
                break
    return got


def r6_resume(ds: Path, trials: int = 8, seed: int = 6) -> Row:
    with _loader(ds, 0) as plain:
        reference = _epochs(plain)
        per_epoch = len(plain)
    rng = random.Random(seed)
    identical, stops = 0, []
    for trial in range(trials):
        stop = [0, per_epoch, len(reference)][trial] if trial < 3 else rng.randrange(1, len(reference))
        before, after = rng.choice([(0, 2), (2, 0), (2, 1)])
        with _loader(ds, before) as first:
            head = _epochs(first, stop)
            state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
        with _loader(ds, after) as second:
            second.load_state_dict(state)
            tail = _epochs(second)
        identical += head + tail == reference
        stops.append(stop)
    return ("R6", "resume", f"{trials} resumes of a {EPOCHS}-epoch run ({per_epoch} batches of 4 per epoch, "
            f"RandomResizedCrop+flip, shuffled): at the start, at the epoch boundary, at the end and at 5 random "
            f"batches (seed {seed}: {stops}), `state_dict()` through JSON into a fresh loader with another "
            "num_workers (0/1/2)", f"{identical}/{trials} resumed runs identical to the uninterrupted one "
            "(keys, pixels, labels of every batch)", "all byte-identical")


def r7_ranks(ds: Path) -> Row:
    with _loader(ds, 0) as plain:
        samples = plain.manifest.num_samples
    problems: list[str] = []
    checked = 0
    for world in (2, 3, 4):
        for even in (True, False):
            lengths = set()
            delivered: list[Counter[str]] = [Counter() for _ in range(EPOCHS)]
            for rank in range(world):
                with _loader(ds, 0, rank=rank, world_size=world, even_batches=even) as loader:
                    for epoch in range(EPOCHS):
                        loader.set_epoch(epoch)
                        got = [_digest(b) for b in loader]
                        lengths.add(len(got))
                        delivered[epoch].update(k for keys, _ in got for k in keys)
            for epoch, counts in enumerate(delivered):
                checked += 1
                if len(counts) != samples:
                    problems.append(f"world {world} even={even} epoch {epoch}: {len(counts)} of {samples} samples")
                if not even and max(counts.values()) != 1:
                    problems.append(f"world {world} even=False epoch {epoch}: a sample delivered twice")
            if even and len(lengths) != 1:
                problems.append(f"world {world}: ranks have {sorted(lengths)} batches")
    with _loader(ds, 0, rank=1, world_size=3) as plain, _loader(ds, 2, rank=1, world_size=3) as workers:
        same_workers = _epochs(plain) == _epochs(workers)
    figure = (f"{checked} (world, even_batches, epoch) cases: every sample delivered each epoch, exactly once "
              f"with even_batches=False, equal batch counts on every rank with even_batches=True; problems: "
              f"{'; '.join(problems) if problems else 'none'}; rank 1 of 3 with 0 and 2 workers: "
              f"{'identical' if same_workers else 'DIFFERENT'}")
    return ("R7", "rank equality", f"world sizes 2, 3, 4, even_batches on and off, {EPOCHS} epochs, {samples} "
            "samples in batches of 4, one loader per rank (rank=, world_size=)", figure,
            "0 problems; identical batches for any num_workers")


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def r11_reproducibility(work: Path) -> Row:
    src = work / "r11src"
    make_indexed_imagefolder(src, classes=3, per_class=20, size=(64, 48))
    packs = []
    for i, (workers, restart) in enumerate([(1, None), (2, None), (2, None), (1, 4), (2, 4)]):
        dst = work / f"r11-{i}"
        pack(str(src), str(dst), options=PackOptions(max_count=8, seed=2, jpeg_restart=restart), workers=workers)
        packs.append(_files(dst))
    plain_same = packs[0] == packs[1] == packs[2]
    restart_same = packs[3] == packs[4]
    runs = [(w, _epochs(_loader(work / "r11-0", w))) for w in (0, 1, 3, 0)]
    loader_same = all(r == runs[0][1] for _, r in runs)
    return ("R11", "reproducibility", "one 60-image ImageFolder packed 5 times (workers 1, 2, 2 again; with "
            "`jpeg_restart=4` at workers 1 and 2), then read for 2 epochs with num_workers 0, 1, 3 and 0 again",
            f"pack: {'byte-identical' if plain_same else 'DIFFERENT'} shards, offsets and index.json over 3 "
            f"runs ({len(packs[0])} files), {'byte-identical' if restart_same else 'DIFFERENT'} with jpeg_restart; "
            f"loader: {'identical' if loader_same else 'DIFFERENT'} batches (keys, pixels, labels) over 4 runs",
            "byte-identical packs; identical batches")
