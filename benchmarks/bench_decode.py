"""One-core images/s of decode and decode + RandomResizedCrop(224) + flip, vs the PIL baseline.

Conditions: encoded bytes already in memory (no file I/O), ``torch.set_num_threads(1)``, 200
generated ~400x350 JPEGs (smooth random content + noise, q75-95, ~50-100 KB), best of
``--rounds`` interleaved passes over all images.
Run: ``.venv/bin/python benchmarks/bench_decode.py``.
"""

from __future__ import annotations

import argparse
import io
import random
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch
import torchvision.transforms.v2 as v2
from PIL import Image

from shardkit.codec.decode import DecodeStats, decode_backend, decode_rgb
from shardkit.transforms import imagenet_train, imagenet_val


def make_jpegs(n: int, seed: int = 0) -> list[bytes]:
    """``n`` JPEGs of about 400x350 (+-10%), smooth colour fields plus noise, q75-95."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = int(rng.integers(320, 385)), int(rng.integers(360, 441))
        low = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(
            (w, h), Image.Resampling.BICUBIC
        )
        arr = np.asarray(low, dtype=np.float32) + rng.normal(0, 20, (h, w, 3))
        buf = io.BytesIO()
        Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(
            buf, "JPEG", quality=int(rng.integers(75, 96))
        )
        out.append(buf.getvalue())
    return out


def rates(
    cases: dict[str, Callable[[bytes], object]],
    data: list[bytes],
    rounds: int,
    clock: Callable[[], float],
) -> dict[str, float]:
    """Best images/s of each case over ``rounds`` passes, cases interleaved within each round.

    Interleaving and best-of keep a shared, noisy machine from favouring whichever case ran
    while it was quiet.
    """
    best = dict.fromkeys(cases, 0.0)
    for fn in cases.values():
        for d in data[:20]:  # warm-up
            fn(d)
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = clock()
            for d in data:
                fn(d)
            best[name] = max(best[name], len(data) / (clock() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this process's CPU time (stable on a busy shared box; excludes time "
        "descheduled)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", DeprecationWarning)
    data = make_jpegs(args.n)
    kb = np.mean([len(d) for d in data]) / 1024

    pil_tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    tv_tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    train, val, rng, stats = imagenet_train(224), imagenet_val(224), random.Random(0), DecodeStats()
    slot_cl = torch.empty(1, 3, 224, 224, dtype=torch.uint8).to(memory_format=torch.channels_last)[
        0
    ]
    slot_chw = torch.empty(3, 224, 224, dtype=torch.uint8)

    def tv_decode(d: bytes) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_jpeg

        return decode_jpeg(
            torch.frombuffer(bytearray(d), dtype=torch.uint8), mode=ImageReadMode.RGB
        )

    cases: dict[str, Callable[[bytes], object]] = {
        "(a) PIL decode + v2 PIL RRC+flip (baseline)": lambda d: pil_tf(
            Image.open(io.BytesIO(d)).convert("RGB")
        ),
        "    torchvision.io decode + v2 tensor RRC+flip": lambda d: tv_tf(tv_decode(d)),
        "    PIL decode only": lambda d: Image.open(io.BytesIO(d)).convert("RGB"),
        "(b) decode_rgb only": lambda d: decode_rgb(d, stats=stats),
        "(c) decode_rgb + imagenet_train (new tensor)": lambda d: train(decode_rgb(d), rng),
        "(c) decode_rgb + imagenet_train -> channels-last slot": lambda d: _apply(
            train, d, rng, slot_cl
        ),
        "    decode_rgb + imagenet_train -> CHW slot": lambda d: _apply(train, d, rng, slot_chw),
        "    decode_rgb + imagenet_val -> channels-last slot": lambda d: _apply(
            val, d, rng, slot_cl
        ),
    }
    print(
        f"{len(data)} JPEGs, mean {kb:.0f} KB; decode backend: {decode_backend()}; 1 thread; "
        f"{args.clock} clock"
    )
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for name, r in rates(cases, data, args.rounds, clock).items():
        print(f"{name:58s} {r:7.0f} img/s")
    print(f"decode paths: {stats}")


def _apply(t: object, d: bytes, rng: random.Random, out: torch.Tensor) -> torch.Tensor:
    img = decode_rgb(d)
    return t.apply(img, t.sample_params(img.shape[1], img.shape[2], rng), out)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
