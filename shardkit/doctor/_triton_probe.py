"""A tiny Triton kernel, compiled and run by ``shardkit doctor`` (imported only when CUDA is present)."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _add_one(src, dst, n, BLOCK: tl.constexpr):  # untyped: Triton reads annotations itself
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n) + 1, mask=i < n)


def probe(torch: Any) -> None:
    """Compile and run the kernel on 100 floats; raise ``RuntimeError`` if the result is wrong."""
    src = torch.arange(100, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    _add_one[(1,)](src, dst, 100, BLOCK=128)
    torch.cuda.synchronize()
    if not torch.equal(dst, src + 1):
        raise RuntimeError("the test kernel computed wrong values")
