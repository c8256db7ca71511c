"""ShardLoader over captioned images: the same images, order, epochs, resume, elastic resume, mixes and
``even_batches=False`` as a labelled dataset of the same files (one tree packed both ways: the
captions' sidecars are not images to ImageFolder), with the captions, extra fields and a batched
text transform run in the workers."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sample_data.generate import decode_index, make_indexed_imagefolder
from shardkit import LoaderError, ShardLoader, transforms
from shardkit.index.adopt import adopt_shards
from shardkit.pack import PackOptions, pack, pack_captions
from tests.trees import add_captions, img2dataset_shards

Run = Callable[[str | list[str]], list[list[str]]]


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One tree of 24 indexed images (3 classes x 8, captioned) packed as ImageFolder and as
    captions, twice each (shards of <= 5 and of <= 4, for mixes)."""
    root = tmp_path_factory.mktemp("captioned")
    make_indexed_imagefolder(root / "src", classes=3, per_class=8, size=(24, 20))
    captions = list(add_captions(root / "src").values())
    out: dict[str, Any] = {"captions": captions}
    for name, max_count in (("a", 5), ("b", 4)):
        options = PackOptions(max_count=max_count, seed=1)
        pack(str(root / "src"), str(root / f"labels-{name}"), options=options, workers=1)
        pack_captions(str(root / "src"), str(root / f"texts-{name}"), options=options, workers=1)
        out[name] = (str(root / f"labels-{name}"), str(root / f"texts-{name}"))
    return out


def _keys(loader: ShardLoader, epoch: int, stop: int | None = None) -> list[list[str]]:
    loader.set_epoch(epoch)
    out = []
    for i, (_, _, keys) in enumerate(loader):
        out.append(list(keys))
        if stop is not None and i + 1 == stop:
            break
    return out


