"""A :class:`~shardkit.loader.ShardLoader`'s arguments, checked when it is built (naming the
argument), and the number of feeder processes its ``feeders`` argument asks for."""

from __future__ import annotations

import difflib
import inspect
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
import torch

from shardkit.errors import LoaderError
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.feed.labels import SlotLabels, probe_text
from shardkit.loader.feed.layout import auto_feeders
from shardkit.loader.read.captions import CaptionTargets, TextTransform
from shardkit.loader.read.samples import ON_ERROR
from shardkit.loader.routes.base import Route
from shardkit.loader.routes.gpu import GpuOptions, GpuRoute
from shardkit.machine import auto_workers, cores_of_this_process
from shardkit.transforms.base import ImageTransform

__all__ = ["DataLoaderArgs", "as_device", "as_int", "caption_targets", "check_arguments", "check_call",
           "check_dataloader_args", "check_service", "feeder_count",
           "feeder_slots", "init_signature", "plain_int", "say_if_no_batch", "worker_count"]

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
        LoaderError: torch makes no device of ``device`` (an unknown name, a malformed index, None).
    """
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise LoaderError(f"device={device!r:.80} is not a device torch knows (cpu, cuda, cuda:1, ...)") from None


class DataLoaderArgs(TypedDict, total=False):
    """DataLoader's arguments a :class:`~shardkit.loader.ShardLoader` call takes at the values
    where a DataLoader would do what the loader does anyway, so that a DataLoader call converts by
    its name alone; any other value is refused, saying what to write instead."""

    #: Either: the workers stay up from one epoch to the next whatever it says.
    persistent_workers: bool
    #: False, or True with ``device="cuda"`` (batches reach the GPU through pinned memory).
    pin_memory: bool
    #: ``""``, or the ``device`` given.
    pin_memory_device: str
    #: None, or the loader's ``prefetch`` (2 unless given).
    prefetch_factor: int | None
    #: 0: no time limit.
    timeout: float
    #: True: batches come in the epoch's order.
    in_order: bool
    collate_fn: None
    sampler: None
    batch_sampler: None
    generator: None
    worker_init_fn: None
    multiprocessing_context: None


#: DataLoader's arguments ShardLoader does without, and what to write instead of a value that
#: would change what a DataLoader does (see :class:`DataLoaderArgs` for the values taken).
_DATALOADER_ONLY = {
    "persistent_workers": "its workers stay up from one epoch to the next: pass True or False, or leave it out",
    "pin_memory": "pass device='cuda': batches then arrive on the GPU, copied from pinned memory",
    "prefetch_factor": "it is prefetch= here (batches each worker prepares ahead)",
    "collate_fn": "the loader joins each batch (see transform=): do per-batch work in the loop",
    "sampler": "the order comes from shuffle=, seed= and the ranks (rank=, world_size=)",
    "batch_sampler": "batches come from batch_size=, drop_last=, shuffle=, seed= and the ranks",
    "generator": "the order and every sample's augmentation come from seed=",
    "worker_init_fn": "there is no such hook: make per-worker state lazily, in the transform",
    "timeout": "a worker that raises or dies ends the iteration with its error; one that hangs (a transform "
               "that never returns) waits, as DataLoader's default timeout=0 does",
    "in_order": "batches always come in the epoch's order (the order state_dict() resumes)",
    "multiprocessing_context": "workers start by the process's default method (multiprocessing.set_start_method); "
                               "feeders from a forkserver",
    "pin_memory_device": "pass device='cuda[:i]': batches then arrive on that GPU",
}


def _on_cuda(kwargs: Mapping[str, Any]) -> bool:
    try:
        return torch.device(kwargs.get("device", "cpu")).type == "cuda"
    except (RuntimeError, TypeError):
        return False  # the device's own check names it


def _same_device(value: Any, kwargs: Mapping[str, Any]) -> bool:
    """``pin_memory_device`` empty or naming the ``device`` (``"cuda"`` names any CUDA device)."""
    if value == "":
        return True
    try:
        pin, device = torch.device(value), torch.device(kwargs.get("device", "cpu"))
    except (RuntimeError, TypeError):
        return False
    return pin.type == device.type == "cuda" and None in (pin.index, device.index) or pin == device


def _flag(value: Any) -> bool | None:
    """``value`` as a bool where it is one (numpy's too, as DataLoader takes them), else None."""
    return bool(value) if isinstance(value, (bool, np.bool_)) else None


#: For each of DataLoader's arguments, whether a value changes nothing here, given the call's others.
_CHANGES_NOTHING: dict[str, Callable[[Any, Mapping[str, Any]], bool]] = {
    "persistent_workers": lambda value, kwargs: _flag(value) is not None,
    "pin_memory": lambda value, kwargs: _flag(value) is False or (_flag(value) is True and _on_cuda(kwargs)),
    # unused without pin_memory, as DataLoader leaves it
    "pin_memory_device": lambda value, kwargs: (isinstance(value, str) and not _flag(kwargs.get("pin_memory", False))
                                                or _same_device(value, kwargs)),
    "prefetch_factor": lambda value, kwargs: value is None or (
        _flag(value) is None and value == kwargs.get("prefetch", 2)),
    "timeout": lambda value, kwargs: _flag(value) is None and value == 0,
    "in_order": lambda value, kwargs: _flag(value) is True,
}


def dataloader_arg_refused(name: str, key: str, kwargs: Mapping[str, Any]) -> str | None:
    """Why DataLoader's argument ``key`` at its value in ``kwargs`` is refused by a call of
    ``name``, or None where the value changes nothing (:class:`DataLoaderArgs`).

    Example:
        >>> dataloader_arg_refused("ShardLoader", "pin_memory", {"pin_memory": True, "device": "cuda"}) is None
        True
        >>> print(dataloader_arg_refused("ShardLoader", "timeout", {"timeout": 5}))  # doctest: +ELLIPSIS
        ShardLoader() got DataLoader's argument timeout=5, which it does without: a worker that raises or dies ...
    """
    value = kwargs[key]
    if _CHANGES_NOTHING.get(key, lambda value, kwargs: value is None)(value, kwargs):
        return None
    return f"{name}() got DataLoader's argument {key}={value!r:.60}, which it does without: {_DATALOADER_ONLY[key]}"


#: torchvision ``ImageFolder``'s own arguments, which a loader call may be given by habit.
_IMAGEFOLDER_ONLY = {
    "target_transform": "labels come as an int64 tensor in each batch: map them in your loop",
    "loader": "images are decoded by the loader (see transform=, which gets each as a uint8 [3, H, W] tensor)",
    "is_valid_file": "the files are chosen when packing (shardkit pack), not when loading",
    "allow_empty": "empty class folders are chosen when packing (shardkit pack), not when loading",
}

#: Options of the transform presets a loader call may be given by mistake, with where each goes:
#: said as the transform's, not matched to a loader argument by spelling.
_TRANSFORM_OPTIONS = {
    "size": "the preset's first argument: transform=transforms.imagenet_train(224)",
    "scale": "transform=transforms.imagenet_train(224, scale=...)",
    "ratio": "transform=transforms.imagenet_train(224, ratio=...)",
    "flip_p": "transform=transforms.imagenet_train(224, flip_p=...)",
    "crop_fraction": "transform=transforms.imagenet_val(224, crop_fraction=...)",
    "normalize": "transform=transforms.imagenet_train(224, normalize=...) (or imagenet_val)",
    "mean": "transform=transforms.imagenet_train(224, normalize=(mean, std)) (or imagenet_val)",
    "std": "transform=transforms.imagenet_train(224, normalize=(mean, std)) (or imagenet_val)",
    "dtype": "transform=transforms.imagenet_train(224, dtype=...) (or imagenet_val)",
    "channels_last": "transform=transforms.imagenet_train(224, channels_last=True) (or imagenet_val)",
    "interpolation": "transform=transforms.imagenet_train(224, interpolation=...) (or imagenet_val)",
}


def check_call(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call of ``cls`` its signature does not take with Python's own ``TypeError``,
    saying what to write instead: DataLoader's arguments it does without, a misspelt name, the
    options passed by position.

    Example:
        >>> class Loader:
        ...     def __init__(self, dataset: str, *, batch_size: int, num_workers: int = 0) -> None: ...
        >>> check_call(Loader, ("d",), {"batch_size": 2, "num_worker": 2})
        Traceback (most recent call last):
        ...
        TypeError: Loader() got an unexpected keyword argument 'num_worker' (did you mean 'num_workers'?)
    """
    signature = init_signature(cls)
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        why = _why(cls.__name__, signature, args, kwargs)
        if why is not None:
            raise TypeError(why) from None
        # anything else (a required argument missing): Python's own message, from the call itself


def check_dataloader_args(cls: type, extra: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """Refuse the keyword arguments ``extra`` that a call of ``cls`` gathered in its
    ``**dataloader_args`` unless each is DataLoader's at a value that changes nothing
    (:class:`DataLoaderArgs`), with Python's own ``TypeError`` saying what to write instead.
    ``given``: the call's own arguments the values are judged by (``device``, ``prefetch``).

    Example:
        >>> class Loader:
        ...     def __init__(self, dataset: str, *, batch_size: int, **dataloader_args: Any) -> None: ...
        >>> check_dataloader_args(Loader, {"persistent_workers": True, "collate_fn": None}, {})
        >>> check_dataloader_args(Loader, {"batchsize": 2}, {})
        Traceback (most recent call last):
        ...
        TypeError: Loader() got an unexpected keyword argument 'batchsize' (did you mean 'batch_size'?)
    """
    params = list(dict.fromkeys(  # a subclass's own, then those it passes on (ShardLoader's), for the hints
        key for c in cls.__mro__ if c is not object for key, param in init_signature(c).parameters.items()
        if param.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)))
    for key in extra:
        why = _unknown_key(cls.__name__, params, key, {**given, **extra})
        if why is not None:
            raise TypeError(why)


def init_signature(cls: type) -> inspect.Signature:
    """The parameters of ``cls.__init__`` less ``self``: what a call of ``cls`` takes, whatever its
    ``__new__`` (a subclass's own ``__init__`` included)."""
    init: Any = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(init)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _unknown_key(name: str, params: Sequence[str], key: str, kwargs: Mapping[str, Any]) -> str | None:
    """Why ``key``, which ``name``'s named parameters ``params`` lack, is refused; None where it is
    DataLoader's at a value that changes nothing."""
    if key in _DATALOADER_ONLY:
        return dataloader_arg_refused(name, key, kwargs)
    if key in _IMAGEFOLDER_ONLY:
        return f"{name}() got ImageFolder's argument {key!r}, which it does without: {_IMAGEFOLDER_ONLY[key]}"
    if key in _TRANSFORM_OPTIONS and "transform" in params:
        return f"{name}() got {key!r}, an option of the transform, not of the loader: {_TRANSFORM_OPTIONS[key]}"
    close = difflib.get_close_matches(key, list(params), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{name}() got an unexpected keyword argument {key!r}{hint}"


def _why(name: str, signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    params = signature.parameters
    for key in kwargs:
        if key not in params:
            why = _unknown_key(name, list(params), key, kwargs)
            if why is not None:
                return why
    positional = [p for p in params.values() if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if len(args) > len(positional):
        keyword = [p.name for p in params.values() if p.kind == inspect.Parameter.KEYWORD_ONLY]
        return (f"{name}() takes {len(positional)} positional argument ({', '.join(p.name for p in positional)}); "
                f"pass the rest by keyword, e.g. {name}(dataset, {keyword[0]}=...)" if keyword else None)
    return None


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
    """An integer of another type (numpy's) as an int; anything else as given, for its check to
    name (``rank="0"`` stays a str)."""
    if isinstance(value, (int, str, bytes, float)):
        return value
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


def check_arguments(*, batch_size: int, window: int, prefetch: int, on_error: str,
                     rank: int | None, world_size: int | None, gpu: GpuOptions | None, even_batches: bool,
                     flags: dict[str, object], pad: object, transform: object = None) -> None:
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
    for name, flag in {"even_batches": even_batches, **flags}.items():
        if not isinstance(flag, bool):
            raise LoaderError(f"{name} must be True or False, got {flag!r}")
    if not isinstance(pad, int) or (not isinstance(pad, bool) and pad < 1):
        raise LoaderError(f"pad must be False, True or a positive int (sides rounded up to it), got {pad!r}")
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


def caption_targets(text_transform: TextTransform | None, fields: Sequence[str]) -> CaptionTargets | None:
    """The text side asked for (None: nothing asked; a captioned dataset then gets the captions).

    Raises:
        LoaderError: ``fields`` is not a sequence of names, or ``text_transform`` not callable.
    """
    if isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields):
        raise LoaderError(f"fields must be a list of json field names, got {fields!r:.80}")
    if text_transform is not None and not callable(text_transform):
        raise LoaderError(f"text_transform must be callable (list of str -> anything), got {text_transform!r:.80}")
    if text_transform is None and not fields:
        return None
    try:
        return CaptionTargets(tuple(fields), text_transform)
    except ValueError as err:
        raise LoaderError(str(err)) from err
