"""Feeder processes for captioned datasets on the CPU: a text transform that returns one tensor of
a fixed shape per batch (token ids) travels through the feeders' slots, giving the batches of the
loader without feeders tensor by tensor and resuming exactly; ``feeders="auto"`` runs them on the
GPU route (stood in for by the CPU route) and quietly none where they cannot carry the text; a
number of feeders is refused in one line naming why; a transform whose output changes shape or
dtype mid-epoch is named. The CUDA hand-off is tested in ``tests/loader/routes/test_gpu_cuda.py``."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from sample_data.generate import make_indexed_imagefolder
from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader import arguments
from shardkit.loader.feed.labels import SlotLabels
from shardkit.loader.routes.cpu import CpuRoute
from shardkit.pack import PackOptions, pack_captions, pack_coco
from tests.loader.coco_helpers import SAMPLE
from tests.trees import add_captions

pytestmark = pytest.mark.timeout(240)

T = transforms.imagenet_train(16)
Batches = list[tuple[torch.Tensor, torch.Tensor, list[str]]]


@pytest.fixture(scope="module")
def captioned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """24 indexed images (3 classes x 8) with captions, in shards of <= 5; and the captions by index."""
    root = tmp_path_factory.mktemp("captioned_feeders")
    make_indexed_imagefolder(root / "src", classes=3, per_class=8, size=(24, 20))
    captions = list(add_captions(root / "src").values())
    pack_captions(str(root / "src"), str(root / "ds"), options=PackOptions(max_count=5, seed=1), workers=1)
    return root / "ds", captions


class Pairs:
    """Each caption's first and last 6 characters' code points, as int32 ``[B, 2, 6]``."""

    def __call__(self, texts: list[str]) -> torch.Tensor:
        return torch.tensor([[[ord(c) for c in t[:6].ljust(6)], [ord(c) for c in t[-6:].rjust(6)]] for t in texts],
                            dtype=torch.int32)


class ToDict:
    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return {"ids": transforms.ByteTokenizer(8)(texts)}


class ToList:
    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode()) for t in texts]


class PadToLongest:
    def __call__(self, texts: list[str]) -> torch.Tensor:
        return transforms.ByteTokenizer(max(len(t.encode()) for t in texts))(texts)


class Transposed:
    def __call__(self, texts: list[str]) -> torch.Tensor:
        return transforms.ByteTokenizer(8)(texts).T


class Broken:
    def __call__(self, texts: list[str]) -> torch.Tensor:
        raise ValueError("no vocabulary loaded")


class Flaky:
    """Token ids of 8 bytes, except for a batch holding sample 13's caption: int32 (``"dtype"``) or 9 bytes."""

    def __init__(self, change: str) -> None:
        self.change = change

    def __call__(self, texts: list[str]) -> torch.Tensor:
        odd = any("number 13" in t for t in texts)
        ids = transforms.ByteTokenizer(9 if odd and self.change == "shape" else 8)(texts)
        return ids.int() if odd and self.change == "dtype" else ids


def _loader(ds: Path, **kw: Any) -> ShardLoader:
    args: dict[str, Any] = {"batch_size": 5, "transform": T, "keys": True, "seed": 5, "num_workers": 2,
                            "text_transform": transforms.ByteTokenizer(12)} | kw
    return ShardLoader(str(ds), **args)


def _epochs(loader: ShardLoader, epochs: int = 2) -> Batches:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out += [(x, y, k) for x, y, k in loader]
    return out


def _same(a: Batches, b: Batches) -> None:
    assert [k for _, _, k in a] == [k for _, _, k in b]
    for (x1, y1, _), (x2, y2, _) in zip(a, b, strict=True):
        assert torch.equal(x1, x2) and y1.dtype == y2.dtype and torch.equal(y1, y2)


@pytest.mark.parametrize(("feeders", "workers", "tokenizer"),
                         [(1, 1, transforms.ByteTokenizer(12)), (2, 3, Pairs())], ids=["bytes", "int32-pairs"])
def test_feeders_deliver_the_captioned_batches_of_the_loader_without_them(
        captioned: tuple[Path, list[str]], feeders: int, workers: int, tokenizer: Any) -> None:
    """Two epochs, the last batch of each short (24 pairs in batches of 5): same keys, images and token ids."""
    ds, captions = captioned
    with _loader(ds, num_workers=workers, feeders=0, text_transform=tokenizer) as plain:
        want = _epochs(plain)
    with _loader(ds, num_workers=workers, feeders=feeders, text_transform=tokenizer) as fed:
        assert fed.feeders == feeders
        got = _epochs(fed)
    _same(want, got)
    assert len(got) == 10 and [len(k) for _, _, k in got[:5]] == [5, 5, 5, 5, 4]
    for _, ids, keys in got:
        assert torch.equal(ids, tokenizer([captions[int(k)] for k in keys]))


