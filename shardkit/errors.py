"""The exceptions shardkit raises, each carrying the place (url, shard, key) it concerns."""

from __future__ import annotations


class ShardkitError(Exception):
    """Base class of every error shardkit raises on purpose.

    ``where`` names the file, shard, member or sample concerned (may be empty); the message
    says what is wrong with it. ``str(err)`` gives ``"<where>: <message>"``.
    """

    def __init__(self, message: str, *, where: str = "") -> None:
        self.message = message
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class SourceError(ShardkitError):
    """The input dataset (ImageFolder tree, COCO json) is missing or malformed."""


class FormatError(ShardkitError):
    """A shard or member does not follow the shardkit/webdataset tar format."""


class ManifestError(ShardkitError):
    """``index.json`` is missing, malformed, or of an unknown format version."""


class VerifyError(ShardkitError):
    """A packed dataset does not match its manifest (size, count, hash, member)."""


class StorageError(ShardkitError):
    """Reading or writing a local path or fsspec URL failed."""


class PackError(ShardkitError):
    """Packing cannot proceed (e.g. DST holds a different dataset)."""


class DecodeError(ShardkitError):
    """An image could not be decoded."""


class LoaderError(ShardkitError):
    """The loader was misconfigured or hit data it cannot recover from."""


def interrupt_behind(err: BaseException) -> KeyboardInterrupt | SystemExit | None:
    """The KeyboardInterrupt (Ctrl-C, or a SIGTERM raised as one) or SystemExit that ``err`` is or
    that it was raised while handling (its chain of causes and contexts), or None."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (KeyboardInterrupt, SystemExit)):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def reraise_interrupt(err: BaseException) -> None:
    """Raise the KeyboardInterrupt (Ctrl-C) or SystemExit behind ``err``, if there is one.

    Python wraps what a class body or ``__set_name__`` raises: Ctrl-C landing while a decoder
    plugin is imported lazily (PIL's GIF plugin on the first GIF) arrives as a RuntimeError,
    which a ``except Exception`` around a decode would report as a corrupt image. And an
    interruption that stops a DataLoader's workers may come back as torch's RuntimeError about
    them, raised while the interruption unwound.
    """
    interrupt = interrupt_behind(err)
    if interrupt is not None:
        raise interrupt from None
