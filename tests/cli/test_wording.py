"""What the commands print agrees with its numbers (``1 shard``, ``2 empty files``), shows every
class name, and measures bytes in the units of the summaries."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.cli import progress as progress_module
from tests.conftest import encode_image, write_tree


def _pack(src: Path, dst: Path, *extra: str) -> str:
    result = CliRunner().invoke(cli, ["pack", str(src), str(dst), "--workers", "1", *extra])
    assert result.exit_code in (0, 1), result.output
    return result.output


def test_counts_agree_with_their_nouns(small_tree: Path, tmp_path: Path) -> None:
    (small_tree / "class0" / "a.jpg").write_bytes(b"")
    (small_tree / "class1" / "b.jpg").write_bytes(b"")
    out = _pack(small_tree, tmp_path / "one")  # 12 images: one shard
    assert "skipped   2: 2 empty files" in out
    verify = CliRunner().invoke(cli, ["verify", str(tmp_path / "one"), "--decode"])
    assert verify.output == f"OK {tmp_path / 'one'}: 1 shard, 12 samples, 12 images decoded\n"
    assert "skipped   2: 2 empty files\n" in CliRunner().invoke(cli, ["info", str(tmp_path / "one")]).output
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("x")
    assert "is not empty (1 entry, e.g. 'mine.txt')" in _pack(small_tree, tmp_path / "busy")


def test_info_lists_every_class_and_its_json_names_them(tmp_path: Path) -> None:
    names = [f"class{k:02d}" for k in range(12)]
    write_tree(tmp_path / "src", {f"{n}/x.jpg": encode_image((8, 6), color=(k * 20, 9, 9))
                                  for k, n in enumerate(names)})
    _pack(tmp_path / "src", tmp_path / "ds", "-q")
    info = CliRunner().invoke(cli, ["info", str(tmp_path / "ds")])
    assert f"classes   12: {', '.join(names)}\n" in info.output  # was cut after 8, with "…"
    as_json = json.loads(CliRunner().invoke(cli, ["info", str(tmp_path / "ds"), "--json"]).output)
    assert as_json["classes"] == names and as_json["categories"] is None


def test_a_bar_of_bytes_counts_in_binary_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the summary does (``bytes 2.7 MiB``); tqdm alone writes 2.83MB for the same bytes."""
    monkeypatch.setattr(progress_module.sys, "stderr", io.StringIO())
    bar = progress_module.Bar(True, desc="packing", total=3 * 2**20, unit="B")
    bar.update(3 * 2**19)
    drawn = str(bar._bar)
    bar.close()
    assert "1.5 MiB/3.0 MiB" in drawn and "MB" not in drawn
