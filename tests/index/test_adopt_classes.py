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
