"""``shardkit index`` on a folder with no ``*.tar`` directly in it says what it found instead."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shardkit.errors import FormatError, ManifestError
from shardkit.index.adopt import adopt_shards
from tests.index.test_adopt import _write_wds


def test_shards_one_folder_down_or_named_in_capitals_are_pointed_at(tmp_path: Path) -> None:
    shards = _write_wds(tmp_path / "top" / "train")
    with pytest.raises(ManifestError, match=r"no .tar shards here to index \(found train/train-000000.tar, "
                                            r"train/train-000001.tar, ... one folder down: index the folder"):
        adopt_shards(str(tmp_path / "top"))
    upper = tmp_path / "upper"
    upper.mkdir()
    shutil.copy(shards / "train-000000.tar", upper / "A.TAR")
    with pytest.raises(ManifestError, match=r"\(found A.TAR: shard names end in .tar, in lower case; rename them\)"):
        adopt_shards(str(upper))


def test_shards_two_folders_down_in_several_folders_are_pointed_at_each_and_a_mix(tmp_path: Path) -> None:
    """``I/train/part0/*.tar`` and ``I/train/part1/*.tar``: said as nothing to index before."""
    for part in ("part0", "part1"):
        _write_wds(tmp_path / "I" / "train" / part, n=12)
    with pytest.raises(ManifestError) as refused:
        adopt_shards(str(tmp_path / "I"))
    assert str(refused.value).endswith(
        "no .tar shards here to index (found train/part0/train-000000.tar, train/part0/train-000001.tar, ... two "
        "folders down: index the folder that holds the shards; only the files directly in it are read; shards in "
        "several folders (train/part0, train/part1) are datasets of their own: index each, and pass them together "
        "to ShardLoader([...]) to read them as one)")


def test_an_imagefolder_tree_is_pointed_at_pack(tmp_path: Path) -> None:
    (tmp_path / "tree" / "cat").mkdir(parents=True)
    (tmp_path / "tree" / "cat" / "a.JPEG").write_bytes(b"x")
    told = (r"\(it holds folders of images, as an ImageFolder tree does: `shardkit pack DIR SHARDS` packs it into "
            r"shards\)")
    with pytest.raises(ManifestError, match=rf"no .tar shards here to index {told}$"):
        adopt_shards(str(tmp_path / "tree"))
    (tmp_path / "none" / "cat").mkdir(parents=True)
    with pytest.raises(ManifestError, match=r"no .tar shards here to index$"):
        adopt_shards(str(tmp_path / "none"))


def test_a_remote_location_that_does_not_exist_is_said_to_be_missing() -> None:
    with pytest.raises(ManifestError, match=r"memory://no-such-folder\S*: does not exist"):
        adopt_shards("memory://no-such-folder/x")


def test_a_sample_whose_members_are_apart_is_said_to_be_split(tmp_path: Path) -> None:
    """It was 'sample 'k0' has field 'cls' twice', about a sample that has each field once."""
    from tests.index.test_adopt import _tar

    _tar(tmp_path / "a-000000.tar", [("k0.jpg", b"x"), ("k1.jpg", b"x"), ("k1.cls", b"1"), ("k0.cls", b"0")])
    with pytest.raises(FormatError, match=r"a-000000.tar: sample 'k0' is split across the shard \(a member of it "
                                          r"at byte \d+ follows other samples"):
        adopt_shards(str(tmp_path))
