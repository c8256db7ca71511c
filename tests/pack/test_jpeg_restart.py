"""``PackOptions.jpeg_restart`` / ``--jpeg-restart``: JPEGs stored restart-indexed, pixels
unchanged."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from sample_data.coco_gen import make_coco
from shardkit.bench.api import check_same_data
from shardkit.cli import cli
from shardkit.codec import jpeg_restart
from shardkit.codec.decode import decode_rgb
from shardkit.errors import PackError
from shardkit.format import iter_samples
from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import PackOptions, pack, pack_coco
from shardkit.pack.encode import SkipSample, encode_sample
from shardkit.sources.base import SourceSample
from shardkit.storage import Store
from tests.conftest import write_tree

pytestmark = pytest.mark.skipif(not jpeg_restart.available(),
                                reason="C extension _jpeg_restart not built")

PHOTOS = Path(__file__).resolve().parents[2] / "sample_data" / "photos"
OPTIONS = PackOptions(max_count=4, jpeg_restart=4)


def _noise(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _encode(img: Image.Image, fmt: str = "JPEG", **save: object) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **save)
    return out.getvalue()


def _corrupt_jpeg() -> bytes:
    """Header and end marker intact; the scan data is damaged (libjpeg warns, the lossless
    transcode refuses it) but PIL decodes it: the loader does, so it is packed."""
    good = _encode(_noise(96, 64, 9), quality=90)
    return good[:-400] + b"\xff\xd3" * 60 + good[-280:]


def _broken_jpeg() -> bytes:
    """Header and end marker intact; a marker in the middle of the scan: PIL cannot decode it."""
    data = bytearray(_encode(_noise(64, 48, 10), quality=90))
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff\xc4" * 32
    return bytes(data)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    files = {f"photo/{p.name}": p.read_bytes() for p in sorted(PHOTOS.glob("*.jpg"))[:5]}
    files.update({
        "made/s420.jpg": _encode(_noise(77, 41, 1), subsampling=2),
        "made/s422.jpg": _encode(_noise(50, 33, 2), subsampling=1),
        "made/s444.jpg": _encode(_noise(31, 17, 3), subsampling=0),
        "made/gray.jpg": _encode(_noise(40, 40, 4).convert("L")),
        "made/progressive.jpg": _encode(_noise(64, 48, 5), progressive=True),
        "made/tiny.jpg": _encode(_noise(1, 1, 6)),
        "made/cmyk.jpg": _encode(Image.new("CMYK", (20, 12), (0, 50, 100, 20))),
        "made/lossless.png": _encode(_noise(20, 12, 7), "PNG"),
        "made/corrupt.jpg": _corrupt_jpeg(),
        "made/broken.jpg": _broken_jpeg(),
    })
    write_tree(root, files)
    return root


def _images(dst: Path) -> dict[str, bytes]:
    """``{source path: stored image bytes}`` read with shardkit's tar reader."""
    out = {}
    for shard in read_manifest(Store(str(dst))).shards:
        with open(dst / shard.url, "rb") as f:
            for _key, fields in iter_samples(f, where=shard.url):
                image = next(v for k, v in fields.items() if k not in ("cls", "json"))
                out[json.loads(fields["json"])["source"]] = image
    return out


def _shard_files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.is_file()}


def test_pixels_equal_torchvision_and_bytes_restart_indexed(tree: Path, tmp_path: Path) -> None:
    from torchvision.datasets import ImageFolder

    dst = tmp_path / "out"
    result = pack(str(tree), str(dst), options=OPTIONS, workers=1)
    stored = _images(dst)
    reference = ImageFolder(str(tree))
    assert len(stored) == len(reference.samples) - 1  # all but the one PIL cannot decode
    for path, _label in reference.samples:
        rel = Path(path).relative_to(tree).as_posix()
        if rel == "made/broken.jpg":
            continue
        source = Path(path).read_bytes()
        with Image.open(io.BytesIO(stored[rel])) as img:
            ours = np.asarray(img.convert("RGB"))
        np.testing.assert_array_equal(ours, np.asarray(reference.loader(path)), err_msg=rel)
        if rel in ("made/cmyk.jpg", "made/lossless.png", "made/corrupt.jpg"):
            # not YCbCr/gray JPEG, or not transcodable but decodable: original bytes
            assert stored[rel] == source, rel
            assert jpeg_restart.cut(stored[rel], 0, 0, 1, 1) is None
        else:
            assert stored[rel] != source, rel
            assert jpeg_restart.cut(stored[rel], 0, 0, 1, 1) is not None, rel  # restart-indexed
    (skip,) = result.manifest.skipped
    assert (skip["source"] == "made/broken.jpg"
            and skip["reason"].startswith("corrupt image data ("))
    assert result.manifest.options["jpeg_restart"] == 4
    assert json.loads((dst / "index.json").read_text())["options"]["jpeg_restart"] == 4
    verify_dataset(str(dst), decode=True)


