"""The acceptance rule (docs/guides/pack.md): an image is packed if and only if the loader's
CPU decoder (``decode_rgb``, PIL's ``convert("RGB")``) decodes it; by default a JPEG whose end
marker ends the file is packed undecoded, ``decode_check`` decodes those too."""

from __future__ import annotations

import io
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardkit.codec.decode import decode_rgb
from shardkit.errors import DecodeError
from shardkit.format import iter_samples
from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store
from tests.conftest import write_tree


def _pattern(width: int, height: int) -> Image.Image:
    return Image.frombytes("RGB", (width, height),
                           bytes((i * 37 + i // 7) % 256 for i in range(width * height * 3)))


def _encode(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


def _png_without_iend() -> bytes:
    data = _encode(_pattern(40, 30), "PNG")
    assert data[-12:] == b"\0\0\0\0IEND" + zlib.crc32(b"IEND").to_bytes(4, "big")
    return data[:-12]


def _png_damaged_pixels() -> bytes:
    """Every chunk present (IEND too), the zlib stream in IDAT damaged: PIL cannot decode it."""
    data = bytearray(_encode(_pattern(40, 30), "PNG"))
    start = data.index(b"IDAT") + 4
    data[start + 20 : start + 40] = b"\xa5" * 20
    return bytes(data)


def _jpeg_broken_scan() -> bytes:
    """Header and end marker intact, a marker in the middle of the scan: PIL cannot decode it."""
    data = bytearray(_encode(_pattern(64, 48), "JPEG"))
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff\xc4" * 32
    return bytes(data)


def _decodes(data: bytes) -> bool:
    try:
        decode_rgb(data)
    except DecodeError:
        return False
    return True


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    good = _encode(_pattern(30, 20), "JPEG")
    write_tree(root, {
        "a/good.jpg": good,
        "a/good.png": _encode(_pattern(20, 30), "PNG"),
        "a/no_iend.png": _png_without_iend(),
        "a/damaged.png": _png_damaged_pixels(),
        "a/trailer.jpg": good + bytes(range(256)) * 16,  # 4 KiB after the end marker
        "a/truncated.jpg": good[: len(good) * 2 // 3],
        "a/broken_scan.jpg": _jpeg_broken_scan(),
    })
    return root


def _stored(dst: Path) -> dict[str, bytes]:
    out = {}
    for shard in read_manifest(Store(str(dst))).shards:
        with open(dst / shard.url, "rb") as f:
            for _key, fields in iter_samples(f, where=shard.url):
                image = next(v for k, v in fields.items() if k not in ("cls", "json"))
                out[json.loads(fields["json"])["source"]] = bytes(image)
    return out


@pytest.mark.parametrize("decode_check", [False, True])
def test_packed_if_and_only_if_the_loader_decodes(tree: Path, tmp_path: Path,
                                                  decode_check: bool) -> None:
    dst = tmp_path / "out"
    result = pack(str(tree), str(dst), workers=1,
                  options=PackOptions(max_count=4, decode_check=decode_check))
    stored = _stored(dst)
    skipped = {s["source"]: s["reason"] for s in result.manifest.skipped}
    # the JPEG exception: packed undecoded by default, found by decode_check
    exception = {"a/broken_scan.jpg"} if not decode_check else set()
    for path in sorted(tree.rglob("*.*")):
        rel = path.relative_to(tree).as_posix()
        source = path.read_bytes()
        if _decodes(source) or rel in exception:
            assert rel in stored, (rel, skipped.get(rel))
            assert stored[rel] == source, rel
        else:
            assert rel in skipped and rel not in stored, rel
    assert sorted(stored) == sorted(["a/good.jpg", "a/good.png", "a/no_iend.png", "a/trailer.jpg"]
                                    + sorted(exception))
    # what the loader gets from the IEND-less PNG is what PIL gives
    with Image.open(io.BytesIO(stored["a/no_iend.png"])) as img:
        expected = np.asarray(img.convert("RGB"))
    np.testing.assert_array_equal(decode_rgb(stored["a/no_iend.png"]).permute(1, 2, 0).numpy(),
                                  expected)
    assert skipped["a/damaged.png"].startswith("corrupt image data (")
    assert skipped["a/truncated.jpg"].startswith("truncated JPEG (no end-of-image marker")
    if decode_check:
        assert skipped["a/broken_scan.jpg"].startswith("corrupt image data (")
        assert verify_dataset(str(dst), decode=True).ok


def _format_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "--uniform-names" in r.getMessage()]


def test_the_mixed_formats_warning_counts_the_images_packed_not_those_skipped(
        tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # 7 files (4 .jpg, 3 .png), of which truncated.jpg and damaged.png are skipped: the warning
    # said "7 images are 4 jpg and 3 png" above a summary of 5 samples.
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        result = pack(str(tree), str(tmp_path / "out"), workers=1, options=PackOptions(max_count=4))
    assert result.manifest.num_samples == 5 and len(result.manifest.skipped) == 2
    said = _format_warnings(caplog)
    assert len(said) == 1 and said[0].startswith("shardkit: 5 images are 3 jpg and 2 png: "), said


def test_no_mixed_formats_warning_where_every_image_of_the_other_format_is_skipped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_tree(tmp_path / "src", {"a/one.jpg": _encode(_pattern(30, 20), "JPEG"),
                                  "a/two.jpg": _encode(_pattern(20, 30), "JPEG"),
                                  "a/damaged.png": _png_damaged_pixels()})
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        result = pack(str(tmp_path / "src"), str(tmp_path / "out"), workers=1)
    assert result.manifest.num_samples == 2 and [s["source"] for s in result.manifest.skipped] == ["a/damaged.png"]
    assert _format_warnings(caplog) == []


def test_the_mixed_formats_warning_counts_the_members_by_their_bytes_not_their_file_names(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A PNG named ``.jpg`` is packed as a ``.png`` member (names follow the bytes): webdataset's
    ``to_tuple("jpg")`` then fails at it, and no warning said so; JPEGs named ``.png`` drew a
    warning about members that are all ``.jpg``."""
    jpeg, png = _encode(_pattern(30, 20), "JPEG"), _encode(_pattern(20, 30), "PNG")
    write_tree(tmp_path / "hidden", {"a/one.jpg": jpeg, "a/two.jpg": jpeg, "b/disguised.jpg": png})
    write_tree(tmp_path / "named", {"a/one.jpg": jpeg, "a/two.jpg": jpeg, "b/really_a_jpeg.png": jpeg})
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        pack(str(tmp_path / "hidden"), str(tmp_path / "hidden_out"), workers=1)
    said = _format_warnings(caplog)
    assert len(said) == 1 and said[0].startswith("shardkit: 3 images are 2 jpg and 1 png: "), said
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        pack(str(tmp_path / "named"), str(tmp_path / "named_out"), workers=1)
    assert _format_warnings(caplog) == []
    with open(tmp_path / "named_out" / "shard-000000.tar", "rb") as f:
        members = {ext for _key, fields in iter_samples(f, where="shard-000000.tar") for ext in fields}
    assert members == {"jpg", "cls", "json"}


def test_a_shard_whose_every_input_is_skipped_is_left_out_of_the_dataset(tmp_path: Path) -> None:
    """Shards are cut from the listing before the inputs are read: one whose inputs all fail to
    pack held no sample, and HF datasets' webdataset loader fails on an empty first tar."""
    pointer = b"version https://git-lfs.github.com/spec/v1\n"  # a file git-lfs did not fetch
    write_tree(tmp_path / "src", {**{f"a/lfs{i}.jpg": pointer for i in range(4)},
                                  **{f"b/{i}.jpg": _encode(_pattern(20 + i, 10), "JPEG") for i in range(4)}})
    dst = tmp_path / "out"
    result = pack(str(tmp_path / "src"), str(dst), workers=1, options=PackOptions(max_count=4, shuffle=False))
    shards = result.manifest.shards
    assert [(s.url, s.num_samples) for s in shards] == [("shard-000001.tar", 4)] and len(result.manifest.skipped) == 4
    assert sorted(p.name for p in dst.iterdir()) == ["index.hashes", "index.json", "index.table", "shard-000001.idx",
                                                     "shard-000001.tar"]
    assert verify_dataset(str(dst)).ok
    again = pack(str(tmp_path / "src"), str(dst), workers=1, options=PackOptions(max_count=4, shuffle=False))
    assert again.manifest == result.manifest  # the same command again: already packed


def test_a_class_whose_every_input_is_skipped_is_named_in_a_warning(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    write_tree(tmp_path / "src", {"a/one.jpg": _encode(_pattern(30, 20), "JPEG"),
                                  "b/pointer.jpg": b"version https://git-lfs.github.com/spec/v1\n",
                                  "b/empty.jpg": b""})
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        result = pack(str(tmp_path / "src"), str(tmp_path / "out"), workers=1)
    assert result.manifest.classes == ("a", "b") and result.manifest.num_samples == 1
    assert [r.getMessage() for r in caplog.records if "holds no sample" in r.getMessage()] == [
        "shardkit: class 'b' holds no sample: its 2 inputs were all skipped; it keeps its label, as in ImageFolder"]
