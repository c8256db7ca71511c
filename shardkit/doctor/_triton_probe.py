"""A tiny Triton kernel, compiled and run by ``shardkit doctor`` (called only when CUDA is present).

Triton is imported inside :func:`probe`, not at module level, so this module imports (and its
doctests are collected) on machines without Triton; ``probe`` then raises ``ImportError``.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def _add_one(src, dst, n, BLOCK: tl.constexpr):  # untyped: Triton reads annotations itself
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + i, tl.load(src + i, mask=i < n) + 1, mask=i < n)

    return _add_one


def probe(torch: Any) -> None:
    """Compile and run the kernel on 100 floats; raise ``RuntimeError`` if the result is wrong
    (``ImportError`` without Triton)."""
    add_one = _kernel()
    src = torch.arange(100, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    add_one[(1,)](src, dst, 100, BLOCK=128)
    torch.cuda.synchronize()
    if not torch.equal(dst, src + 1):
        raise RuntimeError("the test kernel computed wrong values")
