"""Generated ImageFolder trees full of edge cases, captioned folders and img2dataset-style shards,
shared by the sources, pack, loader and interop tests."""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
import zlib
from pathlib import Path

from PIL import Image

from tests.conftest import encode_image, write_tree


def huge_header_png(width: int = 40000, height: int = 40000) -> bytes:
    """A tiny, well-formed PNG whose header claims ``width x height`` pixels (a decompression
    bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def _encode(mode: str, fmt: str, size: tuple[int, int] = (10, 7), **save: object) -> bytes:
    out = io.BytesIO()
    colors: dict[str, float | tuple[float, ...]] = {"L": 90, "CMYK": (0, 50, 100, 20),
                                                    "RGBA": (9, 8, 7, 128), "P": 3, "I;16": 4000}
    color = colors.get(mode, (1, 2, 3))
    Image.new(mode, size, color).save(out, fmt, **save)
    return out.getvalue()


#: Files that are not valid images, and why the pack must skip them.
CORRUPT = {
    "plain/zero.jpg": "empty file",
    "plain/truncated.jpg": "truncated JPEG",
    "plain/truncated.png": "truncated PNG",
    "plain/text.jpg": "not an image",
    "plain/bomb.png": "decompression bomb",
    "plain/dangling.jpg": "unreadable file",
}


def make_tricky_tree(base: Path) -> Path:
    """Write ``base/src``: odd names, nesting, links, many modes/formats and corrupt files."""
    root = base / "src"
    noisy = io.BytesIO()
    Image.effect_noise((96, 64), 60).convert("RGB").save(noisy, "JPEG")
    big_jpeg = noisy.getvalue()
    write_tree(root, {
        "a cls/my photo.v2.jpg": encode_image((12, 9)),
        "a cls/UPPER.JPEG": encode_image((13, 9), color=(5, 5, 5)),
        "a cls/.hidden.jpg": encode_image((14, 9), color=(6, 6, 6)),
        "a cls/notes.txt": b"not an image extension: ignored by torchvision and us",
        "b.dots/gray.jpg": _encode("L", "JPEG"),
        "b.dots/cmyk.jpg": _encode("CMYK", "JPEG"),
        "b.dots/rgba.PNG": _encode("RGBA", "PNG"),
        "b.dots/palette.png": _encode("P", "PNG"),
        "b.dots/sixteen.png": _encode("I;16", "PNG"),
        "b.dots/lossless.webp": _encode("RGB", "WEBP", lossless=True),
        "b.dots/bitmap.bmp": _encode("RGB", "BMP"),
        "b.dots/scan.tif": _encode("RGB", "TIFF"),
        "ünïcødé/文件 名.PNG": encode_image((9, 9), fmt="PNG"),
        "ünïcødé/ça.jpeg": encode_image((11, 9), color=(250, 1, 1)),
        "plain/sub/deeper/nested.jpg": encode_image((15, 9), color=(7, 7, 7)),
        "plain/sub/a.jpg": encode_image((16, 9), color=(8, 8, 8)),
        "plain/z.jpg": encode_image((17, 9), color=(9, 9, 9)),
        "plain/zero.jpg": b"",
        "plain/truncated.jpg": big_jpeg[: len(big_jpeg) // 2],
        "plain/truncated.png": _encode("RGB", "PNG", (64, 48))[:-30],
        "plain/text.jpg": b"hello, I am text\n",
        "plain/bomb.png": huge_header_png(),
        "../outside/real.jpg": encode_image((18, 9), color=(100, 0, 100)),
        "../outside_cls/linked.jpg": encode_image((19, 9), color=(0, 100, 100)),
        "../outside_sub/in_linked_sub.jpg": encode_image((20, 9), color=(50, 50, 0)),
    })
    os.symlink(base / "outside/real.jpg", root / "plain/link.jpg")
    os.symlink(base / "outside_cls", root / "zz linked class")
    os.symlink(base / "outside_sub", root / "plain/linked_sub")
    os.symlink(base / "missing.jpg", root / "plain/dangling.jpg")
    return root


def packed_train_val(root: Path) -> dict[str, Path]:
    """Two packed sets under ``root`` whose pixels encode their index: ``train``, 48 samples (2
    classes of 24), and ``val``, 42 (2 of 21), in shards of 8: what the recipes and framework
    tests run at 2 ranks of batch 4."""
    from sample_data.generate import make_indexed_imagefolder
    from shardkit.pack import PackOptions, pack

    out = {}
    for name, per_class in (("train", 24), ("val", 21)):
        make_indexed_imagefolder(root / f"{name}-src", classes=2, per_class=per_class, size=(40, 32))
        pack(str(root / f"{name}-src"), str(root / name), options=PackOptions(max_count=8, seed=1), workers=1)
        out[name] = root / name
    return out


def add_captions(root: Path, *, extra_every: int = 2) -> dict[str, str]:
    """Write a ``.txt`` caption beside every image under ``root`` (``"<class> photo number <i>"``,
    with a non-ASCII word in every third) and, for every ``extra_every``-th image, a ``.json`` of
    extra fields (``{"url", "similarity"}``); returns ``{relative image path: caption}``, in the
    order an ImageFolder (and a captioned folder) lists them."""
    suffixes = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
    images = sorted((p for p in root.rglob("*") if p.suffix.lower() in suffixes),
                    key=lambda p: (p.parent.relative_to(root).as_posix(), p.name))
    captions = {}
    for i, image in enumerate(images):
        rel = image.relative_to(root).as_posix()
        caption = f"{image.parent.name} photo number {i}" + (" — très joli" if i % 3 == 0 else "")
        image.with_suffix(".txt").write_text(caption + "\n", encoding="utf-8")
        if i % extra_every == 0:
            image.with_suffix(".json").write_text(f'{{"url": "https://example.com/{i}.jpg", "similarity": 0.{i}}}')
        captions[rel] = caption
    return captions


def make_caption_folder(dst: Path, *, classes: int = 3, per_class: int = 2) -> dict[str, str]:
    """Copy the first ``per_class`` images of the first ``classes`` classes of the shipped
    ``sample_data/imagefolder`` to ``dst`` and caption them (:func:`add_captions`)."""
    import shutil

    shipped = Path(__file__).resolve().parent.parent / "sample_data" / "imagefolder"
    for cls in sorted(p for p in shipped.iterdir() if p.is_dir())[:classes]:
        (dst / cls.name).mkdir(parents=True, exist_ok=True)
        for image in sorted(cls.iterdir())[:per_class]:
            shutil.copyfile(image, dst / cls.name / image.name)
    return add_captions(dst)


def img2dataset_shards(root: Path, *, shards: int = 2, per_shard: int = 3) -> dict[str, dict[str, bytes]]:
    """Shards as img2dataset writes them (``00000.tar`` with ``000000000.jpg``/``.txt``/``.json``, a
    stats file beside), through ``tarfile``; returns every sample's members by key."""
    root.mkdir(parents=True)
    written = {}
    for s in range(shards):
        with tarfile.open(root / f"{s:05d}.tar", "w") as tar:
            for j in range(per_shard):
                key = f"{s:05d}{j:04d}"
                members = {"jpg": encode_image((10 + j, 8 + s), color=(s * 90, j * 70, 5)),
                           "txt": f"caption {key} — é".encode(),
                           "json": json.dumps({"key": key, "status": "success", "url": f"https://x/{key}.jpg",
                                               "caption": f"caption {key} — é"}).encode()}
                if j == 1:
                    members["exif"] = b'{"Image Make": "x"}'
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                written[key] = members
        (root / f"{s:05d}_stats.json").write_text("{}")
    return written
