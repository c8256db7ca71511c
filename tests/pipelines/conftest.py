from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardkit.pack import PackOptions, pack

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "imagefolder"


@pytest.fixture(scope="session")
def packed_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("sample") / "ds"
    pack(str(SAMPLE), str(dst), options=PackOptions(max_count=64), workers=1)
    return dst


def refused(main: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run a recipe's ``main(argv)`` that must refuse: exit 2 and one error line, no traceback;
    that line (what was printed before the call is dropped)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err
