"""The pack tests' shared data: a tree of many small images, its reference pack, and the clean-up
of the semaphore names a killed pack leaves."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator

import pytest
from PIL import Image

from shardkit.pack import PackOptions, pack
from tests.pack.resume_checks import MAX_COUNT
from tests.pack.semaphores import PackSemaphores


@pytest.fixture(scope="module")
def many_images(tmp_path_factory):
    """300 small, distinct JPEGs in 5 classes; 3 of them are not images (skipped entries, whose
    order in index.json a resume must keep)."""
    root = tmp_path_factory.mktemp("many") / "src"
    rng = random.Random(0)
    for c in range(5):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(60):
            out = io.BytesIO()
            color = (rng.randrange(256), rng.randrange(256), c * 50)
            Image.new("RGB", (48, 40), color).save(out, "JPEG")
            (root / f"c{c}" / f"{j:03d}.jpg").write_bytes(out.getvalue())
    for rel in ("c0/007.jpg", "c2/031.jpg", "c4/059.jpg"):
        (root / rel).write_bytes(b"not an image, " * 4)
    return root


@pytest.fixture(scope="module")
def reference(many_images, tmp_path_factory):
    dst = tmp_path_factory.mktemp("ref") / "out"
    pack(str(many_images), str(dst), options=PackOptions(max_count=MAX_COUNT), workers=1)
    return {p.name: p.read_bytes() for p in dst.iterdir()}


@pytest.fixture
def pack_semaphores() -> Iterator[PackSemaphores]:
    """What the test's packs leave in /dev/shm is removed after it, whatever happened."""
    own = PackSemaphores()
    yield own
    own.remove()
