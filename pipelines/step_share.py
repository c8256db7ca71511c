"""The fed-step share of a training run: what the loader lets the training step reach.

``shardkit bench --train`` defines it: the images/s of the step fed by the loader over the
images/s of the same step on a batch already on the device (*synthetic*). A recipe measures it
on itself with ``--share-steps N``: the rate of its last ``N`` training steps, then, after its
final checkpoint (so nothing saved sees them), ``N`` more steps on its last batch. Each step's
time is taken after its ``loss.item()``, which waits for the device, so both rates count the
same work (and whatever else the loop does meanwhile, a checkpoint too). Under torchrun every
rank runs the synthetic steps (DDP's all-reduce needs them all).

Built only on torch, like the recipes that use it.
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

try:  # run as a script: its directory is on the path
    from recipe_args import at_least
except ImportError:  # imported as pipelines.step_share
    from pipelines.recipe_args import at_least

__all__ = ["StepClock", "add_share_argument", "clone_batch", "describe_share", "measure_share", "report_share"]


def add_share_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--share-steps", type=at_least(0), default=0, metavar="N",
                        help="after training, report the fed-step share: the images/s of the last N steps over "
                             "that of N steps on the last batch, already on the device (0: off)")


class StepClock:
    """Times of the last ``steps + 1`` training steps, and the last step's batch; :meth:`tick`
    after each step's ``loss.item()``.

    Example:
        >>> clock = StepClock(2)
        >>> clock.rate(8) is None  # fewer than 3 ticks yet
        True
    """

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.times: deque[float] = deque(maxlen=steps + 1)
        self.last: Any = None

    def tick(self, batch: Any = None) -> None:
        """A step ended; ``batch``: what it trained on (kept for :func:`report_share`)."""
        self.times.append(time.perf_counter())
        self.last = batch

    def rate(self, images_per_step: int) -> float | None:
        """Images/s over the last ``steps`` steps (None before there were that many)."""
        if self.times.maxlen is None or len(self.times) < self.times.maxlen:
            return None
        return (len(self.times) - 1) * images_per_step / (self.times[-1] - self.times[0])


def clone_batch(batch: Any) -> Any:
    """A deep copy of a batch's tensors (lists, tuples and dicts of them): the synthetic steps'
    fixed batch must not share a buffer the loader reuses."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, (list, tuple)):
        return type(batch)(clone_batch(x) for x in batch)
    if isinstance(batch, dict):
        return {k: clone_batch(v) for k, v in batch.items()}
    return batch


def measure_share(step: Callable[[], float], clock: StepClock, images_per_step: int) -> dict[str, float] | None:
    """Run ``step`` (one training step on the fixed batch, returning ``loss.item()``) as many times
    as ``clock`` holds steps; the fed and synthetic rates and their ratio, or None when the run
    had fewer steps than that."""
    fed = clock.rate(images_per_step)
    if fed is None:
        return None
    synthetic = StepClock(len(clock.times) - 1)
    synthetic.tick()
    for _ in range(len(clock.times) - 1):
        step()
        synthetic.tick()
    rate = synthetic.rate(images_per_step)
    assert rate is not None
    return {"fed_images_per_second": fed, "synthetic_images_per_second": rate, "share": fed / rate}


def describe_share(share: dict[str, float] | None, steps: int) -> str:
    """The line a recipe prints."""
    counted = f"{steps} step{'s' if steps != 1 else ''}"
    if share is None:
        return f"fed-step share: not measured (the run had fewer than {counted})"
    return (f"fed-step share {share['share']:.0%}: {share['fed_images_per_second']:.1f} images/s over the last "
            f"{counted} fed by the loader, {share['synthetic_images_per_second']:.1f} on one batch already "
            f"on the device")


def report_share(step: Callable[..., float], clock: StepClock, images_per_step: int, *,
                 show: bool) -> dict[str, float] | None:
    """What ``--share-steps`` does after the last checkpoint: :func:`measure_share` with ``step``
    on a copy of the clock's last batch, the line printed when ``show`` (rank 0)."""
    fixed = clone_batch(clock.last)
    share = measure_share(lambda: step(*fixed), clock, images_per_step)
    if show:
        print(describe_share(share, clock.steps), flush=True)
    return share



if __name__ == "__main__":  # a part of the recipes, not one of them
    raise SystemExit("pipelines/step_share.py is a module the training recipes import, not a recipe to run: "
                     "see docs/guides/recipes.md (pipelines/train_classifier.py --help, ...)")