def test_captioned_feeders_resume_mid_epoch_with_the_same_rest(captioned: tuple[Path, list[str]]) -> None:
    ds, _ = captioned
    with _loader(ds, feeders=0) as plain:
        plain.set_epoch(1)
        want = list(plain)
    with _loader(ds, feeders=2) as fed:
        fed.set_epoch(1)
        it = iter(fed)
        head = [next(it) for _ in range(2)]
        state = fed.state_dict()
        del it
    with _loader(ds, num_workers=3, feeders=1) as again:  # another worker and feeder count
        again.load_state_dict(state)
        assert again.remaining == 3
        rest = list(again)
    _same(want, head + rest)


def test_auto_runs_feeders_for_token_ids_on_the_gpu_route(captioned: tuple[Path, list[str]],
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """``feeders="auto"`` decides on the GPU route (the CPU route stands in for it here): feeders
    for token ids, and quietly none for text they cannot carry (an info record says why)."""
    ds, _ = captioned
    with _loader(ds, feeders=0) as plain:
        want = _epochs(plain, epochs=1)
    monkeypatch.setattr(arguments, "GpuRoute", CpuRoute)
    with caplog.at_level(logging.INFO, logger="shardkit.loader"):
        with _loader(ds) as fed:
            assert fed.feeders == 1 and fed._supply.pool is not None
            _same(want, _epochs(fed, epochs=1))
        cases: list[tuple[dict[str, Any], str]] = [
            ({"text_transform": None}, "needs a text_transform"), ({"fields": ["url"]}, "with fields= (url)"),
            ({"text_transform": ToDict()}, "returned a dict, not one tensor"),
            ({"text_transform": PadToLongest()}, "output changes with the captions")]
        for kwargs, why in cases:
            caplog.clear()
            with _loader(ds, **kwargs) as loader:
                assert loader.feeders == 0 and loader._supply.pool is None
                assert len(list(loader)) == 5
            assert [r.levelno for r in caplog.records] == [logging.INFO], caplog.text
            assert "feeders='auto' runs none" in caplog.text and why in caplog.text


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"text_transform": None}, "a captioned dataset needs a text_transform that returns one .*not the captions as "
                               "strings; use feeders=0"),
    ({"fields": ["url", "similarity"]}, r"with fields= \(url, similarity\) a batch's text is a dict; use feeders=0"),
    ({"text_transform": ToDict()}, "text_transform returned a dict, not one tensor"),
    ({"text_transform": ToList()}, "text_transform returned a list, not one tensor"),
    ({"text_transform": PadToLongest()}, r"output changes with the captions \(torch.int64 \(1, 7\) for 1 short "
                                         r"caption, torch.int64 \(2, 127\) for 2 of different lengths\)"),
    ({"text_transform": Transposed()}, r"returned torch.int64 \(8, 1\) for 1 caption\(s\): feeders need one row per"),
    ({"text_transform": Broken()}, r"text_transform failed on 1 made-up caption\(s\) \(ValueError: no vocabulary"),
    ({"transform": lambda image: image}, "feeders need an ImageFolder or captioned dataset and an ImageTransform"),
])
def test_feeders_asked_for_are_refused_in_one_line_naming_why(captioned: tuple[Path, list[str]],
                                                              kwargs: dict[str, Any], message: str) -> None:
    ds, _ = captioned
    with pytest.raises(LoaderError, match=message) as err:
        _loader(ds, feeders=1, **kwargs)
    assert "\n" not in str(err.value)


def test_feeders_asked_for_on_coco_are_refused(tmp_path: Path) -> None:
    pack_coco(str(SAMPLE / "images"), str(SAMPLE / "instances.json"), str(tmp_path / "coco"),
              options=PackOptions(max_count=6), workers=1)
    with pytest.raises(LoaderError, match="feeders need an ImageFolder or captioned dataset .*this dataset is "
                                          "'coco'; use feeders=0") as err:
        ShardLoader(str(tmp_path / "coco"), batch_size=2, num_workers=1, feeders=1)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("change", "got"), [("dtype", r"torch.int32 \((\d), 8\)"),
                                             ("shape", r"torch.int64 \((\d), 9\)")])
def test_a_text_transform_whose_output_changes_mid_epoch_is_named(captioned: tuple[Path, list[str]],
                                                                  change: str, got: str) -> None:
    ds, _ = captioned
    loader = _loader(ds, feeders=2, shuffle=False, text_transform=Flaky(change))
    assert loader._slot_labels == SlotLabels((8,), torch.int64, text=True)
    with pytest.raises(LoaderError, match=rf"^text_transform returned {got} for a batch of \1 captions; the "
                                          r"feeders' slots hold torch.int64 \(\1, 8\)") as err:
        list(loader)
    assert "\n" not in str(err.value) and "use feeders=0" in str(err.value)
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 30
    with _loader(ds, feeders=0, shuffle=False, text_transform=Flaky(change)) as plain:
        assert len(list(plain)) == 5  # without feeders each batch's text is what the transform returned
