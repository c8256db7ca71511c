"""``shardkit index --classes FILE``: the names of the labels, line 1 label 0, each once."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.index.adopt import adopt_shards
from tests.index.test_adopt import _write_wds


def test_a_class_list_with_a_blank_line_or_a_name_twice_is_refused(tmp_path: Path) -> None:
    """A blank line was dropped (moving every later label) and a name given twice was listed twice."""
    root = _write_wds(tmp_path / "wds")
    for text, expected in (("cat\n\ndog\neel\n", "line 2 is blank; line N names label N-1"),
                           ("cat\ncat\ndog\n", "'cat' is on lines 1 and 2; class names must differ")):
        names = tmp_path / "classes.txt"
        names.write_text(text)
        result = CliRunner().invoke(cli, ["index", str(root), "--classes", str(names)])
        assert result.exit_code == 2 and expected in result.output, result.output
        assert not (root / "index.json").exists()
    names.write_text("cat\ndog\neel\n\n\n")  # blank lines at the end name no label
    assert CliRunner().invoke(cli, ["index", str(root), "--classes", str(names)]).exit_code == 0
    with pytest.raises(ValueError, match="class 'cat' is named for labels 0 and 2"):
        adopt_shards(str(root), classes=["cat", "dog", "cat"], overwrite=True)


def test_labels_no_sample_has_below_the_largest_are_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A mistyped label (12 among 0-2) made a 13-class list without a word; --classes is quiet."""
    import logging

    import webdataset as wds

    from tests.conftest import encode_image

    root = tmp_path / "wds"
    root.mkdir()
    with wds.ShardWriter(str(root / "train-%06d.tar"), maxcount=10) as sink:
        for i, label in enumerate([0, 1, 2, 0, 12]):
            sink.write({"__key__": f"s{i:05d}", "jpg": encode_image((16, 16)), "cls": str(label).encode()})
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        manifest = adopt_shards(str(root))
    assert len(manifest.classes or ()) == 13
    said = [r.getMessage() for r in caplog.records if "label no sample" in r.getMessage()]
    assert said == ["shardkit: labels run from 0 to 12, but 9 of them label no sample (3, 4, 5, 6, 7, …): the class "
                    "list holds all 13 (a mistyped label? label 12 is first at "
                    f"{root / 'train-000000.tar'}:s00004); pass --classes FILE to name the classes"]
