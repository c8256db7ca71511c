"""The training step ``shardkit bench --train`` feeds with a classifier (:mod:`shardkit.bench.train`
measures it): a torchvision model, ``channels_last``, bf16 autocast, SGD with momentum,
``torch.compile``; and :func:`synchronize`, which every step's timing uses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["TrainStep", "synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TrainStep:
    """One SGD step of a torchvision classifier in bf16 autocast, ``channels_last``.

    uint8 batches are normalised (ImageNet mean/std) inside the step; float batches are taken
    as they come (already normalised by the loader). On the CPU (tests) the step runs in float32:
    bf16 convolutions there are emulated and slow.
    """

    def __init__(self, model: str, num_classes: int, device: torch.device, *, compile: bool = True) -> None:
        import torchvision

        net = getattr(torchvision.models, model)(num_classes=num_classes)
        net = net.to(device, memory_format=torch.channels_last)
        self.device = device
        self.opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        self.net: Callable[[torch.Tensor], torch.Tensor] = torch.compile(net) if compile else net
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.dtype == torch.uint8:
            images = ((images.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        elif self.device.type != "cuda":
            images = images.float()
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(self.net(images), labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels, *_ = batch
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def clone(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch[0].clone(), batch[1].clone()

    def sync(self) -> None:
        synchronize(self.device)
