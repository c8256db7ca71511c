"""The GPU route: nvJPEG decode and one crop-resize-flip launch per batch, prepared ahead."""

from shardkit.loader.gpu.options import GpuOptions
from shardkit.loader.gpu.route import GpuRoute

__all__ = ["GpuOptions", "GpuRoute"]
