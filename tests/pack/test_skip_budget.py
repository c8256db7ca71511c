"""A pack that skips too much fails loudly, before publishing, and leaves complete shards intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.errors import SourceError
from shardkit.pack import PackOptions, SkipBudget, SkipBudgetError, pack, pack_coco
from tests.conftest import encode_image, write_tree

ORDERED = PackOptions(max_count=4, shuffle=False)


def _tree(root: Path, good: int, bad: dict[str, bytes]) -> Path:
    files = {f"a/img{j:02d}.jpg": encode_image((10 + j, 8)) for j in range(good)}
    write_tree(root, {**files, **bad})
    return root


def _files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.is_file()}


def test_parse() -> None:
    assert SkipBudget.parse("0").allowed(10**6) == 0
    assert SkipBudget.parse("12").allowed(5) == 12
    assert SkipBudget.parse("10%").allowed(14) == 1 and SkipBudget.parse("0.5%").allowed(1000) == 5
    assert str(SkipBudget.parse("2.5%")) == "2.5%"
    for text in ("", "x", "-1", "1.5", "101%", "5 files"):
        with pytest.raises(ValueError):
            SkipBudget.parse(text)


def test_a_pack_of_no_sample_fails_and_publishes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a/x.jpg": b"", "a/y.jpg": b"not an image", "b/z.png": b""})
    with pytest.raises(SkipBudgetError,
                       match=r"packed no sample: all 3 inputs were skipped \(2 empty files, "
                                              r"1 not an image\); index.json not written") as err:
        pack(str(src), str(tmp_path / "out"), workers=1)
    assert [s["source"] for s in err.value.skipped] == ["a/x.jpg", "a/y.jpg", "b/z.png"]
    assert not (tmp_path / "out").exists()  # the directory it made, removed: no pack state worth resuming
    (tmp_path / "kept").mkdir()
    with pytest.raises(SkipBudgetError, match="packed no sample"):
        pack(str(src), str(tmp_path / "kept"), workers=1)
    assert list((tmp_path / "kept").iterdir()) == []  # a directory that was there stays, empty
    write_tree(src, {"a/x.jpg": encode_image(), "a/y.jpg": encode_image(color=(1, 2, 3)),
                     "b/z.png": encode_image(fmt="PNG")})
    fixed = pack(str(src), str(tmp_path / "out"), workers=1)  # the corrected input, no --overwrite
    assert fixed.manifest.num_samples == 3
    (src / "a" / "x.jpg").write_bytes(b"")  # as it was, for the CLI below
    (src / "a" / "y.jpg").write_bytes(b"not an image")
    (src / "b" / "z.png").write_bytes(b"")

    runner = CliRunner()
    result = runner.invoke(cli, ["pack", str(src), str(tmp_path / "cli"), "--workers", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "skipped   3: 2 empty files, 1 not an image" in result.output
    assert "  - a/y.jpg: not an image (no image format recognised)" in result.output
    assert result.output.splitlines()[-1].startswith(f"error: {tmp_path / 'cli'}: packed no sample")
    assert not (tmp_path / "cli").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_budget_stops_early_keeps_complete_shards_and_a_rerun_resumes(tmp_path: Path,
                                                                      workers: int) -> None:
    # 12 good inputs sorted after the bad one: shards of 4, the first holds the empty file.
    src = _tree(tmp_path / "src", 12, {"a/img00-empty.jpg": b""})
    dst = tmp_path / "out"
    with pytest.raises(SkipBudgetError,
                       match=r"1 of 13 inputs skipped so far, more than --max-skipped 0 "
                                              r"allows \(1 empty file\)"):
        pack(str(src), str(dst), options=ORDERED, workers=workers, max_skipped=SkipBudget(count=0))
    assert not (dst / "index.json").exists()
    written = _files(dst)
    tars = sorted(n for n in written if n.endswith(".tar"))
    if workers == 1:
        assert tars == ["shard-000000.tar"]  # stopped right after it
    else:  # shards already handed to a worker finish; the rest are cancelled
        assert "shard-000000.tar" in tars

    # The budget is policy, not output: a re-run with another budget resumes and reuses the shard.
    result = pack(str(src), str(dst), options=ORDERED, workers=1,
                  max_skipped=SkipBudget.parse("10%"))
    assert result.reused_shards == len(tars) and result.manifest.num_samples == 12
    # its rate counts what this run packed, not the samples of the shards it kept
    assert result.reused_samples == sum(s.num_samples for s in result.manifest.shards if s.url in tars)
    assert result.images_per_second == pytest.approx((12 - result.reused_samples) / result.seconds)
    reference = tmp_path / "reference"
    pack(str(src), str(reference), options=ORDERED, workers=2)
    assert _files(dst) == _files(reference)
    final = _files(dst)
    # kept shards were not rewritten or corrupted
    assert all(final[name] == written[name] for name in tars)


def test_budget_in_percent_through_the_cli(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", 18, {"a/bad1.jpg": b"", "a/bad2.jpg": b"junk"})
    runner = CliRunner()
    args = ["pack", str(src), "--workers", "1", "--max-count", "4"]
    failed = runner.invoke(cli, [*args[:2], str(tmp_path / "o1"), *args[2:], "--max-skipped", "5%"])
    assert failed.exit_code == 1, failed.output
    assert "more than --max-skipped 5% allows (1 empty file, 1 not an image)" in failed.output
    assert not (tmp_path / "o1" / "index.json").exists()
    ok = runner.invoke(cli, [*args[:2], str(tmp_path / "o2"), *args[2:], "--max-skipped", "10%"])
    assert ok.exit_code == 0, ok.output
    assert "skipped   2: 1 empty file, 1 not an image" in ok.output
    assert json.loads((tmp_path / "o2" / "index.json").read_text())["num_samples"] == 18
    bad = runner.invoke(cli, [*args[:2], str(tmp_path / "o3"), *args[2:], "--max-skipped", "lots"])
    assert bad.exit_code == 2 and "invalid skip budget 'lots'" in bad.output


def test_coco_with_nothing_to_pack_touches_nothing(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    write_tree(tmp_path / "img", {"a.jpg": encode_image()})
    ann = tmp_path / "i.json"
    ann.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [],
                               "categories": []}))
    with pytest.raises(SourceError, match="nothing to pack: the source lists no sample; --drop-empty left out all 1 "
                                          "images, none has an annotation"):
        pack_coco(str(tmp_path / "img"), str(ann), str(tmp_path / "out"), drop_empty=True)
    assert not (tmp_path / "out").exists()


def test_a_captioned_pack_of_a_tree_without_captions_says_why_nothing_is_packed(tmp_path: Path) -> None:
    """A plain ImageFolder tree packed as captions: every image lacks its .txt, and the error
    says so (with the first image), not only that nothing is packable."""
    write_tree(tmp_path / "src", {"cat/a.jpg": encode_image(), "cat/b.jpg": encode_image()})
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--format", "captions"])
    assert result.exit_code == 1
    assert ("nothing to pack: the source lists no sample (2 image record(s) not packable; the first, cat/a.jpg: "
            "no caption (cat/a.txt does not exist))") in result.output
    assert not (tmp_path / "out").exists()
    (tmp_path / "src" / "cat" / "a.txt").write_text("a cat")
    (tmp_path / "src" / "cat" / "a.json").write_text("{oops")  # the first image, skipped for another reason
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--format", "captions"])
    assert result.exit_code == 1
    assert "(2 image record(s) not packable; the first, cat/a.jpg: sidecar .json is not valid JSON" in result.output



def test_the_first_skipped_input_is_first_by_path_and_by_row_number() -> None:
    from shardkit.pack.api import _natural

    rows = [{"source": f"row {n}"} for n in (10, 2, 33)]
    assert min(rows, key=_natural)["source"] == "row 2"  # a table's rows by number, not as text
    paths = [{"source": p} for p in ("b/000010.jpg", "a/000002.jpg", "a/000001.png")]
    assert min(paths, key=_natural)["source"] == "a/000001.png"


def test_reasons_of_table_rows_are_grouped_by_kind_not_by_row() -> None:
    from shardkit.pack.skips import describe_reasons

    skipped = [{"source": "a.jpg", "reason": f"row {n}: no caption (the caption column is null)"} for n in range(250)]
    skipped += [{"source": "b.jpg", "reason": "row 7: unreadable file (No such file or directory)"}]
    assert describe_reasons(skipped) == "250 no caption, 1 unreadable file"  # was one "1 row N: …" per row
