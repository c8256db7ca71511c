"""Pack, then read back through shardkit and plain webdataset; compare with torchvision's
ImageFolder."""

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from shardkit.format import iter_samples, load_offsets, make_key, offsets_name
from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store
from tests.trees import CORRUPT, make_tricky_tree

SAMPLE_DATA = Path(__file__).resolve().parents[2] / "sample_data" / "imagefolder"
IMAGE_EXTS = {"jpg", "png", "webp", "bmp", "tiff", "ppm", "pgm"}


def _read_shardkit(dst: Path) -> dict[str, dict[str, bytes]]:
    manifest = read_manifest(Store(str(dst)))
    samples: dict[str, dict[str, bytes]] = {}
    for shard in manifest.shards:
        with open(dst / shard.url, "rb") as f:
            read = list(iter_samples(f, where=shard.url))
        spans = load_offsets((dst / offsets_name(shard.url)).read_bytes(), where=shard.url)
        assert [k for k, _ in read] == [s.key for s in spans]
        assert len(read) == shard.num_samples
        samples.update(read)
    return samples


def _read_webdataset(dst: Path) -> dict[str, dict[str, bytes]]:
    import webdataset as wds

    urls = [str(dst / s.url) for s in read_manifest(Store(str(dst))).shards]
    return {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
            for s in wds.WebDataset(urls, shardshuffle=False)}


def check_round_trip(src: Path, dst: Path, invalid: set[str]) -> None:
    """Every valid torchvision sample is in the shards with its bytes, label and metadata."""
    from torchvision.datasets import ImageFolder

    reference = ImageFolder(str(src))
    manifest = read_manifest(Store(str(dst)))
    assert list(manifest.classes or ()) == reference.classes
    ours, theirs = _read_shardkit(dst), _read_webdataset(dst)
    assert ours == theirs
    width = max(8, len(str(len(reference.samples) - 1)))
    expected_keys = set()
    for index, (path, label) in enumerate(reference.samples):
        rel = Path(path).relative_to(src).as_posix()
        if rel in invalid:
            continue
        key = make_key(index, width)
        expected_keys.add(key)
        fields = ours[key]
        images = [e for e in fields if e in IMAGE_EXTS]
        assert len(images) == 1, fields.keys()
        assert fields[images[0]] == Path(path).read_bytes(), rel
        assert int(fields["cls"]) == label
        meta = json.loads(fields["json"])
        with Image.open(path) as img:
            size = img.size
        assert meta == {"label": label, "class": reference.classes[label], "source": rel,
                        "width": size[0], "height": size[1]}
    assert set(ours) == expected_keys
    assert manifest.num_samples == len(expected_keys)


def test_tricky_tree_round_trip(tmp_path):
    src = make_tricky_tree(tmp_path)
    dst = tmp_path / "out"
    result = pack(str(src), str(dst), options=PackOptions(max_count=4), workers=2)
    check_round_trip(src, dst, set(CORRUPT))
    manifest = result.manifest
    reasons = {s["source"]: s["reason"] for s in manifest.skipped}
    assert set(reasons) == set(CORRUPT)
    for rel, why in CORRUPT.items():
        assert why in reasons[rel], (rel, reasons[rel])
    assert verify_dataset(str(dst), decode=True).ok
    exts = {e for s in _read_shardkit(dst).values() for e in s if e in IMAGE_EXTS}
    assert exts == {"jpg", "png", "webp", "bmp", "tiff"}  # lower case, .jpeg/.JPEG -> jpg
    assert sorted(p.name for p in dst.iterdir()) == sorted(
        ["index.hashes", "index.json", "index.table"] + [s.url for s in manifest.shards]
        + [offsets_name(s.url) for s in manifest.shards])


def test_shuffle_spreads_and_no_shuffle_keeps_order(small_tree, tmp_path):
    ordered = pack(str(small_tree), str(tmp_path / "a"),
                   options=PackOptions(max_count=5, shuffle=False), workers=1)
    keys = list(_read_shardkit(tmp_path / "a"))
    assert keys == [make_key(i, 8) for i in range(12)]
    assert [s.num_samples for s in ordered.manifest.shards] == [5, 5, 2]
    pack(str(small_tree), str(tmp_path / "b"), options=PackOptions(max_count=5, seed=1), workers=1)
    shuffled = list(_read_shardkit(tmp_path / "b"))
    assert sorted(shuffled) == keys and shuffled != keys
    assert _read_shardkit(tmp_path / "b") == _read_shardkit(tmp_path / "a")


def test_decompression_bomb_limit_is_respected(small_tree, tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    (small_tree / "class0" / "big.jpg").write_bytes(
        (lambda b: b.getvalue())(_save(Image.new("RGB", (15, 15)), "JPEG")))
    result = pack(str(small_tree), str(tmp_path / "out"), workers=1)
    bombs = [s for s in result.manifest.skipped if "decompression bomb" in s["reason"]]
    assert [s["source"] for s in bombs] == ["class0/big.jpg"]
    assert result.manifest.num_samples == 12


def test_an_image_torchvision_loads_past_pils_warning_is_packed(small_tree, tmp_path, monkeypatch):
    """Between PIL's MAX_IMAGE_PIXELS and twice it, PIL warns and ImageFolder loads the image: a sample."""
    import warnings

    from torchvision.datasets import ImageFolder

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    (small_tree / "class0" / "large.jpg").write_bytes(_save(Image.new("RGB", (12, 12), (200, 9, 9)), "JPEG").getvalue())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        assert ImageFolder(str(small_tree))[4][0].size == (12, 12)  # class0/large.jpg, sorted after img*
    result = pack(str(small_tree), str(tmp_path / "out"), workers=1)
    assert result.manifest.num_samples == 13 and not result.manifest.skipped


def _save(img, fmt):
    out = io.BytesIO()
    img.save(out, fmt)
    return out


def test_resize_max_reencodes_large_images(small_tree, tmp_path):
    large = _save(Image.new("RGB", (40, 30), (9, 9, 9)), "PNG").getvalue()
    (small_tree / "class1" / "large.png").write_bytes(large)
    result = pack(str(small_tree), str(tmp_path / "out"),
                  options=PackOptions(resize_max=10, quality=80), workers=1)
    assert result.manifest.options["resize_max"] == 10 and result.manifest.options["quality"] == 80
    samples = _read_shardkit(tmp_path / "out")
    large = next(s for s in samples.values()
                 if json.loads(s["json"])["source"] == "class1/large.png")
    assert "png" not in large and json.loads(large["json"])["width"] == 13
    assert Image.open(io.BytesIO(large["jpg"])).size == (13, 10)
    small = next(s for s in samples.values()
                 if json.loads(s["json"])["source"] == "class0/img0.jpg")
    assert small["jpg"] == (small_tree / "class0" / "img0.jpg").read_bytes()  # shorter side 6 <= 10


@pytest.mark.skipif(not SAMPLE_DATA.is_dir(), reason="sample_data/imagefolder not present")
def test_shipped_sample_data_round_trip(tmp_path):
    dst = tmp_path / "out"
    pack(str(SAMPLE_DATA), str(dst), options=PackOptions(max_count=64), workers=2)
    check_round_trip(SAMPLE_DATA, dst, set())
    assert read_manifest(Store(str(dst))).skipped == ()
