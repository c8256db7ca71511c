"""Bad ShardLoader arguments fail at construction with a LoaderError naming the argument."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import LoaderError, ShardLoader, transforms
from shardkit.loader import GpuOptions

BAD = [
    ("batch_size", 0), ("batch_size", -1), ("batch_size", 2.5), ("batch_size", True),
    ("num_workers", -1), ("num_workers", "all"), ("num_workers", 1.5), ("window", 0), ("window", -2), ("prefetch", 0),
    ("device_prefetch", 1), ("device_prefetch", 0), ("decode_threads", 0), ("decode_threads", 1.5),
    ("gpu", {"device_prefetch": 4}), ("on_error", "skip"), ("pad", "8"), ("pad", 2.5), ("pad", 0), ("pad", -1),
    ("masks", "yes"), ("contiguous_labels", 1), ("shuffle", None), ("drop_last", "no"), ("keys", 0),
    ("rank", 2), ("rank", -1), ("rank", "0"), ("world_size", 0),
    ("even_batches", "no"), ("even_batches", 0), ("even_batches", None),
    ("transform", "imagenet_train"), ("transform", 224),
    ("seed", None), ("seed", -1), ("seed", 1 << 64), ("seed", 2.0), ("seed", "3"),
]
GPU_FIELDS = ("device_prefetch", "decode_threads")


@pytest.mark.parametrize(("name", "value"), BAD)
def test_bad_argument_fails_at_construction_naming_it(packed: Path, name: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"batch_size": 4, "num_workers": 1, "transform": transforms.imagenet_val(32)}
    if name == "rank":
        kwargs["world_size"] = 2
    with pytest.raises(LoaderError, match=name):
        if name in GPU_FIELDS:  # the GPU route's options
            kwargs["gpu"] = GpuOptions(**{name: value})
        else:
            kwargs[name] = value
        ShardLoader(str(packed), **kwargs)


def test_window_zero_with_a_worker_is_refused_before_any_worker_starts(packed: Path) -> None:
    # It used to construct, then fail inside worker 0 as torch's wrapped error, without the type.
    with pytest.raises(LoaderError, match="window must be an int >= 1, got 0"):
        ShardLoader(str(packed), batch_size=4, num_workers=1, window=0)


@pytest.mark.parametrize("device", ["bogus", "CUDA", "cuda:x", "cuda:-1", "", None, 1.5])
def test_a_device_torch_does_not_know_is_refused_naming_it(packed: Path, device: Any) -> None:
    # torch's own error came through as it was: a RuntimeError listing every device type it has.
    with pytest.raises(LoaderError) as caught:
        ShardLoader(str(packed), batch_size=4, device=device)
    assert str(caught.value) == f"device={device!r} is not a device torch knows (cpu, cuda, cuda:1, ...)"


def test_the_meta_device_is_refused(packed: Path) -> None:
    """Its tensors hold no data: a loop got batches without images and no word."""
    with pytest.raises(LoaderError, match=r"^device='meta' makes tensors that hold no data"):
        ShardLoader(str(packed), batch_size=4, device="meta")


def test_good_edge_values_construct(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=1, num_workers=0, window=1, prefetch=1,
                         gpu=GpuOptions(device_prefetch=2),
                         rank=1, world_size=2, on_error="raise")
    assert len(loader) > 0
    loader.close()


def test_torchrun_variables_give_the_rank_before_a_process_group_exists(packed: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Under torchrun without init_process_group every rank used to read all data (rank 0 of 1).
    full = len(ShardLoader(str(packed), batch_size=4, shuffle=False))  # before the launcher's variables
    monkeypatch.setenv("WORLD_SIZE", "2")
    keys = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        loader = ShardLoader(str(packed), batch_size=4, shuffle=False, keys=True, drop_last=True)
        assert len(loader) < full
        keys.append({k for _, _, ks in loader for k in ks})
    assert keys[0] and keys[1] and not keys[0] & keys[1]
    explicit = ShardLoader(str(packed), batch_size=4, shuffle=False, rank=0, world_size=1)
    assert len(explicit) == full  # explicit arguments win over the launcher's variables


def test_malformed_launcher_variables_are_refused(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(LoaderError, match="WORLD_SIZE"):
        ShardLoader(str(packed), batch_size=4)


@pytest.mark.parametrize(("env", "named"), [({"WORLD_SIZE": "0", "RANK": "0"}, "launcher.s RANK=0 and WORLD_SIZE=0"),
                                            ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 and WORLD_SIZE=2"),
                                            ({"WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1"),
                                            ({"WORLD_SIZE": "0"}, "launcher's WORLD_SIZE=0 is no number of")])
def test_launcher_variables_out_of_range_are_named(packed: Path, monkeypatch: pytest.MonkeyPatch,
                                                   env: dict[str, str], named: str) -> None:
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(LoaderError, match=named):
        ShardLoader(str(packed), batch_size=4)


@pytest.mark.parametrize("threads", [0, -1, True, 1.5])
def test_decode_threads_must_be_a_positive_int(threads: object) -> None:
    from shardkit import GpuOptions

    with pytest.raises(LoaderError, match="decode_threads"):
        GpuOptions(decode_threads=threads)  # type: ignore[arg-type]


@pytest.mark.parametrize("removed", ["hw_decode", "hw_decode_threads"])
def test_removed_hw_decode_options_are_refused(removed: str) -> None:
    """The hardware JPEG decoder's options were removed (CHANGELOG, Removed); no shim takes them."""
    with pytest.raises(TypeError, match=removed):
        kwargs: dict[str, Any] = {removed: "mix" if removed == "hw_decode" else 2}
        GpuOptions(**kwargs)


