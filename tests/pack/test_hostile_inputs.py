"""Inputs that are not image files, or are far too large, are skipped with a reason: never read
forever (FIFO), never read until memory runs out (``/dev/zero``, a huge sparse file). Each case
runs ``shardkit pack`` as a person would, on a pty with a timeout, so a regression fails instead
of hanging the test suite."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli.terminal import run_in_pty, shardkit_argv


def _pack(src: Path, dst: Path) -> tuple[list[str], dict[str, str]]:
    seen = run_in_pty(shardkit_argv("pack", str(src), str(dst), "-q", "--workers", "2"), timeout=90)
    assert seen.returncode == 0, seen.text
    doc = json.loads((dst / "index.json").read_text())
    # small_tree mixes JPEG and PNG on purpose: pack's warning about that is expected, nothing else
    screen = [line for line in seen.lines if line.strip() and "--uniform-names" not in line]
    return screen, {s["source"]: s["reason"] for s in doc["skipped"]}


def test_a_fifo_is_skipped_not_waited_on(small_tree: Path, tmp_path: Path) -> None:
    os.mkfifo(small_tree / "class0" / "pipe.jpg")
    try:
        screen, skipped = _pack(small_tree, tmp_path / "dst")
    finally:
        # Without the fix a writer process is still blocked opening the FIFO: open its other end
        # so that it returns and exits.
        with contextlib.suppress(OSError):
            os.close(os.open(small_tree / "class0" / "pipe.jpg", os.O_WRONLY | os.O_NONBLOCK))
        os.unlink(small_tree / "class0" / "pipe.jpg")
    assert skipped == {"class0/pipe.jpg": "not a regular file (a FIFO)"}
    assert screen == []


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_link_to_a_device_is_skipped_unread(small_tree: Path, tmp_path: Path, device: str) -> None:
    src = tmp_path / "in"
    shutil.copytree(small_tree, src)
    os.symlink(device, src / "class1" / "endless.png")
    screen, skipped = _pack(src, tmp_path / "dst")
    assert skipped == {"class1/endless.png": "not a regular file (a character device)"}
    assert screen == []


def test_a_huge_sparse_file_is_skipped_unread(small_tree: Path, tmp_path: Path) -> None:
    src = tmp_path / "in"
    shutil.copytree(small_tree, src)
    huge = src / "class2" / "huge.jpg"
    with open(huge, "wb") as f:
        f.truncate(6 << 30)  # sparse: takes no disk space, reads back as 6 GiB of zeros
    screen, skipped = _pack(src, tmp_path / "dst")
    assert skipped == {"class2/huge.jpg": (
        f"file too large ({6 << 30} bytes; at most 536870912 are packed)")}
    assert screen == []


def test_pil_warnings_about_damaged_metadata_stay_off_the_terminal(small_tree: Path, tmp_path: Path) -> None:
    from PIL import Image

    src = tmp_path / "in"
    shutil.copytree(small_tree, src)
    # An EXIF block whose XResolution tag points past its end: PIL warns "Corrupt EXIF data"
    # while the pixels are fine.
    exif = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x05\x01\x1a\x00\x05\x00\x00\x00\x09\x00\x00\x00\x00"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(src / "class0" / "exif.jpg", "JPEG", exif=exif)
    screen, skipped = _pack(src, tmp_path / "dst")
    assert skipped == {}
    assert screen == []
