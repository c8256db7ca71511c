"""A CPU-route batch as it travels from a service worker to the training process.

Ray stores numpy arrays in its object store and hands the reader a view of the stored bytes
(no copy on a node of the cluster), while a torch tensor would be pickled by value. So a
:class:`~shardkit.loader.routes.cpu.worker.CpuBatch` leaves the worker with every tensor in it
(images, labels, a tokenizer's output) turned into an :class:`Array`, and is made whole again
in the training process. The stage counters travel as a dict of numbers and a failure as a
:class:`Failure` of plain fields, re-raised by class name from :mod:`shardkit.errors` only.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

import numpy as np
import torch

from shardkit import errors
from shardkit.errors import LoaderError, ShardkitError
from shardkit.loader.routes.cpu.worker import CpuBatch
from shardkit.loader.stats import StageStats

__all__ = ["Array", "Failure", "Payload", "from_payload", "raise_failure", "to_payload"]


@dataclass(frozen=True)
class Array:
    """A tensor, as the numpy array Ray stores without copying (its dtype is numpy's)."""

    array: np.ndarray


@dataclass(frozen=True)
class Payload:
    """One batch on the wire: a :class:`CpuBatch` with its tensors as :class:`Array`."""

    images: Any
    labels: Any
    keys: list[str]
    stats: dict[str, Any]  # StageStats' fields


@dataclass(frozen=True)
class Failure:
    """A :class:`ShardkitError` raised building a batch: its class name, message and ``where``."""

    kind: str
    message: str
    where: str
    traceback: str


def _out(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return Array(value.numpy())
    if isinstance(value, dict):
        return {k: _out(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_out(v) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_out(v) for v in value))
    if isinstance(value, tuple):
        return tuple(_out(v) for v in value)
    return value


def _in(value: Any, writable: bool) -> Any:
    if isinstance(value, Array):
        array = value.array
        if writable and not array.flags.writeable:
            return torch.from_numpy(array.copy())
        with warnings.catch_warnings():  # read-only: copied to the device before the user sees it
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            return torch.from_numpy(array)
    if isinstance(value, dict):
        return {k: _in(v, writable) for k, v in value.items()}
    if isinstance(value, list):
        return [_in(v, writable) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_in(v, writable) for v in value))
    if isinstance(value, tuple):
        return tuple(_in(v, writable) for v in value)
    return value


def to_payload(batch: CpuBatch) -> Payload:
    """``batch`` for the wire (in the service worker)."""
    return Payload(_out(batch.images), _out(batch.labels), list(batch.keys), asdict(batch.stats))


def from_payload(payload: Payload, *, writable: bool) -> CpuBatch:
    """The batch ``payload`` carries, in the training process.

    ``writable``: tensors the user gets as they are (delivery on the CPU) are copied out of
    Ray's read-only object store; otherwise (delivery on a GPU, which copies them there) they
    are views of it.

    Example:
        >>> b = CpuBatch(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([1, 2]), ["a", "b"], StageStats())
        >>> back = from_payload(to_payload(b), writable=True)
        >>> torch.equal(back.images, b.images), back.labels.tolist(), back.keys
        (True, [1, 2], ['a', 'b'])
    """
    return CpuBatch(_in(payload.images, writable), _in(payload.labels, writable), payload.keys,
                    StageStats(**payload.stats))


def raise_failure(failure: Failure, what: str) -> NoReturn:
    """Raise the error ``failure`` records (its shardkit class, message and ``where``); ``what``
    names the batch. A class name shardkit does not have is raised as :class:`LoaderError`."""
    kind = getattr(errors, failure.kind, None)
    if not (isinstance(kind, type) and issubclass(kind, ShardkitError)):
        kind = LoaderError
    raise kind(failure.message, where=failure.where) from LoaderError(
        f"raised in a service worker building {what}:\n{failure.traceback}")
