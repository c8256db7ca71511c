"""One sample's random numbers: every global generator an augmentation may draw from (torch's CPU
generator, Python's ``random``, numpy's legacy ``numpy.random``) seeded from the sample's seed
for the call and given back as it was afterwards, so that a transform drawing from them
(torchvision's, your own) draws the same numbers for the same sample on resume and with any
worker count, and the caller's own draws are not disturbed.

``random`` and ``numpy.random`` are seeded on a process's main thread only: a batch built on a
thread of the loader's (``device="cuda"`` without worker processes) runs beside your loop, whose
draws from them would land in a sample's stream and be rolled back. torch's generator is seeded
there too, as before (torchvision's transforms draw from it).

Example:
    >>> import random
    >>> with seeded(7):
    ...     a = random.random(), float(torch.rand(()))
    >>> with seeded(7):
    ...     b = random.random(), float(torch.rand(()))
    >>> a == b
    True
"""

from __future__ import annotations

import operator
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import SupportsIndex

import numpy as np
import torch

__all__ = ["seeded"]


@contextmanager
def seeded(seed: SupportsIndex) -> Iterator[None]:
    """Seed torch's CPU generator, and on the main thread ``random`` and ``numpy.random``, from
    ``seed`` (a 64-bit sample seed) for the block, and restore their states after it. About 0.1 ms
    a call; ``torch.manual_seed`` is not used: where CUDA is not initialised it records a stack
    trace for a CUDA seeding on every call."""
    seed = operator.index(seed)  # numpy's integers too
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(seed)
    if threading.current_thread() is not threading.main_thread():
        try:
            yield
        finally:
            generator.set_state(state)
        return
    states = random.getstate(), np.random.get_state(legacy=False)
    random.seed(seed)
    np.random.seed((seed ^ (seed >> 32) ^ 0x5BD1E995) & 0xFFFFFFFF)  # 32 bits; not Python's MT state
    try:
        yield
    finally:
        generator.set_state(state)
        random.setstate(states[0])
        np.random.set_state(states[1])
