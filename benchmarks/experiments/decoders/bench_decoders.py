"""Which library decodes: torchvision or TorchCodec? Images/s and pixel agreement, CPU or CUDA.

CPU (default): one thread (``torch.set_num_threads(1)``), encoded bytes in memory, the JPEGs of
an ImageNet-like set (``sample_data.generate.make_imagenet_like``: ~400x350, q75-95, 2% gray,
1% CMYK). Contenders: torchvision's op (``torch.ops.image.decode_jpeg``, what ``decode_rgb``
calls today), ``torchvision.io.decode_jpeg`` (the deprecated public function), TorchCodec's
``decode_jpeg``, ``decode_rgb`` with each library chosen (``shardkit.codec.backend.prefer_decoder``), and PIL.
Every round decodes the whole set with every contender, the order rotating each round; the
table gives the median images/s over rounds and the min-max, the same-round ratio to
torchvision's op, and CPU time per image (``time.process_time``, less moved by other load).
Then pixels: each contender against PIL's ``convert("RGB")`` on the set plus gray, CMYK,
progressive and EXIF-rotated JPEGs, PNG and WebP.

CUDA (``--device cuda``): batched decode of the set's nvJPEG-friendly JPEGs (tiled to
``--images``) in batches of ``--batch``, synchronised per batch, from 1 and 4 threads at once
(the GPU loader's prefetcher decodes from threads): torchvision's ``decode_jpeg(list,
device=...)`` and TorchCodec's, bare and through ``GpuJpegDecoder``. Pixels: each library's
output against the CPU decode; EXIF-rotated JPEGs keep their stored shape through shardkit.

Run: ``python -m benchmarks.experiments.decoders.bench_decoders [--device cuda] [--rounds 11]``
(TorchCodec contenders are skipped with a note when ``torchcodec`` does not import).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from sample_data.generate import make_imagenet_like
from shardkit.codec import backend
from shardkit.codec.decode import decode_rgb


def _tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def pil_rgb(b: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(b)) as im:
        return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)


def _use(library: str) -> None:
    """Select ``library`` through shardkit's one switch."""
    backend.prefer_decoder(library)


def imagenet_like(classes: int, per_class: int) -> list[bytes]:
    with tempfile.TemporaryDirectory() as root:
        return [p.read_bytes() for p in make_imagenet_like(root, classes=classes, per_class=per_class)]


