"""The COCO route: detection batches of images and torchvision-style targets."""

from shardkit.loader.coco.build import PaddedImages, pad_images
from shardkit.loader.coco.route import CocoRoute

__all__ = ["CocoRoute", "PaddedImages", "pad_images"]
