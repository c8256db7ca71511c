"""Object-store buckets: a missing bucket is an error naming it, never created behind the user's
back.

s3fs's ``makedirs`` creates a missing bucket (so a mistyped ``s3://my-typo-bucket/train`` became a
new bucket), and its ``exists`` answers ``False`` for a missing bucket and for one it cannot
reach alike. shardkit asks for the bucket itself instead, once per store.
"""

from __future__ import annotations

from typing import Any

from shardkit.errors import StorageError

#: Protocols whose first path component is a bucket (container) that shardkit must not create.
BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def bucket_of(url: str) -> str | None:
    """``"s3://bucket/a/b"`` -> ``"bucket"``; ``None`` for URLs without buckets (local, ``memory://``).

    >>> bucket_of("s3://my-bucket/train"), bucket_of("memory://x/y"), bucket_of("/data")
    ('my-bucket', None, None)
    """
    protocol, sep, rest = url.partition("://")
    if not sep or protocol not in BUCKET_PROTOCOLS:
        return None
    return rest.split("/", 1)[0] or None


def check_bucket(fs: Any, url: str) -> None:
    """Raise :class:`StorageError` naming the bucket of ``url`` if the store says it does not exist.

    A bucket that exists but may not be inspected (HTTP 403 on the bucket itself) passes: the
    operation that follows reports its own error. Other errors (network, credentials) propagate
    unchanged for the caller to describe.
    """
    bucket = bucket_of(url)
    if bucket is None:
        return
    protocol = url.split("://", 1)[0]
    try:
        fs.info(f"{protocol}://{bucket}")
    except FileNotFoundError:
        pass
    except PermissionError:
        return
    else:
        return
    raise StorageError(
        f"bucket {bucket!r} does not exist (or is not visible with these credentials); shardkit "
        "never creates buckets: check the name, or create the bucket first",
        where=url,
    )
