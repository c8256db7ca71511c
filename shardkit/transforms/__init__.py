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

from typing import TYPE_CHECKING, Any

from shardkit.transforms.base import ImageTransform
from shardkit.transforms.batch import IMAGENET_MEAN, IMAGENET_STD, BatchFormat
from shardkit.transforms.center_crop import ResizeCenterCrop, resize_center_crop_box
from shardkit.transforms.color import ColorJitter
from shardkit.transforms.erasing import RandomErasing
from shardkit.transforms.ops import crop_resize_flip
from shardkit.transforms.params import CropFlip
from shardkit.transforms.presets import imagenet_train, imagenet_val
from shardkit.transforms.random_resized_crop import RandomResizedCropFlip, random_resized_crop_box
from shardkit.transforms.text import ByteTokenizer

if TYPE_CHECKING:
    from shardkit.transforms.detection import (
        DetectionTransform,
        detection_train,
        detection_val,
        run_detection_transform,
    )

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

#: Imported on first use: they need torchvision, whose import (it loads torch._dynamo through
#: torchvision.ops) costs every loader worker, feeder and training process seconds of CPU that
#: classification and captions never use.
_DETECTION = frozenset({"DetectionTransform", "detection_train", "detection_val", "run_detection_transform"})


def __getattr__(name: str) -> Any:
    if name in _DETECTION:
        from shardkit.transforms import detection

        return getattr(detection, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the lazily imported detection ones (tab completion, ``dir()``)."""
    return sorted({*globals(), *__all__})
