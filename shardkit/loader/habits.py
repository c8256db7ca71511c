"""Calls of a :class:`~shardkit.loader.ShardLoader` written with another library's habits: the
``DataLoader`` arguments it takes where they change nothing (:class:`DataLoaderArgs`), and Python's
own ``TypeError`` for any other, saying what to write instead (a ``DataLoader`` or ``ImageFolder``
argument, a transform preset's option, a misspelt name, options by position)."""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
import torch

log = logging.getLogger("shardkit.loader")

__all__ = ["DataLoaderArgs", "check_call", "check_dataloader_args", "dataloader_arg_refused", "init_signature"]


class DataLoaderArgs(TypedDict, total=False):
    """DataLoader's arguments a :class:`~shardkit.loader.ShardLoader` call takes at the values
    where a DataLoader would do what the loader does anyway, so that a DataLoader call converts by
    its name alone; any other value is refused, saying what to write instead."""

    #: Either: the workers stay up from one epoch to the next whatever it says.
    persistent_workers: bool
    #: False, or True with ``device="cuda"`` (batches reach the GPU through pinned memory), or True
    #: on a machine with no CUDA device (nothing to pin for, as a DataLoader there; a warning says so).
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
    # True beside a CUDA device, and where there is none to pin for (as DataLoader, said in a warning)
    "pin_memory": lambda value, kwargs: _flag(value) is False or (_flag(value) is True and (
        _on_cuda(kwargs) or not torch.cuda.is_available())),
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
    "allow_empty": "empty class folders are kept when packing (shardkit pack --allow-empty), not when loading",
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
    if _flag(extra.get("pin_memory", False)) and not _on_cuda({**given, **extra}):
        log.warning("shardkit: pin_memory=True, but this machine has no CUDA device: nothing is pinned (as "
                    "DataLoader does there); with a GPU, pass device='cuda' instead")


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
