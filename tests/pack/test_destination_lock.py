"""Two packs into one destination cannot interleave: the second is refused at once, naming the
pack that holds the destination, and the first publishes a dataset that verifies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.errors import PackError
from shardkit.index import verify_dataset
from shardkit.pack import lock, pack
from shardkit.pack.lock import destination_lock, lock_path
from shardkit.storage import Store


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_second_pack_into_a_locked_destination_is_refused_naming_the_holder(small_tree: Path, tmp_path: Path,
                                                                               overwrite: bool) -> None:
    dst = tmp_path / "out"
    pack(str(small_tree), str(dst), workers=1)
    with destination_lock(Store(str(dst))):
        with pytest.raises(PackError, match=f"out: another pack is writing here .pid {os.getpid()} on "):
            pack(str(small_tree), str(dst), workers=1, overwrite=overwrite)
        args = ["pack", str(small_tree), str(dst), "--workers", "1"] + (["--overwrite"] if overwrite else [])
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1 and result.output.startswith("error: ") and "another pack" in result.output
    assert verify_dataset(str(dst)).ok  # the refused packs touched nothing
    assert not Path(lock_path(Store(str(dst))) or "").exists()  # the lock file goes with its holder


def test_a_lock_left_by_a_killed_pack_does_not_block_the_next(small_tree: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    path = lock_path(Store(str(dst)))
    assert path is not None and os.path.dirname(path) == str(tmp_path)
    code = (f"import os; from shardkit.storage.locks import locked\n"
            f"with locked({path!r}, holder='pid x'):\n    os._exit(9)")  # dies holding it, as kill -9 would
    subprocess.run([sys.executable, "-c", code], check=False, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert Path(path).exists()
    pack(str(small_tree), str(dst), workers=1)
    assert verify_dataset(str(dst)).ok



def test_a_destination_whose_parent_cannot_be_written_is_locked_in_the_users_cache(
        small_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "a-file").write_text("")  # nothing can be created below it, as under a read-only mount
    monkeypatch.setattr(lock, "lock_path", lambda store: str(tmp_path / "a-file" / ".out.shardkit-lock"))
    dst = tmp_path / "out"
    with destination_lock(Store(str(dst))):
        assert len(list((tmp_path / "xdg" / "shardkit" / "locks").glob("*.lock"))) == 1
        with pytest.raises(PackError, match="another pack is writing here"):
            pack(str(small_tree), str(dst), workers=1)
    pack(str(small_tree), str(dst), workers=1)
    assert verify_dataset(str(dst)).ok