def test_auto_workers_take_this_processs_share_of_the_cores_less_one(packed: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from shardkit import machine

    # (usable cores, the host's cores, LOCAL_WORLD_SIZE, workers): the usable cores are divided among
    # the local processes only when they are all the host's (a launcher that binds ranks to cores
    # has already shared them out)
    for cores, host, local, want in [(16, 16, None, 15), (16, 16, "2", 7), (2, 2, None, 1), (1, 1, None, 1),
                                     (256, 256, None, 32), (8, 8, "8", 1), (8, 64, "8", 7), (8, 64, None, 7)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        monkeypatch.setattr(os, "cpu_count", lambda n=host: n)
        if local is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        assert machine.auto_workers() == want, (cores, host, local)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2})
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    loader = ShardLoader(str(packed), batch_size=4, num_workers="auto")
    assert loader.num_workers == 2 and loader.feeders == 0  # the CPU route runs no feeders
    assert len(list(loader)) == len(loader)
    loader.close()
    with pytest.raises(LoaderError, match=r"num_workers must be >= feeders, num_workers='auto' gave 2 \(3 of the "
                                          r"host's cores are this process's share, one left for training\), feeders=3"):
        ShardLoader(str(packed), batch_size=4, num_workers="auto", feeders=3, transform=transforms.imagenet_val(32))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(LoaderError, match="LOCAL_WORLD_SIZE='two' from the launcher is not a positive integer"):
        ShardLoader(str(packed), batch_size=4, num_workers="auto")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pil_only_transform_is_told_what_it_is_given(packed: Path, workers: int) -> None:
    """torchvision's v1 ToTensor takes PIL images: one LoaderError naming the sample and saying
    what shardkit passes, in place of torch's TypeError from deep in a worker."""
    import torchvision.transforms as tvt

    pil_only = tvt.Compose([tvt.RandomResizedCrop(32), tvt.ToTensor()])
    said = r"it has ToTensor\), and shardkit gives it each image as a uint8 \[3, H, W\] tensor: put torchvision"
    with (ShardLoader(str(packed), batch_size=4, num_workers=workers, transform=pil_only) as loader,
          pytest.raises(LoaderError, match=said + r".transforms.v2.ToPILImage\(\) first") as info):
        next(iter(loader))
    assert ".tar:" in info.value.where and "Traceback" not in str(info.value)


class _OddWrapper:
    """A transform whose ``transforms`` attribute is no list of steps."""

    transforms = staticmethod(lambda image: image)

    def __call__(self, image: Any) -> Any:
        return 1 / 0


def test_an_error_past_to_pil_image_or_in_an_odd_pipeline_is_the_transforms_own(packed: Path) -> None:
    """With ToPILImage first (the fix the hint gives), an error of the user's later step is theirs,
    not "takes PIL images"; a pipeline that cannot be walked keeps its own error too."""
    import torchvision.transforms as tvt
    from torchvision.transforms import v2

    def boom(x: Any) -> Any:
        return 1 / 0

    for transform in (tvt.Compose([v2.ToPILImage(), tvt.Resize(8), tvt.ToTensor(), tvt.Lambda(boom)]),
                      _OddWrapper()):
        with (ShardLoader(str(packed), batch_size=4, num_workers=0, transform=transform) as loader,
              pytest.raises(ZeroDivisionError) as info):
            next(iter(loader))
        assert any("raised by the transform on sample" in n for n in info.value.__notes__)


