"""shardkit: pack image datasets into tar shards and stream them fast into PyTorch.

``import shardkit`` stays light (no torch); the torch-backed names (``ShardLoader``,
``transforms``, ``GpuOptions``, ``RayService``) are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardkit._version import __version__
from shardkit.errors import (
    DecodeError,
    FormatError,
    LoaderError,
    ManifestError,
    PackError,
    ShardkitError,
    SourceError,
    StorageError,
    VerifyError,
)

__all__ = [
    "DecodeError",
    "FormatError",
    "LoaderError",
    "ManifestError",
    "PackError",
    "ShardkitError",
    "SourceError",
    "StorageError",
    "VerifyError",
    "GpuOptions",
    "RayService",
    "ShardLoader",
    "transforms",
    "__version__",
]

# name -> "module:attribute" (attribute empty: the module itself); imported on first access.
_LAZY = {
    "GpuOptions": "shardkit.loader:GpuOptions",
    "RayService": "shardkit.loader.service:RayService",
    "ShardLoader": "shardkit.loader:ShardLoader",
    "transforms": "shardkit.transforms:",
}

if TYPE_CHECKING:
    from shardkit import transforms
    from shardkit.loader import GpuOptions, ShardLoader
    from shardkit.loader.service import RayService


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'shardkit' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value
