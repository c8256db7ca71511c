"""Options of a pack run, and parsing of human sizes like ``256MB``."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from shardkit.codec import jpeg_restart
from shardkit.format.spec import check_prefix

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """Parse ``"256MB"``, ``"1.5GiB"``, ``"4096"`` (bytes) into a byte count.

    >>> parse_size("256MB")
    256000000
    """
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r} (examples: 256MB, 1GiB, 100000)")
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class PackOptions:
    """What a pack run does to its input; recorded in ``index.json`` ``options``.

    ``max_count``/``max_size`` bound each shard (``max_size`` is planned from input file sizes
    plus tar overhead; a single larger sample still gets its own shard). ``shuffle``/``seed``
    permute samples across shards. ``resize_max``: re-encode images whose shorter side exceeds
    it to JPEG of that shorter side at ``quality``. ``decode_check``: fully decode JPEGs too
    (slower); by default every other image is decoded in full and a JPEG whose end-of-image
    marker ends the file is taken without decoding (README "Pack": the acceptance rule).

    ``jpeg_restart``: store every YCbCr or grayscale JPEG (including ``resize_max`` output)
    losslessly re-encoded with a restart marker every ``jpeg_restart`` MCUs at most
    (:func:`shardkit.codec.jpeg_restart.transcode`): same DCT coefficients, so identical
    pixels in any decoder, but the loader can decode just the intervals a crop covers (1 loaded
    fastest, CPU and GPU: docs/performance.md). Sizes move a few percent either way: optimised
    Huffman tables save, markers cost ~2.5 bytes each (measured with 1 / 4: -0.4% / -2.0% on the
    benchmark's ImageNet-like set, -2.1% / -3.9% on ``sample_data/imagefolder``, +6.8% / +0.6%
    on the already optimised ``sample_data/photos``; grayscale, with 8x8 MCUs, +8% to +21% at 1).
    Costs pack CPU: one entropy decode and encode per JPEG, measured at about 2.7 ms per 512x512
    photo on one core (about twice ``decode_check``'s full decode) and 0.4 ms per 130x130 crop.
    A JPEG libjpeg refuses to transcode (corrupt scan data, warnings included) keeps its
    source bytes when PIL decodes it and is skipped otherwise. CMYK/RGB JPEGs and
    multi-picture (MPO) files keep their bytes. Off by
    default because the shards then no longer hold the source files' bytes.
    Needs shardkit's C extension: without it, constructing options with it set raises.

    ``uniform_names``: name every sample's image member ``jpg`` whatever its format (format
    version 2, docs/concepts/format.md §2.2), so tools that take a dataset's columns from its first samples
    (HF ``datasets``, webdataset ``to_tuple("jpg", "cls")``, DALI ``ext``) get every sample.
    ``dali_index``: also write DALI's index file beside each shard (docs/concepts/format.md §9).
    """

    max_count: int = 1000
    max_size: int = 256 * 10**6
    shuffle: bool = True
    seed: int = 0
    prefix: str = "shard"
    resize_max: int | None = None
    quality: int = 90
    decode_check: bool = False
    jpeg_restart: int | None = None
    uniform_names: bool = False
    dali_index: bool = False

    def __post_init__(self) -> None:
        if self.max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {self.max_count}")
        if self.max_size < 1:
            raise ValueError(f"max_size must be >= 1 byte, got {self.max_size}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")
        if self.resize_max is not None and self.resize_max < 1:
            raise ValueError(f"resize_max must be >= 1 pixel, got {self.resize_max}")
        # an option that would change nothing is refused: recorded, it would refuse a re-run without it
        if self.resize_max is None and self.quality != 90:
            raise ValueError(f"quality={self.quality} applies with resize_max only (the quality of the images it "
                             "re-encodes); other images are packed as they are")
        if not self.shuffle and self.seed != 0:
            raise ValueError(f"seed={self.seed} applies with shuffle=True only; shuffle=False packs in the "
                             "source's order")
        if self.jpeg_restart is not None:
            if self.jpeg_restart < 1:
                raise ValueError(f"jpeg_restart must be >= 1 MCU, got {self.jpeg_restart}")
            if not jpeg_restart.available():
                raise ValueError("jpeg_restart needs shardkit's C extension "
                                 "shardkit.codec._jpeg_restart, which is not built here (install "
                                 "the libjpeg headers, then reinstall shardkit)")
        check_prefix(self.prefix)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
