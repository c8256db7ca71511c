"""The ShardLoader side of a benchmark: the loader configured like the baselines."""

from __future__ import annotations

from typing import Any

__all__ = ["caption_shardloader", "detection_shardloader", "shardloader", "shardloader_stages"]


def shardloader(dataset: str, *, size: int, train: bool, batch_size: int, workers: int,
                device: str = "cpu", seed: int = 0, **options: Any) -> Any:
    """A shuffled ``ShardLoader`` with ``imagenet_train(size)`` or ``imagenet_val(size)``.

    ``drop_last=True`` (as the baselines); ``device="cuda"`` delivers batches on the GPU through
    the loader's CUDA path (nvJPEG decode and batched GPU augmentation where available, else CPU
    decode and a copy). ``options`` are passed on to :class:`shardkit.ShardLoader`.

    Example::

        loader = shardloader("shards/", size=224, train=True, batch_size=64, workers=2)
    """
    from shardkit.loader import ShardLoader
    from shardkit.transforms import imagenet_train, imagenet_val

    transform = imagenet_train(size) if train else imagenet_val(size)
    return ShardLoader(dataset, batch_size=batch_size, transform=transform, num_workers=workers,
                       device=device, shuffle=True, seed=seed, drop_last=True, **options)


def caption_shardloader(dataset: str, *, size: int, train: bool, batch_size: int, workers: int,
                        device: str = "cpu", seed: int = 0, context_length: int = 77, **options: Any) -> Any:
    """:func:`shardloader` over a captioned dataset, its captions tokenized in the workers with the
    bench's :class:`~shardkit.transforms.ByteTokenizer` (``text_transform``): batches are
    ``(images, int64 [B, context_length])``, as the webdataset caption baseline's."""
    from shardkit.transforms import ByteTokenizer

    return shardloader(dataset, size=size, train=train, batch_size=batch_size, workers=workers, device=device,
                       seed=seed, text_transform=ByteTokenizer(context_length), **options)


def detection_shardloader(dataset: str, *, min_size: int, max_size: int, batch_size: int, workers: int,
                          device: str = "cpu", seed: int = 0, **options: Any) -> Any:
    """A shuffled ``ShardLoader`` over a COCO dataset with ``detection_train(min_size, max_size)``
    (``drop_last=True``, as the CocoDetection baseline); batches are ``(images, targets)`` lists."""
    from shardkit.loader import ShardLoader
    from shardkit.transforms import detection_train

    return ShardLoader(dataset, batch_size=batch_size, transform=detection_train(min_size, max_size),
                       num_workers=workers, device=device, shuffle=True, seed=seed, drop_last=True, **options)


def shardloader_stages(loader: Any) -> dict[str, float] | None:
    """The loader's per-stage counters (``read_s``, ``decode_s``, ``transform_s``, …) as a dict."""
    stats = getattr(loader, "stats", None)
    return stats.as_dict() if stats is not None and hasattr(stats, "as_dict") else None
