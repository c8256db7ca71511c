"""The CPU route: decode and transform in the worker processes, copy batches to the device."""

from shardkit.loader.routes.cpu.route import CpuRoute

__all__ = ["CpuRoute"]
