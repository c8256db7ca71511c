"""Write one planned shard: the unit of work a pack worker (process or Ray task) runs."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass, field, fields
from functools import partial

from shardkit.format.offsets import dump_offsets
from shardkit.format.spec import (
    IMAGE_MEMBER_EXTENSIONS,
    PACK_STATE_DIR,
    make_key,
    offsets_name,
    uniform_member_names,
)
from shardkit.format.tarwrite import TarShardWriter
from shardkit.index.dali import write_dali_index
from shardkit.pack.encode import SkipSample, encode_sample
from shardkit.pack.options import PackOptions
from shardkit.pack.plan import ShardPlan
from shardkit.sources.base import SourceSample
from shardkit.sources.files import Files
from shardkit.sources.local import LocalFiles
from shardkit.storage import Store

#: Where ``--overwrite`` writes a local DST's new pack while the old one stays (:mod:`shardkit.pack.replace`).
REPLACEMENT_DIR = ".shardkit-replacement"


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs to write shard ``plan`` (picklable): ``files`` reads the
    ``samples``, ``store`` is DST."""

    store: Store
    plan: ShardPlan
    samples: list[SourceSample]
    key_width: int
    classes: list[str] | None
    options: PackOptions
    files: Files = field(default_factory=LocalFiles)


@dataclass(frozen=True)
class ShardReceipt:
    """What was written for one shard; saved in the pack state so a resumed pack can reuse it."""

    index: int
    name: str
    num_samples: int
    num_bytes: int
    sha256: str
    skipped: list[dict[str, str]] = field(default_factory=list)
    #: COCO: ``{source index: [width, height]}`` of the images packed whose record gives another
    #: size (or none): the pack's annotation report checks their annotations at that size.
    image_sizes: dict[str, list[int]] = field(default_factory=dict)
    #: Image members written per extension (``{"jpg": 998, "png": 2}``; the extension follows the
    #: bytes, not the source file's name), before ``uniform_names``; None in a receipt of an
    #: earlier shardkit.
    image_formats: dict[str, int] | None = None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardReceipt:
        known = {f.name for f in fields(cls)}  # a field a later shardkit added is left out
        return cls(**{k: v for k, v in json.loads(data).items() if k in known})


ShardDone = Callable[[ShardTask, ShardReceipt], None]
"""Called in the parent as each shard is written; may raise to stop the pack (the rest is
cancelled)."""


def receipt_name(plan: ShardPlan) -> str:
    return f"{plan.name}.done.json"


def _keep_size(into: list[int], width: int, height: int) -> None:
    into[:] = [width, height]


def _record_size_differs(sample: SourceSample, size: list[int]) -> bool:
    """Whether ``sample`` is a COCO image whose record's ``width``/``height`` are not ``size``."""
    image = sample.meta.get("image") if sample.meta and sample.caption is None and sample.label is None else None
    return isinstance(image, dict) and [image.get("width"), image.get("height")] != size


def write_shard(task: ShardTask, on_sample: Callable[[int], None] | None = None) -> ShardReceipt:
    """Encode and write one shard (and its offsets file); record a receipt in the pack state.

    Bad inputs are skipped and listed in the receipt; the shard appears under its final name
    only once complete, so an interrupted worker leaves nothing half-written behind.
    ``on_sample`` is called after each sample, packed or skipped, with its input file size.
    """
    plan, store = task.plan, task.store
    skipped: list[dict[str, str]] = []
    image_sizes: dict[str, list[int]] = {}
    formats: Counter[str] = Counter()
    with store.write_atomic(plan.name) as f, closing(task.files.read_each(task.samples)) as read:
        writer = TarShardWriter(f)
        for source_index, sample, data in zip(plan.members, task.samples, read, strict=True):
            size: list[int] = []  # the image's width and height, once its header is read
            try:
                if isinstance(data, SkipSample):
                    raise data
                fields = encode_sample(sample, data, classes=task.classes, options=task.options,
                                       on_size=partial(_keep_size, size))
            except SkipSample as skip:
                skipped.append({"source": sample.rel, "reason": skip.reason})
            else:
                formats.update(ext for ext, _data in fields if ext in IMAGE_MEMBER_EXTENSIONS)
                if task.options.uniform_names:
                    fields = uniform_member_names(fields)
                writer.add(make_key(source_index, task.key_width), fields)
                if size and _record_size_differs(sample, size):
                    image_sizes[str(source_index)] = size
            if on_sample is not None:
                on_sample(max(sample.size, 0))
        summary = writer.close()
    store.write_bytes(offsets_name(plan.name), dump_offsets(summary.spans))
    if task.options.dali_index:
        write_dali_index(store, plan.name)
    receipt = ShardReceipt(plan.index, plan.name, summary.num_samples, summary.num_bytes,
                           summary.sha256, skipped, image_sizes, dict(sorted(formats.items())))
    store.child(PACK_STATE_DIR).write_bytes(receipt_name(plan), receipt.to_json())
    return receipt