def test_timms_create_transform_is_told_to_take_a_pil_image_first(packed: Path) -> None:
    """timm's pipeline passes a tensor through its MaybeToTensor, and torchvision's Normalize
    refused the uint8 tensor ("Input tensor should be a float tensor") with no word of PIL; put
    ToPILImage first, as the error says, and it runs."""
    timm_data = pytest.importorskip("timm.data")
    from torchvision.transforms import v2

    timm_train = timm_data.create_transform(32, is_training=True)
    with (ShardLoader(str(packed), batch_size=4, num_workers=0, transform=timm_train) as loader,
          pytest.raises(LoaderError, match=r"takes PIL images \(it has MaybeToTensor\).*ToPILImage\(\) first "
                                           r"\(timm's create_transform too\).*float tensor")):
        next(iter(loader))
    with ShardLoader(str(packed), batch_size=4, num_workers=0,
                     transform=v2.Compose([v2.ToPILImage(), timm_train])) as loader:
        images, _ = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32


def _raise_on_wide(image: Any) -> Any:
    if image.shape[-1] > 0:
        raise ValueError(f"width {image.shape[-1]}")
    return image


def _raise_local(image: Any) -> Any:
    class Local(Exception):  # a type no other process can find by name
        pass

    raise Local("local kind")


def _raise_unicode(image: Any) -> Any:
    raise UnicodeDecodeError("utf-8", b"x", 0, 1, "not text")  # made from 5 arguments, not a message


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("transform", "kind", "message"), [
    (_raise_on_wide, ValueError, "width "),
    (_raise_unicode, UnicodeDecodeError, "can't decode byte 0x78 in position 0: not text"),
])
def test_a_transforms_error_keeps_its_type_and_names_the_sample(packed: Path, workers: int, transform: Any,
                                                                 kind: type, message: str) -> None:
    with (ShardLoader(str(packed), batch_size=4, num_workers=workers, transform=transform) as loader,
          pytest.raises(kind) as info):
        next(iter(loader))
    assert type(info.value) is kind and message in str(info.value)
    assert "Traceback" not in str(info.value) and "DataLoader worker" not in str(info.value)
    (note,) = info.value.__notes__
    assert note.startswith(f"raised by the transform on sample {packed}/") and ".tar:" in note


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transforms_error_of_a_local_type_still_names_the_sample(packed: Path, workers: int) -> None:
    with (ShardLoader(str(packed), batch_size=4, num_workers=workers, transform=_raise_local) as loader,
          pytest.raises(Exception, match="local kind") as info):
        next(iter(loader))
    # in this process the error itself; from a worker, its type's name and message (the type cannot travel)
    assert type(info.value).__name__ == ("Local" if workers == 0 else "RuntimeError")
    assert str(info.value) == ("local kind" if workers == 0 else "_raise_local.<locals>.Local: local kind")
    assert ".tar:" in info.value.__notes__[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_that_returns_none_is_refused_naming_the_sample(packed: Path, workers: int) -> None:
    def forgot_return(image: Any) -> None:
        image.float()

    with (ShardLoader(str(packed), batch_size=4, num_workers=workers, transform=forgot_return) as loader,
          pytest.raises(LoaderError, match=r"the transform returned None \(a function without a return\?\)") as info):
        next(iter(loader))
    assert ".tar:" in info.value.where


@pytest.mark.parametrize("workers", [0, 2])
def test_outputs_are_joined_as_default_collate_joins_them_or_listed(packed: Path, workers: int) -> None:
    import itertools

    from torch.utils.data import default_collate

    def crop(image: Any) -> Any:
        return image[:, :4, :4]

    def first(transform: Any) -> Any:
        with ShardLoader(str(packed), batch_size=4, num_workers=workers, transform=transform, shuffle=False) as loader:
            return next(iter(loader))[0]

    images = first(crop)  # tensors of one shape: stacked
    as_numpy = first(lambda image: crop(image).numpy())  # numpy arrays of one shape: stacked too, as default_collate
    assert isinstance(as_numpy, torch.Tensor) and torch.equal(as_numpy, images)
    views = first(lambda image: (crop(image), image[:, :2, :2], 1))  # two views and a number: a list (as DataLoader)
    assert isinstance(views, list) and len(views) == 3
    assert torch.equal(views[0], images) and views[1].shape == (4, 3, 2, 2) and views[2].tolist() == [1] * 4
    widths = [int(i.shape[-1]) for i in first(lambda im: im)]
    fields = first(lambda image: {"image": crop(image), "n": image.shape[-1], "name": "x"})
    assert torch.equal(fields["image"], images) and fields["n"].tolist() == widths and fields["name"] == ["x"] * 4
    expected = default_collate([{"n": w} for w in widths])
    assert torch.equal(first(lambda image: {"n": image.shape[-1]})["n"], expected["n"])
    calls = itertools.count()
    shapes = first(lambda image: image[:, : 2 + next(calls)].numpy())  # arrays of several shapes: the list
    assert isinstance(shapes, list) and all(type(a).__name__ == "ndarray" for a in shapes)
    calls = itertools.count()
    ragged = first(lambda image: (image[:, : 2 + next(calls)], 1))  # pairs that do not join: the list of them
    assert len(ragged) == 4 and all(isinstance(p, tuple) and p[1] == 1 for p in ragged)
    calls = itertools.count()
    keys = first(lambda image: {f"k{next(calls) % 2}": 1})  # dicts of other keys: the list of them
    assert keys == [{"k0": 1}, {"k1": 1}, {"k0": 1}, {"k1": 1}]
    calls = itertools.count()
    more = first(lambda image: {"a": 1, **({"b": 2} if next(calls) % 2 else {})})  # a key only some have: not lost
    assert more == [{"a": 1}, {"a": 1, "b": 2}, {"a": 1}, {"a": 1, "b": 2}]
    calls = itertools.count()
    dtypes = first(lambda image: (crop(image).float() if next(calls) % 2 else crop(image),))  # not converted
    assert [d[0].dtype for d in dtypes] == [torch.uint8, torch.float32] * 2
    import numpy as np

    for number in (3, 0.5, True, np.float32(0.5), np.int16(7)):  # numbers alone, as default_collate joins them
        got, want = first(lambda image, n=number: n), default_collate([number] * 4)
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want), number
    ratio = first(lambda image: (crop(image), np.float32(image.shape[1] / image.shape[2])))  # a numpy scalar in a pair
    assert isinstance(ratio, list) and torch.equal(ratio[0], images) and ratio[1].dtype == torch.float32