def test_without_option_bytes_are_the_source(tree: Path, tmp_path: Path) -> None:
    result = pack(str(tree), str(tmp_path / "out"), options=PackOptions(max_count=4), workers=1)
    assert result.manifest.options["jpeg_restart"] is None
    stored = _images(tmp_path / "out")
    assert stored["photo/chelsea.jpg"] == (tree / "photo" / "chelsea.jpg").read_bytes()
    # a JPEG with its end marker is packed undecoded (README "Pack": the one exception)
    assert "made/corrupt.jpg" in stored and "made/broken.jpg" in stored


def test_plain_webdataset_reads_the_shards(tree: Path, tmp_path: Path) -> None:
    import webdataset as wds

    dst = tmp_path / "out"
    pack(str(tree), str(dst), options=OPTIONS, workers=1)
    urls = [str(dst / s.url) for s in read_manifest(Store(str(dst))).shards]
    dataset = wds.WebDataset(urls, shardshuffle=False).decode("pil")
    samples = list(dataset.to_tuple("jpg;png", "cls", "json"))
    stored = _images(dst)
    assert len(samples) == len(stored)
    for img, _cls, meta in samples:
        with Image.open(io.BytesIO(stored[meta["source"]])) as ours:
            np.testing.assert_array_equal(np.asarray(img), np.asarray(ours.convert("RGB")))


def test_byte_reproducible_across_runs_and_workers(tree: Path, tmp_path: Path) -> None:
    first = pack(str(tree), str(tmp_path / "a"), options=OPTIONS, workers=1)
    pack(str(tree), str(tmp_path / "b"), options=OPTIONS, workers=2)
    assert len(first.manifest.shards) > 2
    assert _shard_files(tmp_path / "a") == _shard_files(tmp_path / "b")


def test_changed_option_is_a_different_dataset(tree: Path, tmp_path: Path) -> None:
    dst = str(tmp_path / "out")
    pack(str(tree), dst, options=OPTIONS, workers=1)
    assert pack(str(tree), dst, options=OPTIONS, workers=1).already_complete
    for other in (PackOptions(max_count=4, jpeg_restart=2), PackOptions(max_count=4)):
        with pytest.raises(PackError, match="different packed dataset"):
            pack(str(tree), dst, options=other, workers=1)
    redone = pack(str(tree), dst, options=PackOptions(max_count=4, jpeg_restart=2), workers=1,
                  overwrite=True)
    assert redone.manifest.options["jpeg_restart"] == 2


