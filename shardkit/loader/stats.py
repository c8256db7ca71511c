"""Per-stage counters and timings, so a run can say where its time goes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class StageStats:
    """Counts and seconds accumulated by workers (shipped with each batch) and the main process.

    ``read_s``/``decode_s``/``transform_s``: worker seconds per stage (summed over workers);
    ``wait_s``: seconds the consumer waited for the next batch; ``copy_s``: host-to-device and
    finalize time in the main process; ``replaced``: corrupt samples replaced by another sample
    of the same batch; ``fast``/``fallback``: images decoded by the native decoder / by PIL;
    ``decode_warnings``: images decoded despite a libjpeg warning about corrupt data (the first
    one of each process is logged, see :mod:`shardkit.codec.decode`); ``unchecked``: samples
    delivered from shards with no offsets file beside them, so not checked against a CRC-32, nor
    by the shard's sha256 (a local shard without ``verify_hashes``): logged once per loader,
    ``shardkit verify`` lists such shards.
    GPU route (``device="cuda"``): ``gpu_images`` decoded by nvJPEG, ``gpu_fallback`` decoded on
    the CPU instead (by workers, or in the main process after nvJPEG rejected them);
    ``gpu_decode_s``: time of the batched nvJPEG calls (synchronous); ``gpu_augment_s``: device
    time (CUDA events) of crop-resize-flip + finalize; ``gpu_copy_s``: host time staging
    batches in pinned buffers; ``gpu_fetch_wait_s``: time the prefetcher waited for workers;
    ``gpu_host_s``: host time launching the augment stage.
    """

    batches: int = 0
    samples: int = 0
    replaced: int = 0
    fast: int = 0
    fallback: int = 0
    decode_warnings: int = 0
    unchecked: int = 0
    read_s: float = 0.0
    decode_s: float = 0.0
    transform_s: float = 0.0
    wait_s: float = 0.0
    copy_s: float = 0.0
    elapsed_s: float = 0.0
    gpu_images: int = 0
    gpu_fallback: int = 0
    gpu_decode_s: float = 0.0
    gpu_augment_s: float = 0.0
    gpu_copy_s: float = 0.0
    gpu_fetch_wait_s: float = 0.0
    gpu_host_s: float = 0.0

    def add(self, other: StageStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def since(self, earlier: StageStats) -> StageStats:
        """What accumulated between ``earlier`` (a copy of these counters) and now.

        It writes nothing, so threads may go on adding to these counters meanwhile: nothing they
        add is lost or counted twice.

        Example:
            >>> import copy
            >>> s = StageStats(batches=3); before = copy.copy(s); s.batches += 2
            >>> s.since(before).batches
            2
        """
        return StageStats(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})

    @property
    def images_per_second(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        """All counters plus ``images_per_second``, JSON-able."""
        return {**asdict(self), "images_per_second": self.images_per_second}
