"""Image transforms: crop/flip parameter sampling, CPU tensor ops, presets; detection presets.

Workers call ``sample_params`` (seeded ``random.Random``) and ``apply`` per image; the loader
calls ``finalize`` once per batch on the target device.

Example:
    >>> import random
    >>> from shardkit.transforms import imagenet_train
    >>> t = imagenet_train(224)
    >>> t.sample_params(375, 500, random.Random(0)).inside(375, 500)
    True
"""

from shardkit.transforms.base import ImageTransform
from shardkit.transforms.batch import IMAGENET_MEAN, IMAGENET_STD, BatchFormat
from shardkit.transforms.center_crop import ResizeCenterCrop, resize_center_crop_box
from shardkit.transforms.color import ColorJitter
from shardkit.transforms.detection import (
    DetectionTransform,
    detection_train,
    detection_val,
    run_detection_transform,
)
from shardkit.transforms.erasing import RandomErasing
from shardkit.transforms.ops import crop_resize_flip
from shardkit.transforms.params import CropFlip
from shardkit.transforms.presets import imagenet_train, imagenet_val
from shardkit.transforms.random_resized_crop import RandomResizedCropFlip, random_resized_crop_box
from shardkit.transforms.text import ByteTokenizer

__all__ = [
    "ByteTokenizer",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "BatchFormat",
    "ColorJitter",
    "CropFlip",
    "DetectionTransform",
    "ImageTransform",
    "RandomErasing",
    "RandomResizedCropFlip",
    "ResizeCenterCrop",
    "crop_resize_flip",
    "detection_train",
    "detection_val",
    "imagenet_train",
    "imagenet_val",
    "random_resized_crop_box",
    "resize_center_crop_box",
    "run_detection_transform",
]
