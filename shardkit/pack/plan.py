"""Planning: assign samples to shards. Pure and deterministic, so output never depends on
workers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.format.spec import shard_name

#: Tar bytes a sample costs beyond its image: three headers, small cls/json members, padding.
SAMPLE_OVERHEAD = 4 * 512


@dataclass(frozen=True)
class ShardPlan:
    """Shard number ``index`` (file ``name``) holds the source samples ``members``, in order."""

    index: int
    name: str
    members: tuple[int, ...]


def sample_order(num_samples: int, *, shuffle: bool, seed: int) -> list[int]:
    """Source indices in packing order: identity, or a permutation seeded by ``seed``."""
    if not shuffle:
        return list(range(num_samples))
    import numpy as np  # here, not at the top: pack worker processes import this module too

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x5AC4])))
    return rng.permutation(num_samples).tolist()


def plan_shards(
    sizes: Sequence[int], *, max_count: int, max_size: int, shuffle: bool, seed: int, prefix: str
) -> list[ShardPlan]:
    """Cut the (optionally shuffled) samples into shards of at most ``max_count`` samples and
    about ``max_size`` bytes (estimated from ``sizes``, the input file sizes).

    >>> [p.members for p in plan_shards([10, 10, 10], max_count=2, max_size=10**9,
    ...                                  shuffle=False, seed=0, prefix="s")]
    [(0, 1), (2,)]
    """
    plans: list[ShardPlan] = []
    current: list[int] = []
    current_bytes = 0
    for i in sample_order(len(sizes), shuffle=shuffle, seed=seed):
        cost = max(sizes[i], 0) + SAMPLE_OVERHEAD
        if current and (len(current) >= max_count or current_bytes + cost > max_size):
            plans.append(ShardPlan(len(plans), shard_name(prefix, len(plans)), tuple(current)))
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += cost
    if current:
        plans.append(ShardPlan(len(plans), shard_name(prefix, len(plans)), tuple(current)))
    return plans
