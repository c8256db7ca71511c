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


def _not_s3(err: BaseException) -> str | None:
    """The ``server`` header of a 404 that no object store sent (no ``x-amz*`` header, as AWS, MinIO
    and moto send, nor ``x-goog*``, as GCS's S3-compatible API sends), for a message; None where the
    reply looks like a store's or none is attached."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            if headers and not any(str(k).lower().startswith(("x-amz", "x-goog")) for k in headers):
                return f"server: {headers.get('server', 'unnamed')}"
            return None
        cause = cause.__cause__ or cause.__context__
    return None


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
    except FileNotFoundError as err:
        server = _not_s3(err)
        if server is not None:
            raise StorageError(f"the endpoint answered 'not found' without any of an S3 server's headers ({server}): "
                               "is it an S3 server, and does the bucket exist? (the endpoint comes from "
                               "AWS_ENDPOINT_URL or the storage option client_kwargs.endpoint_url)",
                               where=url) from None  # not a missing file
    except PermissionError:
        return
    else:
        return
    raise StorageError(
        f"bucket {bucket!r} does not exist (or is not visible with these credentials); shardkit "
        "never creates buckets: check the name, or create the bucket first",
        where=url,
    )
