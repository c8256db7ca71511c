"""The reliability experiments on image bytes: bounded fuzzing of the C extensions (R10) and the
acceptance rule, what pack keeps against what the loader decodes (R1). Run by
``python -m benchmarks.reliability``, which writes the report.

The fuzzing runs in a child process (``python -m benchmarks.reliability.codec fuzz-child N SEED``)
so that a crash or a hang is counted, not suffered, and so that its stderr (fd 2, where libjpeg
would print) is exactly what a user would see.
"""

from __future__ import annotations

import collections
import io
import json
import random
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from benchmarks.reliability.report import ROOT, Row, fmt_counts
from shardkit.errors import ShardkitError

FUZZ_CASES = 3000


def _photo(width: int = 64, height: int = 48, seed: int = 0) -> Image.Image:
    rng = random.Random(seed)
    pixels = bytes((x * 3 + y * 5 + rng.randrange(40)) % 256 for y in range(height) for x in range(width)
                   for _ in range(3))
    return Image.frombytes("RGB", (width, height), pixels)


def _encode(img: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **options)
    return out.getvalue()


def _bases() -> list[bytes]:
    """JPEGs of every kind the extensions take or hand back: baseline 4:2:0 and 4:4:4,
    progressive, grayscale, CMYK, restart-indexed."""
    from shardkit.codec import jpeg_restart

    img = _photo()
    base = _encode(img, "JPEG", quality=90)
    kinds = [base, _encode(img, "JPEG", quality=75, subsampling=0), _encode(img, "JPEG", progressive=True),
             _encode(img.convert("L"), "JPEG"), _encode(img.convert("CMYK"), "JPEG")]
    restarted = jpeg_restart.transcode(base, 2)
    return kinds + ([restarted] if restarted is not None else [])


def _mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:  # a few bit flips
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # a run of random bytes
        at = rng.randrange(len(b))
        b[at:at + rng.randint(1, 16)] = rng.randbytes(rng.randint(1, 16))
    elif kind == 2:  # truncated
        del b[rng.randrange(2, len(b)):]
    elif kind == 3:  # bytes inserted
        at = rng.randrange(len(b))
        b[at:at] = rng.randbytes(rng.randint(1, 8))
    elif kind == 4:  # a segment whose length lies
        markers = [i for i in range(len(b) - 3) if b[i] == 0xFF and b[i + 1] in (0xC0, 0xC2, 0xC4, 0xDA, 0xDB, 0xDD)]
        if markers:
            at = rng.choice(markers) + 2
            b[at:at + 2] = rng.randrange(65536).to_bytes(2, "big")
    else:  # a slice repeated
        at, n = rng.randrange(len(b)), rng.randint(1, 256)
        b[at:at] = b[at:at + n]
    return bytes(b)


def _fuzz_child(cases: int, seed: int) -> None:
    """Feed ``cases`` mutated JPEGs to each entry point; print the outcome counts as JSON."""
    from shardkit.codec import _jpeg_region, _jpeg_restart  # type: ignore[attr-defined]
    from shardkit.codec.decode import decode_rgb

    rng = random.Random(seed)
    bases = _bases()
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def run(name: str, call: Callable[..., Any], *args: Any) -> None:
        try:
            result = call(*args)
        except ValueError:
            counts[name]["ValueError"] += 1
        except ShardkitError as err:
            counts[name][type(err).__name__] += 1
        except Exception as err:  # noqa: BLE001 - the point is to count these
            counts[name]["FOREIGN " + type(err).__name__] += 1
        else:
            counts[name]["None" if result is None else "ok"] += 1

    for _ in range(cases):
        data = _mutate(rng.choice(bases), rng)
        top, left, height, width = rng.randrange(64), rng.randrange(80), rng.randint(1, 64), rng.randint(1, 80)
        run("decode", _jpeg_region.decode, data)
        run("decode_crop", _jpeg_region.decode_crop, data, top, left, height, width)
        run("transcode", _jpeg_restart.transcode, data, rng.randint(1, 8))
        run("cut", _jpeg_restart.cut, data, top, left, height, width, rng.randint(0, 16))
        run("decode_rgb", decode_rgb, data)
    print(json.dumps({name: dict(c) for name, c in counts.items()}))


