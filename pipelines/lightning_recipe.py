"""ShardLoader under PyTorch Lightning DDP, built before ``trainer.fit`` (docs/guides/lightning.md).

The loader is made before the process group exists (Lightning starts it inside ``fit`` and
launches the other ranks with ``WORLD_SIZE`` and ``LOCAL_RANK`` but no ``RANK``); it takes its
rank and world when its first iteration starts, so each rank trains on its own share. Validation
counts each sample once: its loader pads the last ranks' last batches (equal batches per rank)
and ``real_samples(batch_idx)`` says how many of a batch are real::

    python pipelines/lightning_recipe.py shards/train shards/val out/

Each rank writes ``out/rank<r>.txt``: the sample keys it trained on, one a line; rank 0 writes
``out/val_total.txt``: the samples validation counted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch

from shardkit import ShardkitError, ShardLoader, transforms

try:  # run as a script: its directory is on the path
    from recipe_args import at_least
except ImportError:  # imported as pipelines.lightning_recipe
    from pipelines.recipe_args import at_least


class Classifier(L.LightningModule):
    """A linear classifier that records the keys of the samples it trains on."""

    def __init__(self, out: Path, val: ShardLoader, classes: int) -> None:
        super().__init__()
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, classes))
        self.out, self.val, self.keys = out, val, list[str]()
        self.counts = torch.zeros(2, dtype=torch.int64)  # correct, total: real samples only

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels, keys = batch
        self.keys += keys
        return torch.nn.functional.cross_entropy(self.head(images), labels)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels, _keys = batch
        real = self.val.real_samples(batch_idx)  # Lightning has fetched the next batch already
        self.counts[0] += (self.head(images).argmax(1) == labels)[:real].sum()
        self.counts[1] += real

    def on_validation_epoch_end(self) -> None:
        counts = cast(torch.Tensor, self.all_gather(self.counts)).sum(0)  # one collective per rank, after the loop
        self.log("val_total", counts[1].float(), rank_zero_only=True)
        if self.global_rank == 0:
            (self.out / "val_total.txt").write_text(f"{int(counts[1])}\n")
        self.counts.zero_()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self) -> None:
        (self.out / f"rank{self.global_rank}.txt").write_text("".join(f"{k}\n" for k in self.keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train", help="packed ImageFolder dataset to train on (directory, index.json or URL)")
    parser.add_argument("val", help="packed ImageFolder dataset to validate on")
    parser.add_argument("out", type=Path, help="folder for rank<r>.txt and val_total.txt (made if missing)")
    parser.add_argument("--batch-size", type=at_least(1), default=4, help="samples per batch per rank [default: 4]")
    args = parser.parse_args()
    transform = transforms.imagenet_val(32, crop_fraction=1.0, normalize=True)
    try:
        loader = ShardLoader(args.train, batch_size=args.batch_size, keys=True,  # before fit: no process group yet
                             transform=transform)
        val = ShardLoader(args.val, batch_size=args.batch_size, keys=True, transform=transform, shuffle=False)
    except ShardkitError as err:  # not there, not a dataset, not images with labels
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    if not loader.classes:
        parser.exit(2, f"{parser.prog}: error: {args.train}: not a dataset of labelled images (it names no classes)\n")
    try:
        args.out.mkdir(parents=True, exist_ok=True)  # before training, not after it
    except OSError as err:
        parser.exit(2, f"{parser.prog}: error: {args.out}: cannot make this folder ({err.strerror})\n")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(Classifier(args.out, val, len(loader.classes)), train_dataloaders=loader, val_dataloaders=val)


if __name__ == "__main__":
    main()
