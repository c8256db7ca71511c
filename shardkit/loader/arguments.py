"""A :class:`~shardkit.loader.ShardLoader`'s arguments, checked when it is built (naming the
argument), and the number of feeder processes its ``feeders`` argument asks for."""

from __future__ import annotations

import inspect
import logging
import operator
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from shardkit.errors import LoaderError
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.feed.labels import SlotLabels, probe_text
from shardkit.loader.feed.layout import auto_feeders
from shardkit.loader.read.captions import ABSENT_SAID_AFTER, CaptionTargets, TextTransform
from shardkit.loader.read.samples import ON_ERROR
from shardkit.loader.routes.base import Route
from shardkit.loader.routes.gpu import GpuOptions, GpuRoute
from shardkit.machine import auto_workers, cores_of_this_process
from shardkit.transforms.base import ImageTransform

__all__ = ["as_device", "as_int", "caption_targets", "check_arguments", "check_service", "feeder_count",
           "feeder_slots", "plain_int", "say_if_no_batch", "worker_count"]

log = logging.getLogger("shardkit.loader")


def as_int(name: str, value: object, least: int = 0, below: int | None = None) -> int:
    """``value`` as a plain int (numpy integers too), in ``[least, below)``.

    Example:
        >>> import numpy as np
        >>> as_int("batch_size", np.int64(32), 1)
        32
        >>> as_int("epoch", 1.5)
        Traceback (most recent call last):
        ...
        shardkit.errors.LoaderError: epoch must be an int >= 0, got 1.5

    Raises:
        LoaderError: ``value`` is no integer (a bool, a float, a str, None) or out of range.
    """
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None or number < least:
        raise LoaderError(f"{name} must be an int >= {least}, got {value!r}")
    if below is not None and number >= below:
        top = f"2**{below.bit_length() - 1}" if below & (below - 1) == 0 else str(below)
        raise LoaderError(f"{name} must be an int below {top}, got {value!r}")
    return number