def test_a_transform_output_of_a_type_a_worker_cannot_send_is_refused_not_waited_for(packed: Path) -> None:
    from collections import namedtuple

    Local = namedtuple("Local", "image label")  # defined here: a worker cannot pickle it

    with (ShardLoader(str(packed), batch_size=4, num_workers=2, transform=lambda im: Local(im[:, :4, :4], 1)) as loader,
          pytest.raises(LoaderError, match="the transform returned a Local, which cannot be sent from a worker")):
        next(iter(loader))
    with ShardLoader(str(packed), batch_size=4, transform=lambda im: Local(im[:, :4, :4], 1)) as loader:
        batch = next(iter(loader))[0]  # in this process: joined, of its own type
    assert type(batch) is Local and batch.image.shape == (4, 3, 4, 4) and batch.label.tolist() == [1] * 4


@pytest.mark.parametrize("epoch", [1.5, "1", None, -1, True, 1 << 63])
def test_a_bad_epoch_is_refused_by_set_epoch(packed: Path, epoch: Any) -> None:
    # 1.5 used to be taken: the loop ran epoch 1, and only state_dict() failed, later
    with ShardLoader(str(packed), batch_size=4) as loader:
        with pytest.raises(LoaderError, match=r"^epoch must be an int (>= 0|below \d+), got "):
            loader.set_epoch(epoch)
        assert loader.epoch == 0


def test_numpy_integers_are_taken_as_a_dataloader_takes_them(packed: Path) -> None:
    import json

    import numpy as np

    given: dict[str, Any] = {"batch_size": np.int64(4), "seed": np.uint64(3), "rank": np.int32(0),
                             "world_size": np.int64(1), "num_workers": np.int8(0), "window": np.int16(2),
                             "prefetch": np.int64(1)}  # typed int, as DataLoader's: numpy's are taken all the same
    epoch: Any = np.int64(1)
    with ShardLoader(str(packed), **given) as loader:
        loader.set_epoch(epoch)
        next(iter(loader))
        state = json.loads(json.dumps(loader.state_dict()))  # plain ints all through
    assert state["seed"] == 3 and state["epoch"] == 1 and loader.config.batch_size == 4


def test_batch_size_and_drop_last_read_as_a_dataloader_s(packed: Path) -> None:
    loader = ShardLoader(str(packed), batch_size=7, drop_last=True)
    assert (loader.batch_size, loader.drop_last) == (7, True)
    assert (ShardLoader(str(packed), batch_size=3).batch_size, ShardLoader(str(packed), batch_size=3).drop_last) == (
        3, False)


@pytest.mark.parametrize("dataset", ["", [""], ["x", ""]])
def test_an_empty_dataset_path_is_refused_as_such(dataset: Any) -> None:
    with pytest.raises(LoaderError, match="^dataset is an empty path: name a packed dataset's directory"):
        ShardLoader(dataset, batch_size=4)


