"""``verify`` checks a shard's DALI index against the tar: DALI reads a member at the offset and
size its index gives, so a damaged or hand-edited index would make it fail or swap images."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.index import verify_dataset
from shardkit.pack import PackOptions, pack


def _flip_offset(lines: list[str]) -> None:
    parts = lines[1].split()
    parts[1] = str(int(parts[1]) + 512)
    lines[1] = " ".join(parts)


def _swap_samples(lines: list[str]) -> None:
    lines[1], lines[2] = lines[2], lines[1]


def _swap_images(lines: list[str]) -> None:
    """Hand edit: sample 1's image entry points at sample 2's bytes."""
    one, two = lines[1].split(), lines[2].split()
    i, j = one.index("jpg"), two.index("jpg")
    one[i + 1:i + 3] = two[j + 1:j + 3]
    lines[1] = " ".join(one)


def _drop_last(lines: list[str]) -> None:
    del lines[-1]
    lines[0] = f"v1.2 {len(lines) - 1}"


def _garbage_header(lines: list[str]) -> None:
    lines[0] = "v9 x"


@pytest.mark.parametrize(("damage", "message"), [
    (_flip_offset, "line 2 says"),
    (_swap_samples, "line 2 says"),
    (_swap_images, "line 2 says .* .DALI would read the wrong bytes."),
    (_drop_last, "lists 4 samples, the shard has 5"),
    (_garbage_header, "not a DALI webdataset index"),
], ids=["offset", "swapped-lines", "swapped-images", "dropped-line", "header"])
def test_a_damaged_dali_index_fails_verify(small_tree: Path, tmp_path: Path,
                                           damage: Callable[[list[str]], None], message: str) -> None:
    out = tmp_path / "out"
    pack(str(small_tree), str(out), options=PackOptions(max_count=5, dali_index=True, uniform_names=True), workers=1)
    assert verify_dataset(str(out)).ok
    idx = sorted(out.glob("*.dali.idx"))[0]
    lines = idx.read_text().splitlines()
    damage(lines)
    idx.write_text("\n".join(lines) + "\n")
    report = verify_dataset(str(out))
    assert len(report.problems) == 1 and report.problems[0].startswith(str(idx)), report.problems
    assert re.search(message, report.problems[0]), report.problems[0]
    result = CliRunner().invoke(cli, ["verify", "--decode", str(out)])
    assert result.exit_code == 1 and idx.name in result.output
