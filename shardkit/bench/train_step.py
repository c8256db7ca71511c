"""The training step ``shardkit bench --train`` feeds with a classifier (:mod:`shardkit.bench.train`
measures it): a torchvision model, ``channels_last``, bf16 autocast, SGD with momentum,
``torch.compile``; and :func:`synchronize`, which every step's timing uses.

The step is a plain compiled loop as a careful user writes one: normalisation (of uint8
batches), the forward pass and the loss are one compiled function, so its backward is one
compiled graph too; the optimiser is ``torch.optim.SGD(fused=True)`` on CUDA, one multi-tensor
kernel for every parameter rather than a few foreach launches per parameter group; gradients are
dropped (``set_to_none``), not zeroed. Nothing in it waits for the device: a ResNet-18 step at
batch 128 issues its kernels faster than the GPU runs them only if the host work per step is
small, so every launch saved is a step's wall time saved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["TrainStep", "sgd", "synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sgd(params: Iterable[torch.nn.Parameter], device: torch.device, *, lr: float = 0.01,
        momentum: float = 0.9) -> torch.optim.SGD:
    """SGD with momentum, fused (one kernel for all parameters) on CUDA where this torch has
    the fused kernel; the default implementation elsewhere.

    Example:
        >>> opt = sgd(torch.nn.Linear(2, 2).parameters(), torch.device("cpu"))
        >>> opt.defaults["momentum"], bool(opt.defaults.get("fused"))
        (0.9, False)
    """
    params = list(params)
    if device.type == "cuda":
        try:
            return torch.optim.SGD(params, lr=lr, momentum=momentum, fused=True)
        except (TypeError, RuntimeError, ValueError):  # a torch without fused SGD for this device
            pass
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


class TrainStep:
    """One SGD step of a torchvision classifier in bf16 autocast, ``channels_last``.

    uint8 batches are normalised (ImageNet mean/std) inside the compiled function; float batches
    are taken as they come (already normalised by the loader). On the CPU (tests) the step runs
    in float32: bf16 convolutions there are emulated and slow. ``compile_mode``: ``torch.compile``'s
    ``mode`` (None: its default; ``"reduce-overhead"`` replays the step's kernels as CUDA graphs).
    """

    def __init__(self, model: str, num_classes: int, device: torch.device, *, compile: bool = True,
                 compile_mode: str | None = None) -> None:
        import torchvision

        net = getattr(torchvision.models, model)(num_classes=num_classes)
        net = net.to(device, memory_format=torch.channels_last)
        self.device = device
        self.opt = sgd(net.parameters(), device)
        cuda = device.type == "cuda"
        mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

        def loss_of(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            if images.dtype == torch.uint8:
                images = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
            elif not cuda:
                images = images.float()
            with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
                return torch.nn.functional.cross_entropy(net(images), labels)

        self.net = net
        self.loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = (
            torch.compile(loss_of, mode=compile_mode) if compile else loss_of)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.loss(images, labels).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels, *_ = batch
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def clone(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch[0].clone(), batch[1].clone()

    def sync(self) -> None:
        synchronize(self.device)
