"""A feeder's CUDA context waits for the device by sleeping, not spinning.

By default (``cudaDeviceScheduleAuto``) a CUDA context whose process has fewer contexts than the
machine has cores *spins* a core in every host wait: ``cudaStreamSynchronize``, an event's
``synchronize``, and nvJPEG's batched decode, which returns only once the batch is decoded. A
feeder waits on the device for part of its time, cores the workers and the training step's host
thread could use. Measured on an H200 (docs/performance.md), the feeders' CPU per image did not
change with this (0.136 and 0.151 ms against 0.144 and 0.146 ms): they spend little of it
spinning. It stays because a sleeping wait costs nothing measurable and leaves the core free.

Before its context exists, a feeder sets its device's primary context to
``CU_CTX_SCHED_BLOCKING_SYNC`` through the driver API (``cuDevicePrimaryCtxSetFlags_v2``, CUDA 11
on; ``libcuda`` is loaded by any CUDA program): each wait then blocks on a primitive the driver
signals, at a wake-up cost of microseconds per wait, a few waits per batch. The training
process's own context is the program's to configure and is left alone.
"""

from __future__ import annotations

import ctypes
import logging

__all__ = ["BLOCKING_SYNC", "sleep_while_waiting"]

log = logging.getLogger(__name__)

#: ``CU_CTX_SCHED_BLOCKING_SYNC`` (cuda.h).
BLOCKING_SYNC = 0x04


def sleep_while_waiting(device_index: int) -> bool:
    """Make host waits on CUDA device ``device_index`` block instead of spin, in this process;
    call before anything creates the device's context. False (with a debug record) where the
    driver refuses or cannot be loaded: the default scheduling then stays."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        calls = {"cuInit": [ctypes.c_uint], "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
                 "cuDevicePrimaryCtxSetFlags_v2": [ctypes.c_int, ctypes.c_uint]}
        for call, argtypes in calls.items():  # CUresult (an enum, int) from each
            getattr(driver, call).argtypes, getattr(driver, call).restype = argtypes, ctypes.c_int
        device = ctypes.c_int()  # filled by cuDeviceGet, read when the flags call is made
        for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), device_index)),
                           ("cuDevicePrimaryCtxSetFlags_v2", (device, BLOCKING_SYNC))):
            status = getattr(driver, call)(*args)
            if status != 0:
                log.debug("shardkit: %s returned CUDA error %d; the feeder's waits spin", call, status)
                return False
    except (OSError, AttributeError) as err:
        log.debug("shardkit: CUDA driver not reachable (%s); the feeder's waits spin", err)
        return False
    return True
