"""What every route's worker half shares: read a batch's samples, apply the bad-sample policy,
count what happened, and decode an image the way a transform needs it.

A route's builder supplies only what it does with one read sample (decode and transform it on
the CPU, keep its JPEG bytes for the GPU, build a detection target); :meth:`SampleSource.fill`
does the rest, the same way for every route: time the read, name the sample in errors
(``where``: shard path and key), replace or raise on a :class:`BadSample`, and gather the
batch's :class:`~shardkit.loader.stats.StageStats`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from shardkit.codec.decode import DecodeStats, decode_rgb, is_jpeg, peek_size
from shardkit.codec.jpeg_region import decode_box_rgb, roi_available, within_pixel_limit
from shardkit.errors import DecodeError, LoaderError
from shardkit.format.bounded import parse_label
from shardkit.format.spec import IMAGE_MEMBER_EXTENSIONS
from shardkit.loader.read.bad_samples import BadSample, Filled, fill_batch
from shardkit.loader.read.reader import CorruptSample, ShardReader
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform
from shardkit.transforms.params import CropFlip

__all__ = ["ON_ERROR", "Sample", "SampleSource", "decode_for"]

T = TypeVar("T")


class Arena(Protocol):
    """Where a batch's samples may be read in place
    (:class:`~shardkit.loader.routes.device.payload.BatchArena`)."""

    def reserve(self, size: int) -> tuple[int, memoryview] | None:
        """``(start, room)`` of ``size`` bytes, or None where there is no room left."""


#: The bad-sample policies: replace a bad sample deterministically (counted), or raise.
ON_ERROR = ("replace", "raise")


@dataclass
class Sample:
    """One sample as read from its shard: ``key``, its members by extension, and ``where``
    (``<shard path>:<key>``) to name it in errors. Read into a batch's arena (see
    :meth:`SampleSource.fill`), its image member stays there instead of among the fields:
    ``image_view`` is a view of it, ``image_at`` its ``(start, end)`` in the arena and
    ``image_ext`` its extension."""

    key: str
    fields: dict[str, bytes]
    where: str
    #: Added to the packed label: in a mix with ``disjoint_labels``, the classes of the datasets before this one.
    label_offset: int = 0
    #: When the label is offset: the class count of the sample's own dataset (its packed label must be below).
    own_classes: int | None = None
    image_at: tuple[int, int] | None = None
    image_view: memoryview | None = None
    image_ext: str | None = None

    def members(self) -> list[str]:
        """The extensions of all its members, sorted (for messages)."""
        return sorted([*self.fields, *([self.image_ext] if self.image_ext is not None else [])])

    def image(self) -> bytes:
        """The encoded image member (the first one with an image extension)."""
        if self.image_view is not None:
            return bytes(self.image_view)
        for ext, data in self.fields.items():
            if ext in IMAGE_MEMBER_EXTENSIONS:
                return data
        raise BadSample(f"{self.where}: no image member (has {self.members()})")

    def image_buffer(self) -> bytes | memoryview:
        """:meth:`image` without a copy: the view of the arena where the sample was read into one."""
        return self.image_view if self.image_view is not None else self.image()

    def label(self, num_classes: int | None = None) -> int:
        """The class index from the ``cls`` member: ASCII digits (surrounding whitespace allowed),
        below ``num_classes`` when given. In a mix with ``disjoint_labels``: the packed label,
        below its own dataset's ``own_classes``, plus ``label_offset``.

        Example:
            >>> Sample("k", {"cls": b"3"}, "s.tar:k").label(10)
            3
            >>> Sample("k", {"cls": b"12"}, "s.tar:k").label(10)
            Traceback (most recent call last):
            ...
            shardkit.loader.read.bad_samples.BadSample: s.tar:k: label 12 is outside the dataset's 10 classes
            >>> Sample("k", {"cls": b"1"}, "s.tar:k", label_offset=3, own_classes=2).label(5)
            4
        """
        raw = self.fields.get("cls")
        if raw is None:
            raise BadSample(f"{self.where}: cls member missing")
        try:  # some writers end the member with a newline: surrounding whitespace is allowed
            label = parse_label(raw)
        except ValueError as err:
            raise BadSample(f"{self.where}: cls member malformed ({err})") from err
        if self.own_classes is not None and label >= self.own_classes:
            raise BadSample(f"{self.where}: label {label} is outside its dataset's {self.own_classes} classes")
        label += self.label_offset
        if num_classes is not None and label >= num_classes:
            raise BadSample(f"{self.where}: label {label} is outside the dataset's {num_classes} classes")
        return label


class SampleSource:
    """Read samples by ``(shard, index)`` from ``reader`` under the ``on_error`` policy.

    ``num_classes``: labels must be below it (None: no upper bound, e.g. shards adopted without
    class names). Picklable (it travels to the worker processes inside a route's builder).
    """

    def __init__(self, reader: ShardReader, on_error: str = "replace", num_classes: int | None = None) -> None:
        if on_error not in ON_ERROR:
            raise LoaderError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.reader = reader
        self.on_error = on_error
        self.num_classes = num_classes

    def read(self, shard: int, index: int, stats: StageStats, arena: Arena | None = None) -> Sample:
        """Read one sample, adding the time to ``stats.read_s``; with an ``arena``, into the room it
        reserves (when it has room left), the image member left there (``Sample.image_at``).

        Raises:
            BadSample: the sample's bytes are damaged (truncated, bad header, wrong key).
            LoaderError: the whole shard is unusable (missing, wrong hash, ...).
        """
        t0 = time.perf_counter()
        try:
            key, fields, placed, room, shard_where, (offset, own) = self.reader.read_sample(
                shard, index, arena.reserve if arena is not None else None)
        except CorruptSample as err:
            raise BadSample(str(err)) from err
        image_at, view, ext = None, None, None
        if room is not None:
            if len(placed) == 1:
                (ext, (start, size)), = placed.items()
                image_at, view = (room[0] + start, room[0] + start + size), room[1][start:start + size]
            else:  # several images (only the first is used) or none: as read() gives them
                fields.update({ext: bytes(room[1][s:s + n]) for ext, (s, n) in placed.items()})
        stats.read_s += time.perf_counter() - t0
        return Sample(key, fields, f"{shard_where}:{key}", offset, own, image_at, view, ext)

    def span_bytes(self, shards: Sequence[int], indices: Sequence[int]) -> int:
        """Bytes of the samples' spans together: the room an arena needs to read them all in place."""
        return sum(self.reader.span_size(int(s), int(i)) for s, i in zip(shards, indices, strict=True))

    def fill(self, make: Callable[[int, Sample, int, StageStats, DecodeStats], T], shards: Sequence[int],
             indices: Sequence[int], seeds: Sequence[int], arena: Arena | None = None) -> tuple[Filled[T], StageStats]:
        """Run ``make(slot, sample, seed, stats, decode_stats)`` on each sample of a batch, in
        order, then apply the bad-sample policy (:func:`~shardkit.loader.read.bad_samples.fill_batch`).
        With an ``arena``, each sample is read into it (:meth:`read`); ``make`` keeps what it uses.

        ``make`` raises :class:`BadSample` for a sample it cannot use. Returns the filled batch
        and its stats (one batch; its samples, replacements and decoder counts).

        Raises:
            LoaderError: a bad sample with ``on_error="raise"``, or a batch beyond replacing.
        """
        stats, dstats = StageStats(batches=1, samples=len(shards)), DecodeStats()
        unchecked = [False] * len(shards)  # per slot: a replacement comes from the slot's own shard

        def attempt(slot: int, shard: int, index: int, seed: int) -> T:
            unchecked[slot] = self.reader.unchecked(shard)
            return make(slot, self.read(shard, index, stats, arena), seed, stats, dstats)

        got = fill_batch(attempt, self.reader, shards, indices, seeds, on_error=self.on_error)
        stats.replaced += got.replaced
        stats.unchecked += sum(unchecked)
        stats.fast, stats.fallback, stats.decode_warnings = dstats.fast, dstats.fallback, dstats.warnings
        return got, stats


def decode_for(transform: ImageTransform, raw: bytes, seed: int, where: str,
               dstats: DecodeStats) -> tuple[torch.Tensor, CropFlip]:
    """Decode what ``transform`` needs and draw its parameters from the sample's ``seed``
    (:meth:`~shardkit.transforms.base.ImageTransform.draw`: the same parameters whichever decoder
    runs). Crop-first transforms on JPEGs decode only their box.

    Raises:
        BadSample: the image cannot be decoded (the message names it).
    """
    try:
        if transform.crop_first and roi_available() and is_jpeg(raw):
            height, width = peek_size(raw)
            params = transform.draw(height, width, seed)
            region = decode_box_rgb(raw, params) if within_pixel_limit(height, width) else None
            if region is not None:
                dstats.fast += 1
                return region, CropFlip(0, 0, params.height, params.width, params.flip)
            image = decode_rgb(raw, where=where, stats=dstats)
            if tuple(image.shape[-2:]) != (height, width):
                raise DecodeError(f"header says {height}x{width}, image decodes to {tuple(image.shape[-2:])}",
                                  where=where)
            return image, params
        image = decode_rgb(raw, where=where, stats=dstats)
    except DecodeError as err:  # the header peek names no sample: name it here
        raise BadSample(str(err) if err.where else f"{where}: {err.message}") from err
    return image, transform.draw(image.shape[-2], image.shape[-1], seed)
