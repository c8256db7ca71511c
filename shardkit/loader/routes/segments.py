"""Shared-memory segments with no name, shipped between processes as file descriptors.

A worker hands a batch's memory to the process that consumes it without copying it: the segment
is made in the worker, its descriptor travels over a Unix socket (``multiprocessing``'s
``DupFd``, as torch ships a shared tensor) and the consumer maps it. Nothing is named in
/dev/shm, whatever ``torch.multiprocessing``'s sharing strategy: with ``file_system`` torch names
each segment after its maker and unlinks it only when every process that mapped it has let go,
which a killed worker never does. The memory of a nameless segment is freed with its last mapping
or descriptor, so no process death leaves it behind.

On Linux a segment is a ``memfd_create(2)`` file, which never has a name anywhere and is not
bounded by the size of /dev/shm (a container's is often 64 MiB; its memory counts as the process's
shared memory, as a segment in /dev/shm does). Elsewhere it is torch's file-descriptor
allocation, a file in /dev/shm unlinked once mapped: a process killed between the two leaves its
name behind.

The CPU route's batch pool (:mod:`~shardkit.loader.routes.cpu.shared_pool`) ships each of a
worker's segments once and sends only a reference afterwards.
"""

from __future__ import annotations

import os
from multiprocessing.reduction import DupFd
from typing import Any

import torch

from shardkit._compat import fd_storage, fd_storage_attach, fd_storage_descriptor

__all__ = ["attach", "descriptor", "in_segment", "segment_view", "share_", "shared_segment"]


def shared_segment(nbytes: int) -> torch.UntypedStorage:
    """``nbytes`` (zeros) of shared memory with no name in /dev/shm: a ``memfd_create`` file
    where the system has one, else torch's file-descriptor allocation. Ship it with
    :func:`descriptor` (torch's own pickling would give it a name under ``file_system``)."""
    make = getattr(os, "memfd_create", None)
    if make is None or nbytes == 0:  # not Linux; a zero-length file cannot be mapped
        return fd_storage(nbytes)
    try:
        fd = make("shardkit-segment", os.MFD_CLOEXEC)
    except OSError:  # a sandbox that forbids it (seccomp)
        return fd_storage(nbytes)
    try:
        # reserved now, as torch's allocation reserves it: no room is an error here, not a
        # SIGBUS where a page is first written
        os.posix_fallocate(fd, 0, nbytes)
        return _private(fd_storage_attach(fd, nbytes))
    finally:
        os.close(fd)


def _private(segment: torch.UntypedStorage) -> torch.UntypedStorage:
    """``segment``, its descriptor closed on exec (torch's copy of it is inheritable: a program
    this process starts would keep the memory alive)."""
    os.set_inheritable(fd_storage_descriptor(segment)[0], False)
    return segment


def in_segment(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """``storage`` itself where it is shared memory already, on another device or empty; else a
    copy of it in a :func:`shared_segment`: what torch's pickling would otherwise make of it under
    the ``file_descriptor`` strategy, in /dev/shm."""
    if storage.device.type != "cpu" or storage.is_shared() or storage.nbytes() == 0:
        return storage
    segment = shared_segment(storage.nbytes())
    # a tensor's copy_ lets go of the GIL (a storage's does not): the batch's worker goes on meanwhile
    segment_view(segment, (storage.nbytes(),)).copy_(segment_view(storage, (storage.nbytes(),)))
    return segment


def share_(tensor: torch.Tensor) -> torch.Tensor:
    """Move ``tensor``'s memory into shared memory in place, as ``tensor.share_memory_()`` does,
    into a :func:`shared_segment` (its layout kept); under the ``file_system`` strategy, where
    torch ships a tensor by name, ``share_memory_()`` itself."""
    if torch.multiprocessing.get_sharing_strategy() == "file_system":
        return tensor.share_memory_()
    storage = in_segment(tensor.untyped_storage())
    return tensor.set_(storage, tensor.storage_offset(), tensor.shape, tensor.stride())


def descriptor(segment: torch.UntypedStorage) -> tuple[Any, int]:
    """What pickles ``segment`` as its file descriptor (sent over a Unix socket, as torch does)."""
    fd, nbytes = fd_storage_descriptor(segment)
    return DupFd(fd), nbytes


def attach(shipped: tuple[Any, int]) -> torch.UntypedStorage:
    """The segment a :func:`descriptor` names, mapped in this process."""
    handle, nbytes = shipped
    fd = handle.detach()
    try:
        return _private(fd_storage_attach(fd, nbytes))
    finally:
        os.close(fd)


def segment_view(segment: torch.UntypedStorage, shape: tuple[int, ...]) -> torch.Tensor:
    """A uint8 tensor of ``shape`` over the start of ``segment``.

    Example:
        >>> segment_view(shared_segment(8), (2, 4)).shape
        torch.Size([2, 4])
    """
    return torch.empty(0, dtype=torch.uint8).set_(segment, 0, shape)  # type: ignore[call-overload]
