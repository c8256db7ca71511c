"""Tests of the sample-data generators and of the shipped sample ImageFolder tree."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as F

from sample_data import generate as g
from sample_data import imagenet_like

SAMPLE = Path(g.__file__).resolve().parent
REPO = SAMPLE.parent


def _tree_bytes(paths: list[Path], root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in paths}


# --------------------------------------------------------------------------- ImageNet-like


def test_imagenet_like_is_byte_identical_for_a_seed_whatever_the_workers(tmp_path: Path) -> None:
    kw: dict[str, Any] = {"classes": 2, "per_class": 4, "size": (120, 100)}
    a = g.make_imagenet_like(tmp_path / "a", seed=3, **kw)
    b = g.make_imagenet_like(tmp_path / "b", seed=3, workers=2, **kw)
    c = g.make_imagenet_like(tmp_path / "c", seed=4, **kw)
    assert _tree_bytes(a, tmp_path / "a") == _tree_bytes(b, tmp_path / "b")
    assert _tree_bytes(a, tmp_path / "a") != _tree_bytes(c, tmp_path / "c")


def test_imagenet_like_layout_sizes_and_order(tmp_path: Path) -> None:
    paths = g.make_imagenet_like(tmp_path, classes=2, per_class=10, seed=0)
    dataset = ImageFolder(str(tmp_path))
    assert dataset.classes == ["n00000000", "n00000001"]
    assert [Path(p) for p, _ in dataset.samples] == paths
    sizes = []
    for p in paths:
        with Image.open(p) as im:
            assert 340 <= im.width <= 460 and 297 <= im.height <= 403, (p, im.size)
            assert im.format == ("PNG" if p.suffix == ".png" else "JPEG")
        sizes.append(p.stat().st_size)
    assert 30_000 <= np.mean(sizes) <= 100_000, sizes


def test_imagenet_like_has_a_few_grayscale_cmyk_and_png() -> None:
    # The kind of file is drawn from the same seeded stream at any size: small images are enough.
    formats = []
    for i in range(400):
        _, data = imagenet_like._imagenet_like_bytes(i, i % 10, 0, (48, 40), str(g.PHOTO_DIR))
        with Image.open(io.BytesIO(data)) as im:
            formats.append(f"{im.format}/{im.mode}")
    assert 1 <= formats.count("PNG/RGB") <= 12
    assert 1 <= formats.count("JPEG/CMYK") <= 12
    assert 2 <= formats.count("JPEG/L") <= 20
    assert formats.count("JPEG/RGB") >= 360


def test_odd_file_shares_change_only_the_odd_files() -> None:
    def draw(odd: g.OddFiles) -> list[tuple[str, bytes]]:
        out = []
        for i in range(400):
            _, data = imagenet_like._imagenet_like_bytes(i, i % 10, 0, (48, 40), str(g.PHOTO_DIR), odd)
            with Image.open(io.BytesIO(data)) as im:
                out.append((f"{im.format}/{im.mode}", data))
        return out

    default, none, imagenet = draw(g.OddFiles()), draw(g.OddFiles(0, 0, 0)), draw(g.IMAGENET_ODD_FILES)
    assert {kind for kind, _ in none} == {"JPEG/RGB"}
    assert {kind for kind, _ in imagenet} == {"JPEG/RGB", "JPEG/L"}  # no PNG or CMYK in 400 draws at 1 in 55,000
    assert {kind for kind, _ in default} == {"JPEG/RGB", "JPEG/L", "JPEG/CMYK", "PNG/RGB"}
    colour = [i for i, (kind, _) in enumerate(default) if kind == "JPEG/RGB"]
    assert len(colour) >= 360
    assert all(default[i][1] == none[i][1] == imagenet[i][1] for i in colour)  # the same bytes


def test_imagenet_like_rejects_bad_arguments(tmp_path: Path) -> None:
    for shares in ((-0.1, 0, 0), (0.5, 0.5, 0.1), (0, 2, 0)):
        with pytest.raises(ValueError, match="odd-file shares"):
            g.OddFiles(*shares)
    with pytest.raises(ValueError):
        g.make_imagenet_like(tmp_path, classes=0)
    with pytest.raises(FileNotFoundError):
        g.make_imagenet_like(tmp_path, photo_dir=tmp_path)


# --------------------------------------------------------------------------- indexed


@pytest.mark.parametrize("ext", ["jpg", "png", "JPEG", "webp"])
def test_indexed_tree_matches_imagefolder_order(tmp_path: Path, ext: str) -> None:
    paths = g.make_indexed_imagefolder(tmp_path, classes=3, per_class=4, ext=ext)
    dataset = ImageFolder(str(tmp_path))
    assert [Path(p) for p, _ in dataset.samples] == paths
    for i, (img, label) in enumerate(dataset):
        assert g.decode_index(np.asarray(img)) == i
        assert label == i // 4


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchvision.io decode
def test_decode_index_survives_jpeg_crop_resize_flip(tmp_path: Path) -> None:
    classes, per_class = 8, 512  # all 4096 colours, the extremes included
    paths = g.make_indexed_imagefolder(
        tmp_path, classes=classes, per_class=per_class, size=(24, 16)
    )
    assert len(paths) == g.MAX_INDEXED
    gen = torch.Generator().manual_seed(0)
    for i, p in enumerate(paths[::7]):
        index = 7 * i
        t = decode_image(str(p), mode=ImageReadMode.RGB)
        top, left = (int(v) for v in torch.randint(0, 6, (2,), generator=gen))
        t = F.resized_crop(t, top, left, 10, 14, [37, 53], antialias=True)
        t = F.horizontal_flip(t)
        assert g.decode_index(t) == index
        assert g.decode_index(t.float() / 255) == index
        assert g.decode_index(t.permute(1, 2, 0).numpy()) == index
        assert g.decode_index(t.unsqueeze(0).float()) == index


def test_decode_index_rejects_non_index_images() -> None:
    with pytest.raises(ValueError):
        g.decode_index(np.full((8, 8, 3), 8, dtype=np.uint8))  # halfway between two levels
    with pytest.raises(ValueError):
        g.decode_index(np.zeros((8, 8), dtype=np.uint8))
    with pytest.raises(ValueError):
        g.index_color(g.MAX_INDEXED)


def test_indexed_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        g.make_indexed_imagefolder(tmp_path, ext="gif")
    with pytest.raises(ValueError):
        g.make_indexed_imagefolder(tmp_path, classes=2, per_class=g.MAX_INDEXED)


# --------------------------------------------------------------------------- CLI


def test_cli_writes_both_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert g.main(["indexed", str(tmp_path / "i"), "--classes", "2", "--per-class", "3"]) == 0
    assert len(list((tmp_path / "i").glob("*/*.jpg"))) == 6
    argv = ["imagenet-like", str(tmp_path / "n"), "--classes", "1", "--per-class", "2"]
    assert g.main([*argv, "--size", "64", "48"]) == 0
    assert len(list((tmp_path / "n" / "n00000000").iterdir())) == 2
    assert "wrote 2 images" in capsys.readouterr().out
    assert g.main([*argv, "--size", "64", "48", "--odd", "imagenet"]) == 0


def test_generator_does_not_need_skimage() -> None:
    code = "import sys, sample_data.generate; sys.exit('skimage' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# --------------------------------------------------------------------------- shipped data


def test_shipped_imagefolder_is_a_valid_torchvision_imagefolder() -> None:
    dataset = ImageFolder(str(SAMPLE / "imagefolder"))
    assert len(dataset.classes) == 10
    assert 280 <= len(dataset) <= 320
    counts = np.bincount(dataset.targets)
    assert counts.min() >= 20
    modes: dict[str, int] = {}
    for path, _ in dataset.samples:
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            key = f"{im.format}/{im.mode}"
            modes[key] = modes.get(key, 0) + 1
    for case in ("JPEG/L", "JPEG/CMYK", "PNG/RGB", "PNG/RGBA", "PNG/P"):
        assert modes.get(case, 0) >= 1, (case, modes)
    names = [Path(p).name for p, _ in dataset.samples]
    assert any(n.endswith(".JPEG") for n in names)
    assert any(not n.isascii() for n in names)
    assert dataset[0][0].mode == "RGB"


def test_shipped_photos_and_size_budget() -> None:
    photos = sorted((SAMPLE / "photos").glob("*.jpg"))
    assert len(photos) >= 10
    for p in photos:
        with Image.open(p) as im:
            assert im.format == "JPEG" and 300 <= max(im.size) <= 640
    total = sum(p.stat().st_size for p in SAMPLE.rglob("*") if p.is_file())
    assert total < 6_000_000
