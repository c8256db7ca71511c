"""The :class:`~shardkit.sources.files.Files` for a source root: local files or an fsspec URL."""

from __future__ import annotations

import os
from typing import Any

from shardkit.errors import SourceError
from shardkit.sources.files import Files
from shardkit.sources.local import LocalFiles
from shardkit.sources.remote import RemoteFiles
from shardkit.storage import is_remote, url_typo

__all__ = ["open_files"]


def open_files(root: str, storage_options: dict[str, Any] | None = None) -> Files:
    """:class:`Files` for ``root``: a local directory, or an fsspec URL read with
    ``storage_options`` (credentials, endpoint).

    >>> open_files("/data/train").remote, open_files("memory://bucket/train").remote
    (False, True)

    Raises:
        SourceError: ``root`` is a URL with one slash after its scheme (``s3:/bucket``).
    """
    if typo := url_typo(root):
        raise SourceError(typo)
    if is_remote(root):
        return RemoteFiles(root, storage_options)
    return LocalFiles(os.path.expanduser(root))  # "~/data", as torchvision's ImageFolder takes it