def test_batches_are_the_labelled_images_with_their_captions(both: dict[str, Any]) -> None:
    labelled, captioned = both["a"]
    kwargs: dict[str, Any] = {"batch_size": 4, "transform": transforms.imagenet_train(16), "keys": True, "seed": 5}
    with ShardLoader(labelled, **kwargs) as ref, ShardLoader(captioned, **kwargs) as loader:
        assert loader.manifest.kind == "captions" and loader.classes is None
        batches = 0
        for (ref_images, labels, ref_keys), (images, texts, keys) in zip(ref, loader, strict=True):
            assert keys == ref_keys and torch.equal(images, ref_images)  # same crops and flips
            assert texts == [both["captions"][int(k)] for k in keys]
            assert labels.tolist() == [int(k) // 8 for k in keys]
            batches += 1
        assert batches == len(loader) == 6


def test_epochs_resume_elastic_resume_and_even_batches_match_labelled(both: dict[str, Any]) -> None:
    def scenarios(dataset: str | list[str]) -> list[list[list[str]]]:
        weights = [1.0, 3.0] if isinstance(dataset, list) else None
        make = lambda **kw: ShardLoader(dataset, batch_size=3, keys=True, seed=2, weights=weights, **kw)  # noqa: E731
        runs = []
        with make() as whole:
            runs += [_keys(whole, 0), _keys(whole, 1)]
        with make() as first:
            runs.append(_keys(first, 1, stop=3))
            state = first.state_dict()
        with make() as resumed:
            resumed.load_state_dict(state)
            runs.append(_keys(resumed, 1))
        for rank in range(2):  # elastic: the rest of the epoch over 2 ranks of batch 2, and an uneven eval split
            with make(rank=rank, world_size=2) as ranked:
                ranked.load_state_dict(state)
                runs.append(_keys(ranked, 1))
            with make(rank=rank, world_size=2, even_batches=False, shuffle=False) as evaluated:
                runs.append(_keys(evaluated, 0))
        return runs

    single = scenarios(both["a"][1])
    assert single == scenarios(both["a"][0])
    assert single[0] != single[1] and len(single[2]) == 3 and single[2] + single[3] == single[1]
    assert sorted(k for run in single[5::2] for batch in run for k in batch) == [f"{i:08d}" for i in range(24)]
    mixed = scenarios([both["a"][1], both["b"][1]])
    assert mixed == scenarios([both["a"][0], both["b"][0]])


def tokenize(texts: list[str]) -> dict[str, Any]:
    """A toy tokenizer: the first 6 characters' code points, padded; and the process it ran in."""
    ids = torch.tensor([[ord(c) for c in t[:6].ljust(6)] for t in texts])
    return {"ids": ids, "pid": os.getpid()}


def test_text_transform_runs_in_the_workers_and_fields_come_along(both: dict[str, Any]) -> None:
    _, captioned = both["a"]
    with ShardLoader(captioned, batch_size=5, num_workers=2, keys=True, text_transform=tokenize,
                     fields=("url", "similarity")) as loader:
        seen = []
        for images, texts, keys in loader:
            assert isinstance(images, list) and len(images) == len(keys)
            assert [decode_index(im) for im in images] == [int(k) for k in keys]
            assert texts["text"]["pid"] != os.getpid()
            expected = [both["captions"][int(k)] for k in keys]
            assert texts["text"]["ids"].tolist() == [[ord(c) for c in t[:6].ljust(6)] for t in expected]
            assert texts["url"] == [f"https://example.com/{int(k)}.jpg" if int(k) % 2 == 0 else None for k in keys]
            assert texts["similarity"] == [float(f"0.{int(k)}") if int(k) % 2 == 0 else None for k in keys]
            seen += keys
        assert sorted(seen) == [f"{i:08d}" for i in range(24)]


def test_adopted_img2dataset_shards_stream(tmp_path: Path) -> None:
    written = img2dataset_shards(tmp_path / "wds")
    adopt_shards(str(tmp_path / "wds"))
    with ShardLoader(str(tmp_path / "wds"), batch_size=4, keys=True, fields=["status"],
                     transform=transforms.imagenet_val(8, crop_fraction=1.0)) as loader:
        got = {}
        for images, texts, keys in loader:
            assert images.shape == (len(keys), 3, 8, 8)
            got.update({k: (t, s) for k, t, s in zip(keys, texts["text"], texts["status"], strict=True)})
    assert got == {k: (m["txt"].decode(), "success") for k, m in written.items()}


def test_misuse_is_refused(both: dict[str, Any]) -> None:
    labelled, captioned = both["a"]
    with pytest.raises(LoaderError, match="text_transform and fields need a captioned dataset; this one is .imag"):
        ShardLoader(labelled, batch_size=2, fields=["url"])
    with pytest.raises(LoaderError, match="cannot mix datasets of different kinds"):
        ShardLoader([labelled, captioned], batch_size=2)
    with pytest.raises(LoaderError, match="disjoint_labels is for ImageFolder datasets"):
        ShardLoader([captioned, both["b"][1]], batch_size=2, disjoint_labels=True)
    with pytest.raises(LoaderError, match="fields may not include 'text'"):
        ShardLoader(captioned, batch_size=2, fields=["text"])
    for bad in (3, "url", ["url", 7]):
        with pytest.raises(LoaderError, match="fields must be a list of json field names"):
            ShardLoader(captioned, batch_size=2, fields=bad)  # type: ignore[arg-type]
    with ShardLoader(captioned, batch_size=2, fields=None) as no_fields:  # as fields=(): the captions alone
        assert isinstance(next(iter(no_fields))[1], list)
    with ShardLoader(captioned, batch_size=2, fields=(f for f in ["url"])) as from_generator:  # type: ignore[arg-type]
        assert set(next(iter(from_generator))[1]) == {"text", "url"}
    with pytest.raises(LoaderError, match="feeders hand over one tensor per batch .* needs a text_transform"):
        ShardLoader(captioned, batch_size=2, num_workers=2, feeders=1, transform=transforms.imagenet_val(8))


def test_gpu_route_worker_half_ships_texts_beside_the_jpegs(both: dict[str, Any]) -> None:
    """The GPU route's worker batches of a captioned set: the labelled set's images (emulated on the
    CPU) with the text made in the worker; a replaced image takes its text row along."""
    from shardkit.loader.read.captions import CaptionTargets
    from shardkit.loader.routes.gpu.host import GpuPipeline
    from shardkit.loader.routes.gpu.worker import RawBatchBuilder
    from shardkit.loader.run.stream import BatchStream, raise_failures
    from tests.loader.gpu_helpers import emulate_device, staged

    transform = transforms.imagenet_train(16)
    streams = []
    for dataset, captions in zip(both["a"], (None, CaptionTargets(fields=("url",), text_transform=tokenize)),
                                 strict=True):
        with ShardLoader(dataset, batch_size=5, transform=transform, seed=3) as loader:
            builder = RawBatchBuilder(loader.reader, transform, captions=captions)
            streams.append(list(raise_failures(BatchStream(loader.config, builder, torch.tensor([1, 0])))))
    for labelled, captioned in zip(*streams, strict=True):
        assert captioned.keys == labelled.keys
        assert torch.equal(emulate_device(captioned), emulate_device(labelled))
        assert captioned.images.labels.tolist() == list(range(len(captioned.keys)))
        expected = [both["captions"][int(k)] for k in captioned.keys]
        assert captioned.texts["text"]["ids"].tolist() == [[ord(c) for c in t[:6].ljust(6)] for t in expected]
    batch = streams[1][0]
    raw, keys = batch.images, list(batch.keys)
    raw.jpegs()[0].zero_()  # not an image: the rescue replaces it by a neighbour
    labels = raw.labels.clone()
    out = torch.zeros((len(raw), 3, 16, 16), dtype=torch.uint8)
    pipeline = GpuPipeline(transform, torch.device("cpu"), compile=False)
    assert pipeline._cpu_rescue(staged(batch), [0], out, labels, batch)
    texts = CaptionTargets.take(batch.texts, labels.tolist())
    bad = int(raw.geometry[0, -1])
    src = keys.index(batch.keys[bad])
    assert src != bad and texts["url"][bad] == texts["url"][src]
    assert torch.equal(texts["text"]["ids"][bad], texts["text"]["ids"][src])


def test_gpu_route_keeps_a_captioned_batch_text_off_the_prefetcher_stream() -> None:
    """The prefetcher records its stream on the tensors it made on the device; a tokenizer's ids
    (a CPU tensor from a worker) are not among them: recording a stream on them fails."""
    from shardkit.loader.routes.gpu.host import DeviceBatch
    from shardkit.loader.stats import StageStats

    images = torch.empty((2, 3, 4, 4), device="meta")  # stands for the device
    labelled = DeviceBatch(images, torch.empty(2, dtype=torch.int64, device="meta"), ["a", "b"], StageStats())
    captioned = DeviceBatch(images, transforms.ByteTokenizer(4)(["a", "b"]), ["a", "b"], StageStats())
    assert len(labelled.tensors()) == 2 and captioned.tensors() == (images,)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_route_delivers_tokenized_captions_on_the_device(both: dict[str, Any]) -> None:
    """A tokenizer that returns one tensor (ids), workers and the prefetcher: the ids on the device."""
    _, captioned = both["a"]
    with ShardLoader(captioned, batch_size=4, transform=transforms.imagenet_train(16), device="cuda",
                     num_workers=2, text_transform=transforms.ByteTokenizer(6)) as loader:
        seen = [(images.shape[0], ids) for images, ids in loader]
    assert len(seen) == len(loader) and all(ids.is_cuda and ids.shape == (n, 6) for n, ids in seen)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_route_delivers_captions_beside_the_labelled_images(both: dict[str, Any]) -> None:
    from shardkit.loader.routes.gpu import GpuRoute

    labelled, captioned = both["a"]
    kwargs: dict[str, Any] = {"batch_size": 4, "transform": transforms.imagenet_train(16), "keys": True,
                              "device": "cuda", "num_workers": 2, "seed": 4}
    with ShardLoader(labelled, **kwargs) as ref, ShardLoader(captioned, text_transform=tokenize, **kwargs) as loader:
        assert isinstance(loader.route, GpuRoute) and loader.feeders == 0
        batches = 0
        for (ref_images, _, ref_keys), (images, texts, keys) in zip(ref, loader, strict=True):
            assert keys == ref_keys and images.is_cuda and torch.equal(images, ref_images)
            assert texts["ids"].is_cuda and texts["pid"] != os.getpid()
            expected = [both["captions"][int(k)] for k in keys]
            assert texts["ids"].tolist() == [[ord(c) for c in t[:6].ljust(6)] for t in expected]
            batches += 1
        assert batches == len(loader)


def _exploding_tokenizer(texts: list[str]) -> Any:
    raise ValueError("tokenizer exploded")


def _short_tokenizer(texts: list[str]) -> Any:
    return {"ids": torch.zeros(len(texts), 3), "lengths": [3] * (len(texts) - 1)}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_text_transform_error_names_the_batch_and_a_wrong_row_count_is_refused(both: dict[str, Any],
                                                                                  workers: int) -> None:
    _, captioned = both["a"]
    with (ShardLoader(captioned, batch_size=4, num_workers=workers, text_transform=_exploding_tokenizer) as loader,
          pytest.raises(ValueError, match="tokenizer exploded") as info):
        next(iter(loader))
    assert info.value.__notes__[0].startswith(f"raised by the text_transform on the batch that starts with sample "
                                              f"{captioned}/")
    with (ShardLoader(captioned, batch_size=4, num_workers=workers, text_transform=_short_tokenizer) as loader,
          pytest.raises(LoaderError, match=r"text_transform returned a list of 3 in \['lengths'\] for a batch of 4 "
                                           r"captions")):
        next(iter(loader))
    with (ShardLoader(captioned, batch_size=4, num_workers=workers,
                      text_transform=lambda texts: torch.zeros(1, 8)) as loader,  # rows silently misaligned
          pytest.raises(LoaderError, match=r"a tensor of shape \(1, 8\) for a batch of 4 captions: no dimension is "
                                           r"one per caption")):
        next(iter(loader))
    with (ShardLoader(captioned, batch_size=4, num_workers=workers, text_transform=lambda texts: None) as loader,
          pytest.raises(LoaderError, match=r"text_transform returned None for a batch of 4 captions \(a function "
                                           r"without a return\?\)")):
        next(iter(loader))
    for layout in (lambda texts: torch.zeros(5, len(texts)),  # sequence-first: the transform's own layout
                   lambda texts: (torch.zeros(len(texts), 2), torch.ones(len(texts), 2)),  # a pair of parts
                   lambda texts: {"tokens": torch.zeros(7), "offsets": torch.zeros(len(texts) + 1)},  # flat + offsets
                   lambda texts: {"ids": torch.zeros(6, 3), "overflow_to_sample_mapping": torch.zeros(6)},  # overflow
                   lambda texts: {"ids": [[1]] * len(texts), "context_length": torch.tensor(8)}):  # a batch's number
        with ShardLoader(captioned, batch_size=4, num_workers=workers, text_transform=layout) as loader:
            next(iter(loader))


def test_a_field_no_sample_has_is_said_once_and_a_sparse_one_not_at_all(both: dict[str, Any],
                                                                        caplog: pytest.LogCaptureFixture,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from shardkit.loader.read import captions

    monkeypatch.setattr(captions, "_absent", {})
    _, captioned = both["a"]  # 24 samples: fewer than ABSENT_SAID_AFTER, said once an epoch has none
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        with ShardLoader(captioned, batch_size=1, fields=("similarty", "url"), shuffle=False) as loader:
            texts = [texts for _images, texts in loader]
        with ShardLoader(captioned, batch_size=1, fields=("similarty",)) as loader:
            list(loader)  # said once per process
    assert all(t["similarty"] == [None] for t in texts)
    assert None in [t["url"][0] for t in texts]  # odd samples have no json: url is sparse, not misspelt
    said = [r.getMessage() for r in caplog.records if "misspelt" in r.getMessage()]
    assert captions.ABSENT_SAID_AFTER > 24
    assert len(said) == 1 and said[0].startswith("shardkit: none of 24 samples has the field 'similarty' in its json "
                                                 "(misspelt? their json has ")
    assert "'similarity'" in said[0] and said[0].endswith("); its values are None")


def test_the_missing_field_warning_names_the_fields_of_its_own_loaders_samples(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two loaders in one process: the second's warning named the first one's json fields too."""
    import logging

    from shardkit.loader.read import captions
    from shardkit.loader.read.captions import CaptionTargets
    from shardkit.loader.read.samples import Sample

    monkeypatch.setattr(captions, "_absent", {})
    first = CaptionTargets(fields=("nope",), absent_after=2)
    second = CaptionTargets(fields=("simlarity",), absent_after=2)
    a = first.read(Sample("a", {"txt": b"x", "json": b'{"url": "u", "width": 3}'}, "s.tar:a"))
    b = second.read(Sample("b", {"txt": b"y", "json": b'{"similarity": 0.3}'}, "s.tar:b"))
    empty = CaptionTargets(fields=("other",), absent_after=2)
    c = empty.read(Sample("c", {"txt": b"z", "json": b"{}"}, "s.tar:c"))
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        first.collate([a, a])
        second.collate([b, b])
        empty.collate([c, c])
    said = [r.getMessage() for r in caplog.records]
    assert said == ["shardkit: none of 2 samples has the field 'nope' in its json (misspelt? their json has 'url', "
                    "'width'); its values are None",
                    "shardkit: none of 2 samples has the field 'simlarity' in its json (misspelt? their json has "
                    "'similarity'); its values are None",
                    "shardkit: none of 2 samples has the field 'other' in its json (misspelt? their json has no "
                    "fields); its values are None"]
