"""Errors the user's own code (a ``transform``) raised on a sample: named with the sample, and
sent from a worker process with their type and message, as the loader's own errors are.

The error is left as it is, with a note (``raised by the transform on SHARD:KEY``) that Python
prints under its message; :func:`sample_of` finds the sample again where the batch's worker
turns it into data (:class:`~shardkit.loader.run.stream.WorkerFailure`).
"""

from __future__ import annotations

import contextlib
import pickle

__all__ = ["blame", "picklable_kind", "sample_of"]

_WHERE = "_shardkit_sample"


def blame(err: BaseException, where: str, what: str = "the transform on") -> None:
    """Name ``where`` (``SHARD:KEY``) on ``err``, raised by ``what`` that sample (once).

    Example:
        >>> err = ValueError("width 175")
        >>> blame(err, "shards/a.tar:0007")
        >>> sample_of(err), err.__notes__
        ('shards/a.tar:0007', ['raised by the transform on sample shards/a.tar:0007'])
    """
    if sample_of(err) is not None:
        return
    with contextlib.suppress(AttributeError):  # a type with __slots__: the note alone names the sample
        setattr(err, _WHERE, where)
    err.add_note(f"raised by {what} sample {where}")


def sample_of(err: BaseException) -> str | None:
    """The sample :func:`blame` named on ``err``, or None."""
    where = getattr(err, _WHERE, None)
    return where if isinstance(where, str) else None


def picklable_kind(err: BaseException) -> type[BaseException] | None:
    """``type(err)`` if it can travel from a worker process by reference (a class importable under
    its name), else None."""
    try:
        pickle.loads(pickle.dumps(type(err)))
    except Exception:  # a class defined in a function, or in a module the other side lacks
        return None
    return type(err)