def as_device(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device`.

    Example:
        >>> as_device("cuda:1")
        device(type='cuda', index=1)
        >>> as_device("bogus")
        Traceback (most recent call last):
        ...
        shardkit.errors.LoaderError: device='bogus' is not a device torch knows (cpu, cuda, cuda:1, ...)

    Raises:
        LoaderError: torch makes no device of ``device`` (an unknown name, a malformed index, None),
            or it is ``"meta"``, whose tensors hold no data.
    """
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError):
        raise LoaderError(f"device={device!r:.80} is not a device torch knows (cpu, cuda, cuda:1, ...)") from None
    if where.type == "meta":
        raise LoaderError("device='meta' makes tensors that hold no data: batches would come without their images "
                          "(pass device='cpu' or 'cuda')")
    return where


def say_if_no_batch(config: PlanConfig) -> None:
    """Warn when an epoch of ``config`` gives its rank no batch, saying why and what to change: a
    DataLoader says nothing, and a run that trains on nothing is worse than a warning."""
    if config.num_batches:
        return
    who = f"rank {config.rank} of {config.world_size}" if config.world_size > 1 else "this loader"
    over = f" over {config.world_size} ranks" if config.world_size > 1 else ""
    if config.drop_last:
        fix = ("fewer ranks or more samples" if config.num_samples < config.world_size
               else "lower batch_size, or drop_last=False")
        log.warning("shardkit: an epoch gives %s no batch: %d samples%s make no full batch of %d; %s",
                    who, config.num_samples, over, config.batch_size, fix)
    else:  # even_batches=False: a rank may get none (a small evaluation set over many ranks), as documented
        log.info("shardkit: an epoch gives %s no batch: %d samples%s in batches of %d leave it none "
                 "(even_batches=False)", who, config.num_samples, over, config.batch_size)


def plain_int(value: Any) -> Any:
    """An integer of another type (numpy's) as an int, a numpy bool as a bool; anything else as
    given, for its check to name (``rank="0"`` stays a str)."""
    if isinstance(value, (int, str, bytes, float)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    try:
        return operator.index(value)
    except TypeError:
        return value


def worker_count(num_workers: int | str) -> int:
    """``num_workers`` as a count, ``"auto"`` resolved (:func:`~shardkit.machine.auto_workers`, logged);
    a count above this process's cores is taken, with a warning (torch's own is not given).

    Raises:
        LoaderError: neither ``"auto"`` nor an int >= 0.
    """
    if num_workers != "auto":
        try:
            num_workers = as_int("num_workers", num_workers)
        except LoaderError:
            raise LoaderError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}") from None
        if num_workers > 1:
            _say_if_too_many(num_workers)
        return num_workers
    count = auto_workers()
    log.info("shardkit: num_workers='auto' picked %d (%s)", count, auto_reason())
    return count


def _say_if_too_many(num_workers: int) -> None:
    """Warn when ``num_workers`` exceeds this process's share of the cores (nothing where that
    share cannot be told: ``auto`` says why when it is asked for)."""
    try:
        cores, auto = cores_of_this_process(), auto_workers()
    except LoaderError:
        return
    if num_workers > cores:
        log.warning(TOO_MANY_WORKERS, num_workers, cores, auto)


#: The warning of a ``num_workers`` above this process's share of the cores (``shardkit bench``,
#: which builds a loader a run, says it once of its own and leaves this one out).
TOO_MANY_WORKERS = ("shardkit: num_workers=%d is more than the %d cores that are this process's share: the workers "
                    "take turns on them (num_workers='auto' picks %d)")


def auto_reason() -> str:
    """What ``num_workers="auto"`` went by, for messages."""
    return f"{cores_of_this_process()} of the host's cores are this process's share, one left for training"


def as_flags(**given: object) -> tuple[bool, ...]:
    """The values of ``given`` as bools, in order (numpy's bools too, as a ``DataLoader`` takes
    them from a config).

    Example:
        >>> import numpy as np
        >>> as_flags(shuffle=np.False_, drop_last=True)
        (False, True)

    Raises:
        LoaderError: a value is not a bool, naming its argument.
    """
    for name, flag in given.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise LoaderError(f"{name} must be True or False, got {flag!r}")
    return tuple(bool(flag) for flag in given.values())


def check_arguments(*, batch_size: int, window: int, prefetch: int, on_error: str,
                     rank: int | None, world_size: int | None, gpu: GpuOptions | None,
                     pad: object, transform: object = None, cache_dir: object = None) -> None:
    """Refuse bad arguments when the loader is built, naming the argument, rather than later in
    a worker process (where torch would re-raise the error under its own type) or on one route only
    (``num_workers``: :func:`worker_count`).

    Raises:
        LoaderError: an argument is out of range or of the wrong type.
    """
    minimum = {"batch_size": (batch_size, 1), "window": (window, 1), "prefetch": (prefetch, 1)}
    for name, (value, least) in minimum.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise LoaderError(f"{name} must be an int >= {least}, got {value!r}")
    if on_error not in ON_ERROR:
        raise LoaderError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    for name, given in (("rank", rank), ("world_size", world_size)):
        if given is not None and (isinstance(given, bool) or not isinstance(given, int)):
            raise LoaderError(f"{name} must be an int or None, got {given!r}")
    if gpu is not None and not isinstance(gpu, GpuOptions):
        raise LoaderError(f"gpu must be a GpuOptions or None, got {type(gpu).__name__}")
    if not isinstance(pad, int) or (not isinstance(pad, bool) and pad < 1):
        raise LoaderError(f"pad must be False, True or a positive int (sides rounded up to it), got {pad!r}")
    if cache_dir is not None and (not isinstance(cache_dir, (str, os.PathLike)) or not os.fspath(cache_dir)):
        raise LoaderError(f"cache_dir must be a folder's path, or None for the default ($XDG_CACHE_HOME/shardkit, "
                          f"else ~/.cache/shardkit), got {cache_dir!r:.80}")
    if transform is not None and not callable(transform):
        raise LoaderError("transform must be a callable (e.g. shardkit.transforms.imagenet_train(224), or any "
                          f"function of a uint8 [3, H, W] tensor) or None, got {transform!r:.80}")
    _check_made(transform)


#: The functions of :mod:`shardkit.transforms` that make a transform (the presets).
_MAKERS = frozenset({"imagenet_train", "imagenet_val", "detection_train", "detection_val"})


def _check_made(transform: object) -> None:
    """Refuse a transform's maker passed in place of the transform (``transform=imagenet_train``),
    which would fail only at the first batch, in a worker, with an error about tensors.

    Example:
        >>> from shardkit.transforms import RandomResizedCropFlip, imagenet_train
        >>> _check_made(imagenet_train(224))  # a transform: nothing to say
        >>> _check_made(RandomResizedCropFlip)
        Traceback (most recent call last):
        ...
        shardkit.errors.LoaderError: transform=RandomResizedCropFlip is a class: pass an instance of it, e.g. ...
    """
    name = getattr(transform, "__qualname__", "")
    if inspect.isclass(transform) and any("__call__" in vars(c) for c in transform.__mro__[:-1]):
        # a class whose instances are the transforms (ImageTransform, nn.Module, torchvision's);
        # one whose constructor returns the result (tv_tensors.Image) is a transform itself
        raise LoaderError(f"transform={name} is a class: pass an instance of it, e.g. transform={name}(...)")
    if (inspect.isfunction(transform) and name in _MAKERS
            and getattr(transform, "__module__", "").startswith("shardkit.transforms")):
        example = f"{name}(224)" if name.startswith("imagenet_") else f"{name}(...)"
        raise LoaderError(f"transform={name} makes a transform: call it, e.g. transform={example}")


def check_service(service: object, *, num_workers: int | str, feeders: int | str, gpu: GpuOptions | None) -> None:
    """Refuse what a loader with a service (``service=``) cannot take: local workers, feeders or
    GPU-route options (its batches are built on the CPU route, by the service's workers).

    Raises:
        LoaderError: ``service`` is not a :class:`~shardkit.loader.service.RayService`, or
            ``num_workers``, ``feeders`` or ``gpu`` ask for local work.
    """
    from shardkit.loader.service.options import RayService

    if not isinstance(service, RayService):
        raise LoaderError(f"service must be a shardkit.RayService (or None), got {type(service).__name__}")
    if num_workers != 0:
        raise LoaderError(f"with service= the workers are the service's (RayService(workers={service.workers})): "
                          f"leave num_workers at 0, got {num_workers!r}")
    if feeders not in ("auto", 0):
        raise LoaderError(f"with service= batches arrive from the service, not from feeders: leave feeders out, "
                          f"got {feeders!r}")
    if gpu is not None:
        raise LoaderError("gpu= configures the GPU route (nvJPEG in this process), which a service does not feed: "
                          "with service= images are decoded and augmented on the service's CPUs")


def feeder_count(feeders: int | str, route: Route[Any, Any], transform: object, num_workers: int,
                  kind: str, *, captions: CaptionTargets | None = None,
                  workers_auto: bool = False) -> tuple[int, SlotLabels]:
    """The feeder processes a loader runs (see ``ShardLoader``'s ``feeders``) and what their slots
    hold beside the images (:mod:`~shardkit.loader.feed.labels`: a captioned dataset's text
    transform is tried once here, when feeders may run). ``captions``: a captioned dataset's text
    side; ``workers_auto``: ``num_workers`` came from ``"auto"`` (the error then says so).
    ``"auto"`` runs none where they cannot run, logging why at info level.

    Raises:
        LoaderError: a bad value, or feeders asked for where they cannot run (naming why).
    """
    if feeders == "auto":
        if not isinstance(route, GpuRoute) or num_workers == 0:
            return 0, SlotLabels()
        try:
            slots = feeder_slots(transform, kind, captions)
        except LoaderError as err:
            log.info("shardkit: feeders='auto' runs none: %s", err)
            return 0, SlotLabels()
        return auto_feeders(num_workers), slots
    if isinstance(feeders, bool) or not isinstance(feeders, int) or feeders < 0:
        raise LoaderError(f"feeders must be 'auto' or an int >= 0, got {feeders!r}")
    if feeders == 0:
        return 0, SlotLabels()
    slots = feeder_slots(transform, kind, captions)
    if num_workers < feeders:
        given = f"num_workers='auto' gave {num_workers} ({auto_reason()})" if workers_auto else \
            f"got num_workers={num_workers}"
        raise LoaderError(f"feeders share the workers: num_workers must be >= feeders, {given}, feeders={feeders}")
    return feeders, slots


def feeder_slots(transform: object, kind: str, captions: CaptionTargets | None) -> SlotLabels:
    """What feeders' slots hold beside the images of a dataset of ``kind`` (labels, or a captioned
    batch's token tensor: :func:`~shardkit.loader.feed.labels.probe_text`).

    Raises:
        LoaderError: feeders cannot carry these batches (naming why, in one line).
    """
    why = None
    if kind not in ("imagefolder", "captions"):
        why = f"this dataset is {kind!r}"
    elif not isinstance(transform, ImageTransform):
        why = f"the transform is {'None' if transform is None else 'a ' + type(transform).__name__}"
    if why is not None:
        raise LoaderError(f"feeders need an ImageFolder or captioned dataset and an ImageTransform (transforms."
                          f"imagenet_train or imagenet_val): they hand over one image tensor and one label or token "
                          f"tensor per batch; {why}; use feeders=0")
    return probe_text(captions) if kind == "captions" else SlotLabels()


def caption_targets(text_transform: TextTransform | None, fields: Sequence[str] | None, *,
                    per_reader: int | None = None) -> CaptionTargets | None:
    """The text side asked for (None: nothing asked; a captioned dataset then gets the captions).
    ``fields=None`` is no field, as ``()``. ``per_reader``: the samples one process reads of an
    epoch, where a field none of them has is said to be missing if that is fewer than
    :data:`~shardkit.loader.read.captions.ABSENT_SAID_AFTER`.

    Raises:
        LoaderError: ``fields`` is not a sequence of names, or ``text_transform`` not callable.
    """
    fields = () if fields is None else fields
    if isinstance(fields, str) or not isinstance(fields, Iterable):
        raise LoaderError(f"fields must be a list of json field names, got {fields!r:.80}")
    fields = tuple(fields)
    if not all(isinstance(f, str) and f for f in fields):
        raise LoaderError(f"fields must be a list of json field names, got {fields!r:.80}")
    if text_transform is not None and not callable(text_transform):
        raise LoaderError(f"text_transform must be callable (list of str -> anything), got {text_transform!r:.80}")
    if text_transform is None and not fields:
        return None
    after = ABSENT_SAID_AFTER if per_reader is None else max(1, min(ABSENT_SAID_AFTER, per_reader))
    try:
        return CaptionTargets(tuple(fields), text_transform, absent_after=after)
    except ValueError as err:
        raise LoaderError(str(err)) from err
