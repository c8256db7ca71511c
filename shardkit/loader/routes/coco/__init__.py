"""The COCO route: detection batches of images and torchvision-style targets."""

from shardkit.loader.routes.coco.route import CocoRoute
from shardkit.loader.routes.coco.worker import PaddedImages, pad_images

__all__ = ["CocoRoute", "PaddedImages", "pad_images"]