def r10_fuzz(cases: int = FUZZ_CASES, seed: int = 10) -> Row:
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks.reliability.codec", "fuzz-child", str(cases),
                               str(seed)], capture_output=True, text=True, timeout=600,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        hung = False
    except subprocess.TimeoutExpired:
        done, hung = None, True
    if done is None or done.returncode != 0:
        why = "hung (600 s)" if hung else f"exit {done.returncode if done else '?'}"
        figure = f"{why}: {(done.stderr if done else '')[-200:]!r}"
    else:
        counts = json.loads(done.stdout)
        foreign = sum(v for c in counts.values() for k, v in c.items() if k.startswith("FOREIGN"))
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raw = sum(line.startswith(("Corrupt JPEG", "Premature end", "Warning:")) for line in lines)
        per = "; ".join(f"{name}: {fmt_counts(collections.Counter(c))}" for name, c in counts.items())
        figure = (f"0 crashes, 0 hangs; {foreign} foreign exception types; {raw} raw libjpeg lines on stderr "
                  f"({len(lines)} line(s) in all: the first libjpeg warning, logged once); {per}")
    return ("R10", "bounded fuzzing of the C extensions", f"{cases} mutated JPEGs (seed {seed}: bit flips, random "
            "runs, truncation, insertions, lying segment lengths, repeated slices of baseline, 4:4:4, progressive, "
            "gray, CMYK and restart-indexed JPEGs), each through `_jpeg_region.decode`/`decode_crop`, "
            "`_jpeg_restart.transcode`/`cut` and `decode_rgb`, in a child process", figure,
            "0 crashes, 0 hangs, only ValueError (C) / DecodeError (decode_rgb), 0 raw libjpeg lines on stderr")


def _damaged_files(rng: random.Random) -> dict[str, bytes]:
    """Images damaged the ways the acceptance rule must tell apart."""
    files: dict[str, bytes] = {}
    for i in range(12):
        img = _photo(64, 48, seed=i)
        jpeg, png = _encode(img, "JPEG", quality=85), _encode(img, "PNG")
        scan = jpeg.index(b"\xff\xda")
        flipped = bytearray(jpeg)
        for _ in range(4):
            flipped[rng.randrange(scan + 20, len(jpeg) - 2)] ^= 1 << rng.randrange(8)
        idat = png.index(b"IDAT") + 4
        files.update({
            f"ok-{i}.jpg": jpeg,
            f"no-eoi-{i}.jpg": jpeg[:rng.randrange(scan + 20, len(jpeg) - 2)],
            f"scan-flips-{i}.jpg": bytes(flipped),
            f"stray-bytes-{i}.jpg": jpeg[:scan] + b"\x00\x01\x02" + jpeg[scan:],
            f"png-no-iend-{i}.png": png[:-12],
            f"png-cut-{i}.png": png[:rng.randrange(idat + 8, len(png) - 12)],
            f"png-idat-{i}.png": png[:idat + 10] + b"\xa5" * 12 + png[idat + 22:],
        })
    files["trailer.jpg"] = _encode(_photo(), "JPEG") + zlib.compress(b"x" * 5000)
    return files


def r1_acceptance(work: Path) -> Row:
    """Packed iff the loader's decoder decodes it: ``decode_rgb`` of the source bytes against
    what ``pack`` kept, in each mode, and a full read of each packed dataset."""
    from shardkit import ShardLoader
    from shardkit.codec.decode import decode_rgb
    from shardkit.pack import PackOptions, pack

    files = _damaged_files(random.Random(1))
    src = work / "r1acc" / "src" / "c0"
    src.mkdir(parents=True)
    for name, data in files.items():
        (src / name).write_bytes(data)
    decodable = set()
    for name, data in files.items():
        try:
            decode_rgb(data)
            decodable.add(name)
        except ShardkitError:
            pass
    parts = []
    for mode, options in (("default", PackOptions(max_count=16)),
                          ("decode_check", PackOptions(max_count=16, decode_check=True)),
                          ("jpeg_restart=4", PackOptions(max_count=16, jpeg_restart=4))):
        dst = work / "r1acc" / mode
        pack(str(src.parent), str(dst), options=options, workers=1)
        skipped = {Path(s["source"]).name for s in json.loads((dst / "index.json").read_text())["skipped"]}
        packed = set(files) - skipped
        with ShardLoader(str(dst), batch_size=8, on_error="replace") as loader:
            for _ in loader:
                pass
            replaced = loader.stats.replaced
        parts.append(f"{mode}: {len(packed)} packed, {len(packed - decodable)} of them undecodable "
                     f"({replaced} replaced when read), {len(decodable - packed)} decodable but skipped")
    return ("R1", "acceptance rule: packed iff the loader decodes it", f"{len(files)} files (seed 1): intact, "
            "truncated and scan-damaged JPEGs, JPEGs with stray bytes before the scan (libjpeg warns, decodes), "
            "a JPEG with a trailer, PNGs without IEND, cut short or with a damaged IDAT; `decode_rgb` of each "
            f"source ({len(decodable)} decodable) against what `pack` kept", "; ".join(parts),
            "0 decodable skipped; 0 undecodable packed with decode_check or jpeg_restart (default mode takes a JPEG "
            "whose end marker ends the file undecoded, by design)")


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "fuzz-child":
    _fuzz_child(int(sys.argv[2]), int(sys.argv[3]))
