"""The captioned bench: plain webdataset (decode("pil").to_tuple("jpg", "txt"), the same crop and
tokenizer) against ShardLoader with text_transform, on the same packed pairs, from the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from shardkit.bench import baselines, runner
from shardkit.cli import cli
from shardkit.pack import PackOptions, pack_captions
from shardkit.transforms import ByteTokenizer
from tests.trees import make_caption_folder


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("caption-bench")
    captions = make_caption_folder(root / "src", classes=4, per_class=2)
    pack_captions(str(root / "src"), str(root / "ds"), options=PackOptions(max_count=4), workers=1)
    return root / "src", root / "ds", captions


def test_both_loaders_give_the_same_pairs(pairs: tuple[Path, Path, dict[str, str]]) -> None:
    """Every caption once per epoch from either loader, tokenized alike, beside a uint8 crop."""
    _, ds, captions = pairs
    tokenize = ByteTokenizer(48)  # longer than every caption: a row names its caption
    expected = sorted(map(tuple, tokenize(list(captions.values())).tolist()))
    common: dict[str, Any] = {"size": 24, "train": False, "batch_size": 4, "workers": 0, "context_length": 48}
    shard_paths = sorted(str(p) for p in ds.glob("*.tar"))
    for loader in (baselines.webdataset_caption_loader(shard_paths, **common),
                   runner.caption_shardloader(str(ds), **common)):
        rows: list[tuple[int, ...]] = []
        for images, tokens in loader:
            assert images.dtype == torch.uint8 and images.shape == (4, 3, 24, 24) and tokens.shape == (4, 48)
            rows += map(tuple, tokens.tolist())
        assert sorted(rows) == expected


def test_cli_times_webdataset_against_shardloader(pairs: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    src, ds, _ = pairs
    result = CliRunner().invoke(cli, ["bench", str(src), "--captions", "--shards", str(ds), "--workers", "0",
                                      "--batch-size", "4", "--size", "24", "--epochs", "1", "--repeats", "1",
                                      "--warmup", "0", "--context-length", "8", "-q", "--out",
                                      str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {r["name"]: r for r in report["results"]}
    assert set(rows) == {"webdataset", "shardloader"} and report["baseline"] == "webdataset"
    timed = [(r["images_per_run"], r["batch_shape"]) for r in rows.values()]
    assert timed == [(4, [4, 3, 24, 24])] * 2  # of 2 batches, the first is not timed
    assert f"data: {report['conditions']['data']['images']} captioned images, mean" in result.output  # not "0 classes"
    refused = CliRunner().invoke(cli, ["bench", str(src), "--captions", "--no-webdataset"])
    assert refused.exit_code == 2 and "leave out --no-webdataset" in refused.output



def test_what_the_source_scan_says_is_said_once(pairs: tuple[Path, Path, dict[str, str]], tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The bench's look at the source and its pack of it each said the captions with no image."""
    import shutil

    src, _, _ = pairs
    folder = tmp_path / "src"
    shutil.copytree(src, folder)
    sub = next(p for p in folder.iterdir() if p.is_dir())
    (sub / "gone.txt").write_text("an image that is gone")
    (sub / "gone.json").write_text("{}")
    with caplog.at_level("WARNING", logger="shardkit.pack.sources"):
        result = CliRunner().invoke(cli, ["bench", str(folder), "--captions", "--workers", "0", "--batch-size", "4",
                                          "--size", "24", "--epochs", "1", "--repeats", "1", "--warmup", "0", "-q"])
    assert result.exit_code == 0, result.output
    assert sum("with no image beside it" in r.getMessage() for r in caplog.records) == 1, caplog.text
