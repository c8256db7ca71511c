"""The GPU route: nvJPEG decode and one crop-resize-flip launch per batch, prepared ahead."""

from shardkit.loader.routes.device.options import GpuOptions
from shardkit.loader.routes.gpu.route import GpuRoute

__all__ = ["GpuOptions", "GpuRoute"]
