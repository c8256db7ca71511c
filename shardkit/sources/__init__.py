"""Sources: enumerate the samples of an input dataset (ImageFolder, COCO) in canonical order."""

from shardkit.sources.base import SourceListing, SourceSample
from shardkit.sources.coco import scan_coco
from shardkit.sources.imagefolder import scan_imagefolder

__all__ = ["SourceListing", "SourceSample", "scan_coco", "scan_imagefolder"]
