"""Storage: local paths and fsspec URLs behind one small, picklable ``Store``."""

from shardkit.storage.store import Store
from shardkit.storage.urls import is_remote, url_typo, within

__all__ = ["Store", "is_remote", "url_typo", "within"]
