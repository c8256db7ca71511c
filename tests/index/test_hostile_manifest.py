"""A hostile ``index.json`` (nested deeper than the parser goes, numbers of thousands of digits,
a file of any size) is refused with one line naming it, by ``info``, ``verify`` and the loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit import ShardLoader
from shardkit.cli import cli
from shardkit.errors import ManifestError
from shardkit.index import Manifest, ShardEntry, manifest_io, read_manifest
from shardkit.storage import Store

GOOD = Manifest(kind="imagefolder", shards=(ShardEntry("s-000000.tar", 2, 10240, "a" * 64),), classes=("a", "b"))


def _with(text: str) -> bytes:
    """The good manifest with its ``"num_samples": 2`` replaced by ``text``."""
    data = GOOD.to_json()
    assert data.count(b'"num_samples": 2') == 2
    return data.replace(b'"num_samples": 2', text.encode(), 1)


@pytest.mark.parametrize(("data", "message"), [
    (_with('"info": ' + "[" * 100_000 + "]" * 100_000 + ', "num_samples": 2'), "not valid JSON .nested too deeply"),
    (_with('"num_samples": ' + "9" * 5000), "not valid JSON .Exceeds the limit"),
    (_with('"num_samples": ' + "9" * 4000), "'num_samples' is too large .13288 bits"),
    (GOOD.to_json().replace(b'"num_bytes": 10240', b'"num_bytes": 9223372036854775808'),
     "'shards\\[0\\].num_bytes' is too large"),
], ids=["deep", "5000-digits", "4000-digits", "2**63-bytes"])
def test_hostile_manifests_are_one_line(tmp_path: Path, data: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(data, where="x/index.json")
    (tmp_path / "index.json").write_bytes(data)
    for command in (["info", str(tmp_path)], ["verify", str(tmp_path)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 1 and result.output.startswith("error: "), result.output
        assert len(result.output.strip().splitlines()) == 1 and "index.json" in result.output, result.output
    with pytest.raises(ManifestError, match=message):
        ShardLoader(str(tmp_path), batch_size=1, num_workers=0)


def test_a_manifest_over_the_size_cap_is_refused_unparsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "index.json").write_bytes(GOOD.to_json())
    assert read_manifest(Store(str(tmp_path))) == GOOD
    monkeypatch.setattr(manifest_io, "MAX_MANIFEST_BYTES", 300)
    (tmp_path / "index.json").write_bytes(GOOD.to_json() + b" " * 10_000)
    with pytest.raises(ManifestError, match="index.json: is larger than 300 bytes, the most a manifest may have"):
        read_manifest(Store(str(tmp_path)))
    assert json.loads((tmp_path / "index.json").read_bytes())  # the file itself is valid JSON
