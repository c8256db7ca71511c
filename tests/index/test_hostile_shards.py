"""Hostile shards (headers, labels, json and files that are not files) give one line naming the
shard and sample, in ``shardkit index``, ``shardkit verify`` and the loader: never a traceback,
a runaway allocation or a hang."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.reliability.hostile import hostile_shard
from shardkit.cli import cli
from shardkit.errors import FormatError
from shardkit.format.tarread import iter_samples, parse_span
from shardkit.index import verify_dataset
from shardkit.index.adopt import adopt_shards
from shardkit.loader.read.bad_samples import BadSample
from shardkit.loader.read.samples import Sample

DEEP_JSON = b"[" * 100_000 + b"]" * 100_000


def _tar(path: Path, *, cls: bytes = b"1", json: bytes | None = None,
         pax: dict[str, str] | None = None) -> Path:
    """One shard of two samples; the second carries the hostile parts."""
    return hostile_shard(path, cls=cls, meta=json, pax=pax)


def _index(root: Path) -> str:
    result = CliRunner().invoke(cli, ["index", str(root)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    return result.output


@pytest.mark.parametrize("size", ["\u00b2", "9" * 5000], ids=["superscript", "5000-digits"])
def test_pax_size_that_is_no_ascii_number_is_one_line_everywhere(tmp_path: Path, size: str) -> None:
    shard = _tar(tmp_path / "x-000000.tar", pax={"size": size})
    output = _index(tmp_path)
    assert output.startswith("error: ") and "x-000000.tar: byte" in output and "malformed PAX size" in output
    with pytest.raises(FormatError, match="malformed PAX size"), shard.open("rb") as f:
        list(iter_samples(f, where=str(shard)))
    data = shard.read_bytes()
    span = data[data.index(b"b.cls\0"):]  # sample b: from its cls member's header on
    with pytest.raises(FormatError, match="malformed PAX size"):
        parse_span(span, where="x-000000.tar:b")  # the loader's read: a FormatError is a bad sample


def test_verify_reports_a_hostile_header_in_a_published_shard(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "x-000000.tar")
    adopt_shards(str(tmp_path))
    _tar(shard, pax={"size": "9" * 5000})
    report = verify_dataset(str(tmp_path))
    assert not report.ok and "malformed PAX size" in report.problems[0]


@pytest.mark.parametrize(("cls", "json", "message"), [
    (b"9" * 5000, None, "x-000000.tar:b: 'cls' member has 5000 digits"),
    (b"100000000", None, "x-000000.tar:b: label 100000000 is too large"),
    (b"1", DEEP_JSON, "x-000000.tar:b: 'json' member is not valid JSON (nested more than"),
], ids=["5000-digit-cls", "huge-cls", "deep-json"])
def test_index_refuses_hostile_labels_and_json_naming_the_sample(tmp_path: Path, cls: bytes, json: bytes | None,
                                                                  message: str) -> None:
    _tar(tmp_path / "x-000000.tar", cls=cls, json=json)
    assert message in _index(tmp_path)
    assert not (tmp_path / "index.json").exists()


def test_verify_and_loader_report_hostile_labels_and_json(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "x-000000.tar")
    adopt_shards(str(tmp_path))
    _tar(shard, cls=b"9" * 5000, json=DEEP_JSON)
    problems = verify_dataset(str(tmp_path)).problems
    assert any("x-000000.tar:b: missing or malformed cls/json member" in p for p in problems), problems
    with pytest.raises(BadSample, match="s.tar:b: cls member malformed .has 5000 digits"):
        Sample("b", {"cls": b"9" * 5000}, "s.tar:b").label(10)


def _fifo_dataset(tmp_path: Path) -> Path:
    shard = _tar(tmp_path / "x-000000.tar")
    adopt_shards(str(tmp_path))
    shard.unlink()
    os.mkfifo(shard)
    return shard


def _in_time(work: object, seconds: float = 5.0) -> object:
    """Run ``work()`` in a thread; fail (not hang) when it has not returned in ``seconds``."""
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(_capture(work)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, "still blocked after 5 s (opened a FIFO?)"
    return box[0]


def _capture(work: object) -> object:
    try:
        return work()  # type: ignore[operator]
    except Exception as err:
        return err


def test_index_refuses_a_fifo_or_device_shard_without_opening_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "x-000000.tar")
    result = _in_time(lambda: CliRunner().invoke(cli, ["index", str(tmp_path)]))
    assert result.exit_code == 1 and "x-000000.tar: not a regular file (a FIFO)" in result.output  # type: ignore[attr-defined]
    (tmp_path / "x-000000.tar").unlink()
    (tmp_path / "x-000000.tar").symlink_to("/dev/zero")
    result = _in_time(lambda: CliRunner().invoke(cli, ["index", str(tmp_path)]))
    assert result.exit_code == 1 and "not a regular file (a character device)" in result.output  # type: ignore[attr-defined]


def test_verify_and_loader_refuse_a_shard_replaced_by_a_fifo(tmp_path: Path) -> None:
    from shardkit import ShardLoader
    from shardkit.errors import LoaderError

    _fifo_dataset(tmp_path)
    report = _in_time(lambda: verify_dataset(str(tmp_path)))
    assert "x-000000.tar: not a regular file (a FIFO)" in report.problems[0]  # type: ignore[attr-defined]

    def load() -> object:
        with ShardLoader(str(tmp_path), batch_size=2, num_workers=0, shuffle=False) as loader:
            return next(iter(loader))

    err = _in_time(load)
    assert isinstance(err, LoaderError) and "not a regular file (a FIFO)" in str(err), err


def test_verify_refuses_dev_zero_as_a_shard(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "x-000000.tar")
    adopt_shards(str(tmp_path))
    shard.unlink()
    shard.symlink_to("/dev/zero")
    report = _in_time(lambda: verify_dataset(str(tmp_path)))
    assert "not a regular file (a character device)" in report.problems[0]  # type: ignore[attr-defined]
