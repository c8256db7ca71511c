"""The COCO GPU route: detection batches decoded with nvJPEG and cropped, resized (each image to
its own size) and flipped on the device in one launch; boxes and labels as on the CPU route."""

from shardkit.loader.routes.coco_gpu.route import CocoGpuRoute

__all__ = ["CocoGpuRoute"]
