"""Sources: enumerate the samples of an input dataset (ImageFolder, COCO, captioned images) in
canonical order."""

from shardkit.sources.base import SourceListing, SourceSample
from shardkit.sources.captions import scan_caption_folder
from shardkit.sources.coco import scan_coco
from shardkit.sources.imagefolder import scan_imagefolder
from shardkit.sources.table import scan_caption_table

__all__ = ["SourceListing", "SourceSample", "scan_caption_folder", "scan_caption_table", "scan_coco",
           "scan_imagefolder"]