def test_resize_output_is_restart_indexed(tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    pack(str(tree), str(dst), options=PackOptions(max_count=4, jpeg_restart=4, resize_max=10),
         workers=1)
    stored = _images(dst)
    with Image.open(io.BytesIO(stored["photo/chelsea.jpg"])) as img:
        assert min(img.size) == 10
    assert jpeg_restart.cut(stored["photo/chelsea.jpg"], 0, 0, 1, 1) is not None
    # PNG re-encoded to JPEG
    assert jpeg_restart.cut(stored["made/lossless.png"], 0, 0, 1, 1) is not None


def test_coco_pixels_and_geometry_unchanged(tmp_path: Path) -> None:
    images_dir, ann = make_coco(tmp_path / "coco", images=6)
    dst = tmp_path / "out"
    result = pack_coco(str(images_dir), str(ann), str(dst), options=OPTIONS, workers=1)
    assert result.manifest.num_samples == 6 and result.manifest.options["jpeg_restart"] == 4
    jpegs = 0
    for shard in result.manifest.shards:
        with open(dst / shard.url, "rb") as f:
            for _key, fields in iter_samples(f, where=shard.url):
                record = json.loads(fields["json"])["image"]
                source = (images_dir / record["file_name"]).read_bytes()
                (image,) = (v for k, v in fields.items() if k != "json")
                jpegs += source[:2] == b"\xff\xd8"
                assert (image != source) == (source[:2] == b"\xff\xd8"), record["file_name"]
                with (Image.open(io.BytesIO(image)) as ours,
                      Image.open(io.BytesIO(source)) as theirs):
                    assert ours.size == theirs.size == (record["width"], record["height"])
                    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert jpegs >= 3


def test_cli_flag(tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    result = CliRunner().invoke(cli, ["pack", str(tree), str(dst), "--workers", "1",
                                      "--jpeg-restart", "4"])
    assert result.exit_code == 0, result.output
    assert read_manifest(Store(str(dst))).options["jpeg_restart"] == 4
    assert jpeg_restart.cut(_images(dst)["photo/chelsea.jpg"], 0, 0, 1, 1) is not None
    bad = CliRunner().invoke(cli, ["pack", str(tree), str(tmp_path / "x"), "--jpeg-restart", "0"])
    assert bad.exit_code == 2 and "--jpeg-restart" in bad.output


def test_option_validation() -> None:
    with pytest.raises(ValueError, match="jpeg_restart must be >= 1"):
        PackOptions(jpeg_restart=0)
    assert PackOptions().jpeg_restart is None


def test_missing_extension_fails_early(monkeypatch: pytest.MonkeyPatch, tree: Path,
                                       tmp_path: Path) -> None:
    options = PackOptions(jpeg_restart=4)  # made while the extension is there, used where it is not
    monkeypatch.setattr(jpeg_restart, "_cut", None)
    monkeypatch.setattr(jpeg_restart, "_transcode", None)
    with pytest.raises(ValueError, match="C extension"):
        PackOptions(jpeg_restart=4)
    PackOptions()  # the option off needs nothing
    result = CliRunner().invoke(cli,
                                ["pack", str(tree), str(tmp_path / "x"), "--jpeg-restart", "4"])
    assert result.exit_code == 1 and "Usage:" not in result.output, result.output  # an install's fault, said so
    assert result.output.startswith("Error: --jpeg-restart needs shardkit's C extension shardkit.codec._jpeg_restart,")
    assert not (tmp_path / "x").exists()
    photo = tree / "photo" / "chelsea.jpg"
    sample = SourceSample(path=str(photo), rel="photo/chelsea.jpg", size=photo.stat().st_size,
                          label=0)
    with pytest.raises(PackError, match="C extension"):  # a pack error, not a skipped sample
        encode_sample(sample, photo.read_bytes(), classes=["photo"], options=options)


def test_encode_sample_skips_corrupt() -> None:
    data = _broken_jpeg()
    sample = SourceSample(path="x/broken.jpg", rel="x/broken.jpg", size=len(data),
                          label=0)
    with pytest.raises(SkipSample, match=r"^corrupt image data \("):
        encode_sample(sample, data, classes=["x"], options=OPTIONS)


def test_encode_sample_keeps_a_corrupt_scan_pil_decodes() -> None:
    """The lossless transcode refuses it, the loader decodes it: source bytes kept."""
    data = _corrupt_jpeg()
    with pytest.raises(ValueError):
        jpeg_restart.transcode(data, 4)
    sample = SourceSample(path="x/corrupt.jpg", rel="x/corrupt.jpg", size=len(data),
                          label=0)
    fields = dict(encode_sample(sample, data, classes=["x"], options=OPTIONS))
    assert fields["jpg"] == data
    decode_rgb(fields["jpg"])


def test_bench_refuses_shards_packed_otherwise(tree: Path, tmp_path: Path) -> None:
    shutil.rmtree(tree / "made")  # keep the torchvision-readable photos only
    dst = tmp_path / "out"
    manifest = pack(str(tree), str(dst), options=PackOptions(max_count=4), workers=1).manifest
    data = {"path": str(tree), "classes": 1, "images": 5}
    check_same_data(manifest, data, str(dst), None)
    with pytest.raises(ValueError, match="jpeg_restart=None, not 4"):
        check_same_data(manifest, data, str(dst), 4)
    restarted = pack(str(tree), str(dst), options=OPTIONS, workers=1, overwrite=True).manifest
    check_same_data(restarted, data, str(dst), 4)

