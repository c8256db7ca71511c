"""CPU time per image of the GPU route's worker half, in one process: no CUDA, no DataLoader.

What one GPU-route worker does for each batch (:class:`~shardkit.loader.routes.gpu.worker.RawBatchBuilder`:
read the sample and check its CRC-32, parse its tar headers and JPEG frame header, draw the crop,
cut restart intervals where the shards have them, decode on the CPU the images nvJPEG does not
take, lay the batch out in a reused buffer as in a worker process: each sample read straight into
it), over every sample of
``SHARDS`` in order, batches of ``--batch-size``, torch at one thread. One untimed pass warms the
page cache; then ``--rounds`` timed passes, process CPU time (user + system) per image.

``--crc zlib,zlib-ng`` alternates the CRC-32 implementation between passes (the others as
installed), and ``--gray off,on`` whether grayscale JPEGs are decoded in the worker or shipped
encoded for the device to decode (``RawBatchBuilder(gray=...)``; the route turns it on where
``gpu_decodes_gray`` holds), for a side-by-side figure of each lever. ``--by-kind`` then times the samples of
each kind apart (JPEGs nvJPEG takes, which the worker ships undecoded, grayscale ones among them
with ``--gray on``; grayscale, CMYK and other JPEGs and other formats, which it decodes and
resizes), in batches of that kind only (a kind
with fewer samples than a batch repeats them), and prints each kind's share of the whole pass.
``--ablate`` then takes the JPEGs nvJPEG takes apart, step by step: their batches timed as they
are and with one step of the worker replaced at a time by a stand-in that costs next to nothing
(``read``: the sample's key and members from a dict instead of the read into the shared buffer,
CRC-32 and tar parse, only the JPEG's first :data:`HEADERS` bytes written there; ``draw``: the
whole image as the crop, nothing drawn from the sample's seed; ``frame``: the JPEG frame header
looked up instead of parsed), in alternating order; what a step costs is the time its stand-in
saves. ``--stage`` then times the receiving process's share of each batch: its staging into a slot
(pinned memory where CUDA is available) and the split of its JPEGs. ``--through-workers N`` then
runs the same builder in N persistent worker processes sending each batch here, over the
loader's shuffled stream (epoch 0's order each time, no read-ahead), their user and system CPU per
image apart.

    python -m benchmarks.worker_cost /tmp/shards --size 176 --rounds 6 --crc zlib,zlib-ng --by-kind
    python -m benchmarks.worker_cost /tmp/shards --size 176 --rounds 6 --gray off,on
    python -m benchmarks.worker_cost /tmp/shards --size 176 --rounds 6 --gray on --ablate
    python -m benchmarks.worker_cost /tmp/shards --size 176 --rounds 6 --gray on --stage
    python -m benchmarks.worker_cost /tmp/shards --size 176 --rounds 6 --gray on --through-workers 2
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

import shardkit.loader.read.reader as reader_module
import shardkit.loader.routes.device.payload as payload
import shardkit.loader.routes.gpu.worker as worker_module
from shardkit.codec.decode import is_jpeg
from shardkit.codec.jpeg_header import jpeg_frame
from shardkit.codec.nvjpeg import nvjpeg_frame
from shardkit.errors import ShardkitError
from shardkit.index import read_manifest
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.device.pinned import PinnedSlot
from shardkit.loader.routes.gpu.worker import RawBatchBuilder
from shardkit.storage import Store
from shardkit.transforms import imagenet_train
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.gpu import GEOMETRY_COLUMNS
from shardkit.transforms.params import CropFlip

#: ``--ablate``'s ``read`` stand-in writes this many bytes of each JPEG (its headers, which the
#: worker parses) where the read would have put the whole span.
HEADERS = 2048


def _crc(name: str) -> Callable[..., int]:
    if name == "zlib":
        return zlib.crc32
    if name == "zlib-ng":
        from zlib_ng import zlib_ng

        return zlib_ng.crc32
    raise SystemExit(f"--crc: unknown implementation {name!r} (zlib, zlib-ng)")


def _kind(fields: dict[str, bytes], gray: bool) -> str:
    """``nvjpeg`` (shipped undecoded; grayscale too with ``gray``), ``jpeg-gray``, ``jpeg-cmyk``,
    ``jpeg-other`` or the member's extension (decoded by the worker)."""
    ext, data = next(((e, d) for e, d in fields.items() if e not in ("cls", "json", "txt")), ("?", b""))
    if nvjpeg_frame(data, gray=gray) is not None:
        return "nvjpeg"
    if not is_jpeg(data):
        return ext
    frame = jpeg_frame(memoryview(data))
    return {1: "jpeg-gray", 4: "jpeg-cmyk"}.get(frame.components if frame is not None else 0, "jpeg-other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", help="a packed ImageFolder dataset (directory)")
    parser.add_argument("--size", type=int, default=176)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--crc", default="", help="comma-separated CRC-32 implementations to alternate")
    parser.add_argument("--gray", default="off", help="comma-separated off/on: grayscale JPEGs decoded in the "
                        "worker (off) or shipped encoded (on), alternated")
    parser.add_argument("--by-kind", action="store_true", help="also time each kind of sample apart")
    parser.add_argument("--ablate", action="store_true", help="also time the steps of a JPEG nvJPEG takes apart")
    parser.add_argument("--stage", action="store_true",
                        help="also time the receiving process's staging of the batches (pinned where CUDA is)")
    parser.add_argument("--through-workers", type=int, default=0, metavar="N",
                        help="also run the loader's shuffled stream through N worker processes and give "
                             "their user and system CPU per image")
    args = parser.parse_args()
    torch.set_num_threads(1)
    crcs = [c for c in args.crc.split(",") if c] or [""]
    impls = {name: _crc(name) if name else reader_module.crc32 for name in crcs}
    grays = [g for g in args.gray.split(",") if g]
    if not grays or any(g not in ("off", "on") for g in grays):
        raise SystemExit(f"--gray takes off, on or both separated by a comma, got {args.gray!r}")
    variants = [(c, g) for c in crcs for g in grays]
    try:
        store = Store(args.shards)
        manifest = read_manifest(store)
    except ShardkitError as err:
        raise SystemExit(f"error: {err}") from None
    # as in a worker process: the batch's blob goes to the next buffer of a reused cycle
    payload.get_worker_info = lambda: object()  # type: ignore[assignment,return-value]
    reader = ShardReader(store, manifest.shards)
    builder = RawBatchBuilder(reader, imagenet_train(args.size), buffer_cycle=4)
    pairs = [(s, i) for s, entry in enumerate(manifest.shards) for i in range(entry.num_samples)]
    n = len(pairs) // args.batch_size * args.batch_size
    if n == 0:
        raise SystemExit(f"{args.shards}: fewer samples ({len(pairs)}) than one batch of {args.batch_size}")

    def one_pass(samples: list[tuple[int, int]] = pairs, count: int = n) -> float:
        start = time.process_time()
        for k in range(0, count, args.batch_size):
            chunk = samples[k:k + args.batch_size]
            builder.build([s for s, _ in chunk], [i for _, i in chunk], list(range(k, k + len(chunk))))
        return (time.process_time() - start) / count * 1e3

    one_pass()
    ms: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for name, gray in variants if r % 2 == 0 else variants[::-1]:
            reader_module.crc32, builder.gray = impls[name], gray == "on"
            ms[name, gray].append(one_pass())
    for (name, gray), values in ms.items():
        print(json.dumps({"crc": name or "installed", "gray_shipped_encoded": gray == "on", "images": n,
                          "cpu_ms_per_image_median": round(statistics.median(values), 4),
                          "min": round(min(values), 4), "max": round(max(values), 4),
                          "rounds": [round(v, 4) for v in values]}))
    reader_module.crc32, builder.gray = impls[crcs[-1]], grays[-1] == "on"  # the pass the shares are of
    kinds: dict[str, list[tuple[int, int]]] = {}
    if args.by_kind or args.ablate:
        for pair in pairs:
            kinds.setdefault(_kind(reader.read(*pair)[1], builder.gray), []).append(pair)
    if args.by_kind:
        whole = statistics.median(ms[variants[-1]]) * len(pairs)
        for kind, members in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
            batch = (members * (args.batch_size // len(members) + 1))[:max(args.batch_size, len(members))]
            count = len(batch) // args.batch_size * args.batch_size
            each = statistics.median([one_pass(batch, count) for _ in range(args.rounds)])
            print(json.dumps({"kind": kind, "samples": len(members),
                              "share_of_samples": round(len(members) / len(pairs), 4),
                              "cpu_ms_per_image_median": round(each, 4),
                              "share_of_cpu": round(each * len(members) / whole, 3)}))
    if args.ablate:
        _ablate(builder, reader, kinds.get("nvjpeg", []), one_pass, args.batch_size, args.rounds)
    if args.stage:
        _stage(builder, pairs, n, args.batch_size, args.size, args.rounds)
    if args.through_workers:
        _through_workers(args.shards, args.through_workers, args.batch_size, args.size, args.rounds, grays[-1] == "on")


def _through_workers(shards: str, workers: int, batch_size: int, size: int, rounds: int, gray: bool) -> None:
    """The same builder in ``workers`` persistent worker processes, each batch sent to this
    process, over the loader's shuffled stream (epoch 0's order every time; no read-ahead), the
    last batches kept alive as the GPU route keeps them (their buffers stay mapped here); the
    workers' user and system CPU per image over ``rounds`` epochs after an untimed one
    (``psutil``), and this process's."""
    import psutil

    from shardkit import ShardLoader
    from shardkit.loader.run.stream import BatchStream, raise_failures
    from shardkit.loader.run.workers import worker_loader

    payload.get_worker_info = torch.utils.data.get_worker_info  # as the module has it (main() stood it in)
    transform = imagenet_train(size)
    loader = ShardLoader(shards, batch_size=batch_size, transform=transform, num_workers=0, drop_last=True)
    builder = RawBatchBuilder(loader.reader, transform, buffer_cycle=4, gray=gray)
    control = torch.zeros(2, dtype=torch.int64).share_memory_()
    stream = BatchStream(loader.config, builder, control)
    source = worker_loader(stream, num_workers=workers, prefetch=2, pin_memory=False)
    me = psutil.Process()

    def cpu() -> tuple[float, float, float]:
        kids = [k.cpu_times() for k in me.children(recursive=True)]
        own = me.cpu_times()
        return sum(k.user for k in kids), sum(k.system for k in kids), own.user + own.system

    kept: collections.deque[Any] = collections.deque(maxlen=workers * (builder.buffer_cycle + 1))  # as GpuRoute keeps
    for batch in raise_failures(source):  # starts the workers, warms the page cache
        kept.append(batch)
    before, images = cpu(), 0
    for _ in range(rounds):
        for batch in raise_failures(source):
            images += len(batch.keys)
            kept.append(batch)
    after = cpu()
    user, system, here = ((a - b) / images * 1e3 for a, b in zip(after, before, strict=True))
    print(json.dumps({"through_workers": workers, "images": images, "worker_user_ms_per_image": round(user, 4),
                      "worker_system_ms_per_image": round(system, 4),
                      "worker_cpu_ms_per_image": round(user + system, 4),
                      "this_process_cpu_ms_per_image": round(here, 4)}))


def _stage(builder: RawBatchBuilder, pairs: list[tuple[int, int]], count: int, batch_size: int, size: int,
           rounds: int) -> None:
    """Time what the receiving process does with each batch before the device sees it: stage it
    into a slot (:meth:`PinnedSlot.stage`, one copy of its data) and take its JPEGs apart
    (:meth:`PinnedSlot.jpegs`), over the last batches a worker's buffer cycle still holds."""
    pin = torch.cuda.is_available()
    kept = builder.buffers.cycle - 1  # the batches whose buffers the next build does not reuse
    starts = list(range(0, count, batch_size))[-kept:]
    batches = [builder.build([s for s, _ in pairs[k:k + batch_size]], [i for _, i in pairs[k:k + batch_size]],
                             list(range(k, k + batch_size))) for k in starts]
    slots = [PinnedSlot(batch_size, (size, size), len(GEOMETRY_COLUMNS), pin=pin) for _ in range(len(batches) + 1)]
    per_round = max(1, 2000 // (len(batches) * batch_size))  # about 2,000 images a round
    times = []
    for r in range(rounds + 1):  # the first round allocates the slots' pages
        start = time.process_time()
        for k in range(per_round):
            for j, batch in enumerate(batches):
                slot = slots[(k * len(batches) + j) % len(slots)]
                slot.stage(batch)
                slot.jpegs()
        if r:
            times.append((time.process_time() - start) / (per_round * len(batches) * batch_size) * 1e3)
    print(json.dumps({"stage": "pinned" if pin else "pageable", "batches": len(batches),
                      "bytes_per_image": round(statistics.mean(b.images.nbytes for b in batches) / batch_size),
                      "cpu_ms_per_image_median": round(statistics.median(times), 5),
                      "min": round(min(times), 5), "max": round(max(times), 5)}))


class _NothingDrawn:
    """A transform whose :meth:`draw` gives the whole image unflipped (nothing drawn); all else is ``inner``'s."""

    def __init__(self, inner: ImageTransform, calls: Counter[str]) -> None:
        self.inner, self.calls = inner, calls

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def draw(self, height: int, width: int, seed: int) -> CropFlip:
        self.calls["draw"] += 1
        return CropFlip(0, 0, height, width, False)


def _ablate(builder: RawBatchBuilder, reader: ShardReader, members: list[tuple[int, int]],
            one_pass: Callable[..., float], batch_size: int, rounds: int) -> None:
    """Time the JPEGs nvJPEG takes with each step of the worker replaced by a stand-in (see the module doc)."""
    count = len(members) // batch_size * batch_size
    if count == 0:
        raise SystemExit(f"--ablate: fewer JPEGs nvJPEG takes ({len(members)}) than one batch of {batch_size}")
    read_sample, transform, frame_of = reader.read_sample, builder.transform, worker_module.nvjpeg_frame
    samples = {}  # what read_sample returns but the room, then the room's size and the image
    for shard, index in members:
        room = memoryview(bytearray(reader.span_size(shard, index)))
        key, fields, placed = reader.read_into(shard, index, room)
        images = {ext: bytes(room[s:s + n]) for ext, (s, n) in placed.items()}
        samples[shard, index] = (key, fields, placed, reader.where(shard), reader.labels_of(shard), len(room),
                                 images)
    frames = {(len(data), bytes(data[-16:])): frame_of(data, gray=True)
              for *_, images in samples.values() for data in images.values()}

    calls: Counter[str] = Counter()  # each stand-in's calls: one the worker no longer makes would time nothing

    def looked_up(data: bytes | memoryview, gray: bool = False) -> object:
        calls["frame"] += 1
        return frames[len(data), bytes(data[-16:])]

    def not_read(shard: int, index: int, reserve: Callable[[int], tuple[int, memoryview] | None]) -> Any:
        """What read_sample returns, only the image's headers written into the room ``reserve``
        gives (no read, CRC or parse)."""
        calls["read"] += 1
        key, fields, placed, where, labels, size, images = samples[shard, index]
        room = reserve(size)
        if room is None:
            return key, {**fields, **images}, {}, None, where, labels
        for ext, (start, n) in placed.items():
            head = min(n, HEADERS)
            room[1][start:start + head] = images[ext][:head]
        return key, dict(fields), placed, room, where, labels

    def stand_in(step: str) -> None:
        reader.read_sample = read_sample  # type: ignore[method-assign]
        builder.transform, worker_module.nvjpeg_frame = transform, frame_of
        if step == "read":
            reader.read_sample = not_read  # type: ignore[method-assign,assignment]
        elif step == "draw":
            builder.transform = _NothingDrawn(transform, calls)  # type: ignore[assignment]
        elif step == "frame":
            worker_module.nvjpeg_frame = looked_up  # type: ignore[assignment]

    steps = ["none", "read", "draw", "frame"]
    ms: dict[str, list[float]] = {step: [] for step in steps}
    for r in range(rounds + 1):  # the first round warms the dict's pages up
        for step in steps if r % 2 == 0 else steps[::-1]:
            stand_in(step)
            value = one_pass(members, count)
            if r:
                ms[step].append(value)
    stand_in("none")
    base = statistics.median(ms["none"])
    for step in steps:
        each = statistics.median(ms[step])
        print(json.dumps({"nvjpeg_step_replaced": step, "us_per_image_median": round(each * 1e3, 2),
                          "min": round(min(ms[step]) * 1e3, 2), "max": round(max(ms[step]) * 1e3, 2),
                          "step_costs_us": round((base - each) * 1e3, 2) if step != "none" else None,
                          "stand_in_calls": calls[step] if step != "none" else None}))


if __name__ == "__main__":
    main()
