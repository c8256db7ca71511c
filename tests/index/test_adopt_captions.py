"""``shardkit index`` on img2dataset-style shards (image, txt, json and more): indexed in place,
every member kept, the kind told from the samples, a sample without a caption named."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.errors import FormatError
from shardkit.index.adopt import adopt_shards
from shardkit.index.manifest_io import read_manifest
from shardkit.index.verify import verify_dataset
from shardkit.storage import Store
from tests.conftest import encode_image
from tests.trees import img2dataset_shards


def test_index_adopts_captioned_shards_keeping_every_member(tmp_path: Path) -> None:
    written = img2dataset_shards(tmp_path / "wds")
    before = {p.name: p.read_bytes() for p in (tmp_path / "wds").glob("*.tar")}
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "wds")])
    assert result.exit_code == 0, result.output
    assert "2 shards, 6 samples, captioned images" in result.output
    manifest = read_manifest(Store(str(tmp_path / "wds")))
    assert manifest.kind == "captions" and manifest.adopted and manifest.classes is None
    assert manifest.num_samples == 6
    assert {p.name: p.read_bytes() for p in (tmp_path / "wds").glob("*.tar")} == before  # not rewritten
    report = verify_dataset(str(tmp_path / "wds"), decode=True)
    assert report.ok and report.images_decoded == 6

    from shardkit.loader.read.reader import ShardReader

    reader = ShardReader(Store(str(tmp_path / "wds")), manifest.shards, cache_dir=str(tmp_path / "cache"))
    for shard, entry in enumerate(manifest.shards):
        for index in range(entry.num_samples):
            key, fields = reader.read(shard, index)
            assert fields == written[key]  # exif too


def test_a_class_list_for_captioned_shards_is_refused_at_their_first_sample(tmp_path: Path) -> None:
    """--classes with the kind left to auto: one line saying the shards are captioned (each sample
    was refused for its missing cls before), and nothing written."""
    img2dataset_shards(tmp_path / "wds")
    (tmp_path / "cls.txt").write_text("cat\ndog\n")
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "wds"), "--classes", str(tmp_path / "cls.txt")])
    assert result.exit_code == 1, result.output
    assert "this first sample has a txt member and no cls: the shards hold captioned images" in result.output
    assert result.output.count("no 'cls' member") == 0, result.output
    assert not (tmp_path / "wds" / "index.json").exists()


def test_a_sample_without_caption_is_named(tmp_path: Path) -> None:
    img2dataset_shards(tmp_path / "wds", shards=1)
    with tarfile.open(tmp_path / "wds" / "00001.tar", "w") as tar:
        data = encode_image()
        info = tarfile.TarInfo("000010000.jpg")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(FormatError, match=r"00001\.tar:000010000: sample has no 'txt' member \(has \['jpg'\]\)"):
        adopt_shards(str(tmp_path / "wds"))
    with pytest.raises(FormatError, match=r"sample has no 'cls' member"):
        adopt_shards(str(tmp_path / "wds"), kind="imagefolder")
    assert not (tmp_path / "wds" / "index.json").exists()


def test_a_caption_that_is_not_utf8_is_indexed_said_and_replaced_by_the_loader(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from shardkit import ShardLoader

    img2dataset_shards(tmp_path / "wds", shards=1)
    with tarfile.open(tmp_path / "wds" / "00001.tar", "w") as tar:
        for name, data in (("000010000.jpg", encode_image()), ("000010000.txt", b"caf\xe9")):  # Latin-1
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        manifest = adopt_shards(str(tmp_path / "wds"))  # one such caption used to stop the whole index
    assert manifest.num_samples == 4
    assert [r.getMessage() for r in caplog.records] == [
        f"shardkit: 1 caption is not UTF-8 text ({tmp_path / 'wds'}/00001.tar:000010000: unexpected end of data "
        "at byte 3); indexed all the same: the loader replaces such samples with others (on_error='replace'), and "
        "shardkit verify reports them as problems"]
    assert any("000010000.txt: caption is not UTF-8" in p for p in verify_dataset(str(tmp_path / "wds")).problems)
    with ShardLoader(str(tmp_path / "wds"), batch_size=4, keys=True, shuffle=False) as loader:
        [(_images, texts, keys)] = list(loader)
    assert "000010000" not in keys and len(texts) == 4 and loader.stats.replaced == 1


def test_an_empty_caption_is_indexed_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An adopted sample whose txt holds nothing (or only white space) was indexed and delivered
    as '' without a word, where pack skips such an input."""
    import logging

    img2dataset_shards(tmp_path / "wds", shards=1)
    with tarfile.open(tmp_path / "wds" / "00001.tar", "w") as tar:
        for key, caption in (("000010000", b" \n"), ("000010001", b""), ("000010002", b"a dog")):
            for name, data in ((f"{key}.jpg", encode_image()), (f"{key}.txt", caption)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        manifest = adopt_shards(str(tmp_path / "wds"))
    assert manifest.num_samples == 6
    assert [r.getMessage() for r in caplog.records] == [
        f"shardkit: 2 captions are empty ({tmp_path / 'wds'}/00001.tar:000010000, and 1 more); indexed all the same: "
        "the loader delivers them as '' (shardkit pack skips an input without a caption)"]