def special_cases() -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    y, x = np.mgrid[0:240, 0:320]
    base = np.stack([x * 3 // 4, y, (x + y) // 3], -1) + rng.normal(0, 8, (240, 320, 3))
    rgb = Image.fromarray(base.clip(0, 255).astype(np.uint8))

    def enc(im: Image.Image, fmt: str, **kw: Any) -> bytes:
        buf = io.BytesIO()
        im.save(buf, fmt, **kw)
        return buf.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW on display"
    return {"jpeg gray": enc(rgb.convert("L"), "JPEG", quality=90),
            "jpeg CMYK": enc(rgb.convert("CMYK"), "JPEG", quality=90),
            "jpeg progressive": enc(rgb, "JPEG", quality=85, progressive=True),
            "jpeg 4:4:4": enc(rgb, "JPEG", quality=95, subsampling=0),
            "jpeg EXIF orientation 6": enc(rgb, "JPEG", quality=90, exif=exif.tobytes()),
            "png RGB": enc(rgb, "PNG"), "png RGBA": enc(rgb.convert("RGBA"), "PNG"),
            "webp lossy": enc(rgb, "WEBP", quality=80)}


def cpu_contenders(have_tc: bool) -> dict[str, tuple[str | None, Callable[[bytes], torch.Tensor]]]:
    """name -> (library to select first, or None; decode function of bytes)."""
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as tv_public

    ops, rgb = torch.ops.image, ImageReadMode.RGB.value

    def tv_io(b: bytes) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return tv_public(_tensor(b), mode=ImageReadMode.RGB)

    out: dict[str, tuple[str | None, Callable[[bytes], torch.Tensor]]] = {
        "torchvision op decode_jpeg": (None, lambda b: ops.decode_jpeg(_tensor(b), rgb, False)),
        "torchvision.io.decode_jpeg": (None, tv_io),
    }
    if have_tc:
        from torchcodec.decoders import decode_jpeg as tc_jpeg

        def tc_one(b: bytes) -> torch.Tensor:
            image = tc_jpeg(_tensor(b), mode="RGB")
            assert isinstance(image, torch.Tensor)
            return image

        out["torchcodec decode_jpeg"] = (None, tc_one)
    out["decode_rgb (torchvision)"] = ("torchvision", decode_rgb)
    if have_tc:
        out["decode_rgb (torchcodec)"] = ("torchcodec", decode_rgb)
    out["PIL convert RGB"] = (None, pil_rgb)
    return out


def run_cpu(args: argparse.Namespace, data: list[bytes], have_tc: bool) -> None:
    torch.set_num_threads(1)
    jpegs = [d for d in data if d[:3] == b"\xff\xd8\xff"]
    cases = cpu_contenders(have_tc)
    for lib, fn in cases.values():  # warm-up
        if lib:
            _use(lib)
        for d in jpegs[:20]:
            fn(d)
    rates: dict[str, list[float]] = {name: [] for name in cases}
    cpu_ms: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            lib, fn = cases[name]
            if lib:
                _use(lib)
            t0, c0 = time.perf_counter(), time.process_time()
            for d in jpegs:
                fn(d)
            rates[name].append(len(jpegs) / (time.perf_counter() - t0))
            cpu_ms[name].append((time.process_time() - c0) * 1e3 / len(jpegs))
    print(f"\n{len(jpegs)} JPEGs (mean {np.mean([len(d) for d in jpegs]) / 1e3:.0f} KB), 1 thread, "
          f"{args.rounds} rounds, order rotating per round\n")
    ref = rates[names[0]]
    print(f"| decoder | images/s, median (min-max) | / {names[0]}, same round | CPU ms/image |\n"
          "|---|---:|---:|---:|")
    for name, rs in rates.items():
        ratios = [a / b for a, b in zip(rs, ref, strict=True)]
        ms = cpu_ms[name]
        print(f"| {name} | {statistics.median(rs):.0f} ({min(rs):.0f}-{max(rs):.0f}) | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
              f"{statistics.median(ms):.3f} ({min(ms):.3f}-{max(ms):.3f}) |")

    print("\nPixels against PIL convert('RGB') (identical images / total; max |diff|; errors):\n")
    groups = {"ImageNet-like set": data, **{k: [v] for k, v in special_cases().items()}}
    print("| images | " + " | ".join(names[:-1]) + " |\n|---|" + "---|" * (len(names) - 1))
    for gname, items in groups.items():
        cells = []
        for name in names[:-1]:
            lib, fn = cases[name]
            if lib:
                _use(lib)
            same = maxd = errors = 0
            for d in items:
                try:
                    got, want = fn(d), pil_rgb(d)
                except Exception:  # what this decoder cannot take (decode_rgb falls back itself)
                    errors += 1
                    continue
                if got.shape != want.shape:
                    maxd = 255
                    continue
                diff = int((got.int() - want.int()).abs().max())
                same += diff == 0
                maxd = max(maxd, diff)
            cells.append("raises (not a JPEG)" if errors == len(items)
                         else f"{same}/{len(items)}; {maxd}" + (f"; {errors} raised" if errors else ""))
        print(f"| {gname} | " + " | ".join(cells) + " |")


def run_cuda(args: argparse.Namespace, data: list[bytes], have_tc: bool) -> None:
    from shardkit.codec.nvjpeg import GpuJpegDecoder, nvjpeg_friendly

    device = torch.device("cuda")
    friendly = [d for d in data if nvjpeg_friendly(d)]
    tensors = [_tensor(d) for d in (friendly * (args.images // len(friendly) + 1))[:args.images]]
    batches = [tensors[i:i + args.batch] for i in range(0, len(tensors), args.batch)]

    def tv(batch: list[torch.Tensor]) -> list[torch.Tensor]:
        from torchvision.io import decode_jpeg

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return list(decode_jpeg(batch, mode="RGB", device=device))

    cases: dict[str, tuple[str | None, Callable[[list[torch.Tensor]], list[torch.Tensor]]]] = {
        "torchvision decode_jpeg(list, cuda)": (None, tv)}
    if have_tc:
        from torchcodec.decoders import decode_jpeg as tc_jpeg

        cases["torchcodec decode_jpeg(list, cuda)"] = (None, lambda b: list(tc_jpeg(b, mode="RGB", device=device)))
    for library in ["torchvision"] + (["torchcodec"] if have_tc else []):
        cases[f"GpuJpegDecoder ({library})"] = (library, GpuJpegDecoder(device).decode)

    def one_pass(fn: Callable[[list[torch.Tensor]], list[torch.Tensor]], threads: int) -> float:
        todo = list(batches)
        lock = threading.Lock()

        def work() -> None:
            stream = torch.cuda.Stream(device)
            with torch.cuda.stream(stream):
                while True:
                    with lock:
                        if not todo:
                            return
                        batch = todo.pop()
                    fn(batch)
                    stream.synchronize()

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        torch.cuda.synchronize()
        return len(tensors) / (time.perf_counter() - t0)

    names = list(cases)
    for lib, fn in cases.values():  # warm-up (handles, pinned buffers)
        if lib:
            _use(lib)
        fn(batches[0])
    torch.cuda.synchronize()
    print(f"\n{torch.cuda.get_device_name(device)}; {len(tensors)} JPEGs per pass in batches of "
          f"{args.batch}; {args.rounds} rounds, order rotating per round\n")
    print("| decoder | threads | images/s, median | min-max over rounds |\n|---|---:|---:|---:|")
    for threads in args.threads:
        rates: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                lib, fn = cases[name]
                if lib:
                    _use(lib)
                rates[name].append(one_pass(fn, threads))
        for name, rs in rates.items():
            print(f"| {name} | {threads} | {statistics.median(rs):.0f} | {min(rs):.0f}-{max(rs):.0f} |")

    print("\nPixels against the CPU decode (identical images / total; mean and max |diff|):\n")
    cpu = [pil_rgb(d) for d in friendly]
    for name in names:
        lib, fn = cases[name]
        if lib:
            _use(lib)
        got = [g.cpu() for g in fn([_tensor(d) for d in friendly])]
        diffs = [(g.int() - c.int()).abs() for g, c in zip(got, cpu, strict=True)]
        same = sum(int(d.max()) == 0 for d in diffs)
        mean = float(torch.cat([d.flatten().float() for d in diffs]).mean())
        print(f"- {name}: {same}/{len(cpu)} identical; mean {mean:.3f}, max {max(int(d.max()) for d in diffs)}")
    rotated = special_cases()["jpeg EXIF orientation 6"]
    for library in ["torchvision"] + (["torchcodec"] if have_tc else []):
        _use(library)
        out = GpuJpegDecoder(device).decode([_tensor(rotated)])[0].cpu()
        diff = int((out.int() - pil_rgb(rotated).int()).abs().max()) if out.shape == (3, 240, 320) else -1
        print(f"- EXIF orientation 6 through GpuJpegDecoder ({library}): shape {tuple(out.shape)}, "
              f"max |diff| to PIL {diff} (-1: shape differs)")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.experiments.decoders.bench_decoders",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--classes", type=int, default=3)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--images", type=int, default=4096, help="cuda: JPEGs per pass (the set, tiled)")
    ap.add_argument("--batch", type=int, default=128, help="cuda: JPEGs per batched call")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4], help="cuda: decoding threads")
    args = ap.parse_args()
    try:
        import torchcodec

        have_tc, tc_version = True, torchcodec.__version__
    except Exception as e:  # not installed, or its libraries do not load
        have_tc, tc_version = False, f"not importable ({type(e).__name__}: {e})"
    import torchvision

    print(f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"python {platform.python_version()}, torch {torch.__version__}, torchvision "
          f"{torchvision.__version__}, torchcodec {tc_version}; load average {os.getloadavg()[0]:.2f}")
    data = imagenet_like(args.classes, args.per_class)
    try:
        (run_cuda if args.device == "cuda" else run_cpu)(args, data, have_tc)
    finally:
        backend.prefer_decoder(None)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