def test_options_by_position_are_told_to_go_by_keyword(packed: Path) -> None:
    with pytest.raises(TypeError, match=r"takes 1 positional argument \(dataset\); pass the rest by keyword"):
        ShardLoader(str(packed), 32)  # type: ignore[call-arg]


def test_the_signature_is_the_constructors(packed: Path) -> None:
    import inspect
    import pickle

    parameters = inspect.signature(ShardLoader).parameters
    assert list(parameters)[:3] == ["dataset", "batch_size", "transform"]
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'batch_size'"):
        ShardLoader(str(packed))  # type: ignore[call-arg]
    loader = ShardLoader(str(packed), batch_size=4)
    assert len(pickle.loads(pickle.dumps(loader))) == len(loader)  # unpickling makes no call to check


def test_an_epoch_without_a_batch_is_said_when_the_loader_is_built(packed: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.WARNING, logger="shardkit"):
        samples = len(ShardLoader(str(packed), batch_size=1))
        empty = ShardLoader(str(packed), batch_size=samples, drop_last=True, rank=0, world_size=2)
        ShardLoader(str(packed), batch_size=samples)  # one batch: nothing to say
    assert len(empty) == 0 and list(empty) == []
    said = [r.getMessage() for r in caplog.records if "no batch" in r.getMessage()]
    assert said == [f"shardkit: an epoch gives rank 0 of 2 no batch: {samples} samples over 2 ranks make no full "
                    f"batch of {samples}; lower batch_size, or drop_last=False"]


def test_a_subclass_takes_its_own_arguments(packed: Path) -> None:
    import inspect

    class Mine(ShardLoader):
        def __init__(self, root: str, batch: int, *, extra: int = 1, **kwargs: Any) -> None:
            super().__init__(root, batch_size=batch, **kwargs)
            self.extra = extra

    loader = Mine(str(packed), 4, extra=2, shuffle=False)
    assert loader.extra == 2 and loader.config.batch_size == 4
    assert list(inspect.signature(Mine).parameters) == ["root", "batch", "extra", "kwargs"]
    assert list(inspect.signature(ShardLoader).parameters)[:2] == ["dataset", "batch_size"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'extar'"):
        Mine(str(packed), 4, extar=2)  # through **kwargs to ShardLoader, which has none such


def _raise_with_details(image: Any) -> Any:
    err = FileNotFoundError(2, "no such lookup table", "/tables/a.bin")
    err.add_note("while loading the lookup table")
    raise err


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transforms_error_arrives_whole(packed: Path, workers: int) -> None:
    with (ShardLoader(str(packed), batch_size=4, num_workers=workers, transform=_raise_with_details) as loader,
          pytest.raises(FileNotFoundError) as info):
        next(iter(loader))
    assert info.value.filename == "/tables/a.bin"
    assert str(info.value) == "[Errno 2] no such lookup table: '/tables/a.bin'"
    assert info.value.__notes__[0] == "while loading the lookup table" and ".tar:" in info.value.__notes__[1]
    if workers:
        assert "_raise_with_details" in str(info.value.__cause__)  # the worker's traceback, as text


def test_a_path_under_the_home_folder_is_taken_as_torchvision_takes_it(packed: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``ShardLoader("~/data")`` (a path from a config file, or quoted) said "does not exist"."""
    import shutil

    from shardkit.pack import pack
    from tests.conftest import encode_image

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(packed, tmp_path / "ds")
    with ShardLoader("~/ds", batch_size=8) as loader:
        assert len(loader) == 9 and loader.manifests[0].num_samples == 69
    from shardkit.loader.read.datasets import open_datasets

    served = open_datasets("~/ds", absolute=True, weights=None, disjoint_labels=False, storage_options=None,
                           cache_dir=str(tmp_path / "cache"))  # as ShardLoader(service=...) opens it
    assert served.parts[0].store.url == str(tmp_path / "ds")
    source = tmp_path / "tree" / "a"
    source.mkdir(parents=True)
    (source / "x.jpg").write_bytes(encode_image())
    assert pack("~/tree", "~/packed", workers=1).manifest.num_samples == 1
    assert (tmp_path / "packed" / "index.json").exists()


@pytest.mark.parametrize("cache_dir", ["", 3])
def test_a_cache_dir_that_is_no_path_is_refused(packed: Path, cache_dir: Any) -> None:
    """``cache_dir=""`` quietly meant the default folder, where remote shards were then written."""
    with pytest.raises(LoaderError, match=r"^cache_dir must be a folder's path, or None for the default"):
        ShardLoader(str(packed), batch_size=4, cache_dir=cache_dir)
