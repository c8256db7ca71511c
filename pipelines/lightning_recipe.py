"""ShardLoader under PyTorch Lightning DDP, built before ``trainer.fit`` (docs/guides/lightning.md).

The loader is made before the process group exists (Lightning starts it inside ``fit`` and
launches the other ranks with ``WORLD_SIZE`` and ``LOCAL_RANK`` but no ``RANK``); it takes its
rank and world when its first iteration starts, so each rank trains on its own share::

    python pipelines/lightning_recipe.py shards/train keys/

Each rank writes ``keys/rank<r>.txt``: the sample keys it trained on, one a line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import lightning as L
import torch

from shardkit import ShardLoader, transforms


class Classifier(L.LightningModule):
    """A linear classifier that records the keys of the samples it trains on."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2))
        self.out, self.keys = out, list[str]()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels, keys = batch
        self.keys += keys
        return torch.nn.functional.cross_entropy(self.head(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self) -> None:
        (self.out / f"rank{self.global_rank}.txt").write_text("".join(f"{k}\n" for k in self.keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("train")
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    loader = ShardLoader(args.train, batch_size=args.batch_size, keys=True,  # before fit: no process group yet
                         transform=transforms.imagenet_val(32, crop_fraction=1.0, normalize=True))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(args.out), train_dataloaders=loader)


if __name__ == "__main__":
    main()
