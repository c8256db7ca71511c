"""What a location string names: a local path or an fsspec URL, one within another, and a URL
written with one slash after its scheme."""

from __future__ import annotations

import os
import pathlib

__all__ = ["is_remote", "local_path", "url_typo", "within"]


def is_remote(url: str) -> bool:
    """Whether ``url`` names an fsspec location rather than a local path (``file://`` is local)."""
    return "://" in url and not url.startswith("file://")


#: URL schemes of object stores and web servers: ``s3:/bucket`` (one slash) is a typo of ``s3://bucket``,
#: not a local folder named ``s3:``.
_URL_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "http", "https", "hf", "memory",
                          "oci", "r2"})


def url_typo(url: str) -> str | None:
    """What is wrong with ``url`` if it is a URL with one slash after its scheme (``s3:/bucket``),
    which a local path would take as a folder named ``s3:``; None for anything else, and where a
    local folder of that name (``s3:``) exists, for any path in it.

    >>> url_typo("s3:/bucket/train")
    "'s3:/bucket/train' is a local path as written; a URL needs two slashes: s3://bucket/train"
    >>> url_typo("s3://bucket/train") is None, url_typo("data/s3:/x") is None
    (True, True)
    """
    scheme, colon, rest = url.partition(":")
    if not colon or scheme.lower() not in _URL_SCHEMES or rest.startswith("//"):
        return None
    if os.path.isdir(f"{scheme}:") or os.path.exists(url):  # a local folder of that name, and paths in it
        return None
    return f"{url!r} is a local path as written; a URL needs two slashes: {scheme}://{rest.lstrip('/')}"


def within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (local paths resolved, symlinks too; URLs compared as
    written; a URL is never within a local path, nor the other way round).

    >>> within("file:///tmp/a/b", "/tmp/a"), within("s3://b/x/y", "s3://b/x"), within("s3://b/xy", "s3://b/x")
    (True, True, False)
    """
    if is_remote(path) != is_remote(root):
        return False
    if is_remote(path):
        a, b = path.rstrip("/"), root.rstrip("/")
        return a == b or a.startswith(b + "/")
    a_path = pathlib.Path(local_path(path)).resolve()
    b_path = pathlib.Path(local_path(root)).resolve()
    return a_path == b_path or b_path in a_path.parents


def local_path(url: str) -> str:
    """``url`` without a ``file://`` prefix."""
    return url[len("file://") :] if url.startswith("file://") else url
