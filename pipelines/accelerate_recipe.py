"""ShardLoader under HF accelerate: gradient accumulation that steps at each epoch's end, and an
evaluation that gathers per batch and counts every sample once (docs/guides/accelerate.md).

Run under ``accelerate launch`` (on GPUs) or ``torchrun --nproc_per_node 2`` (on GPUs or the
CPU; ``accelerate launch --cpu --num_processes 2`` starts one process, without a word)::

    torchrun --nproc_per_node 2 pipelines/accelerate_recipe.py shards/train shards/val result.json

Rank 0 writes ``result.json``: per epoch the batch indices at which gradients were synchronised
(the optimizer stepped), and the evaluation's totals (samples, and samples per class).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch
from accelerate import Accelerator

from shardkit import ShardkitError, ShardLoader, transforms

try:  # run as a script: its directory is on the path
    from recipe_args import at_least
except ImportError:  # imported as pipelines.accelerate_recipe
    from pipelines.recipe_args import at_least

TRANSFORM = transforms.imagenet_val(32, crop_fraction=1.0, normalize=True)  # float batches of 32x32


def train(accelerator: Accelerator, dataset: str, *, epochs: int, batch_size: int) -> list[list[int]]:
    """Train a tiny classifier with accumulation; return, per epoch, the batches it stepped at."""
    loader = ShardLoader(dataset, batch_size=batch_size, transform=TRANSFORM)
    if not loader.classes:
        raise ShardkitError("not a dataset of labelled images (it names no classes)", where=dataset)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(len(loader.classes)))
    model(torch.zeros(1, 3, 32, 32))  # materialise the lazy layer before DDP wraps it
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # the loader comes back as it is
    stepped: list[list[int]] = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        stepped.append([])
        for i, (images, labels) in enumerate(loader):
            with accelerator.accumulate(model):  # steps every 4 batches and at the epoch's last one
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                if accelerator.sync_gradients:
                    stepped[-1].append(i)
    return stepped


def evaluate_per_batch(accelerator: Accelerator, dataset: str, *, batch_size: int) -> dict[str, Any]:
    """``even_batches=True`` (equal batches on every rank, the last ones padded): gather per batch
    with ``gather_for_metrics`` and keep each rank's real samples."""
    loader = ShardLoader(dataset, batch_size=batch_size, transform=TRANSFORM,
                         shuffle=False)
    classes = len(loader.classes or ())
    total, per_class = torch.zeros((), dtype=torch.int64), torch.zeros(classes, dtype=torch.int64)
    for _images, labels in loader:
        real = torch.arange(len(labels)) < loader.real_samples()  # padding: the batch's end, if any
        labels, real = accelerator.gather_for_metrics((labels, real))
        total += real.sum()
        per_class += torch.bincount(labels[real], minlength=classes)
    return {"total": int(total), "per_class": per_class.tolist()}


def evaluate_once(accelerator: Accelerator, dataset: str, *, batch_size: int) -> dict[str, Any]:
    """``even_batches=False`` (every sample once, ranks' batch counts may differ by one): sum on
    each rank and reduce once after the loop, so every rank makes the same collective calls."""
    loader = ShardLoader(dataset, batch_size=batch_size, transform=TRANSFORM,
                         shuffle=False, even_batches=False)
    classes = len(loader.classes or ())
    counts = torch.zeros(1 + classes, dtype=torch.int64)  # total, then one count per class
    with torch.no_grad():  # an evaluation: nothing here calls backward, nor a collective per batch
        for _images, labels in loader:
            counts[0] += len(labels)
            counts[1:] += torch.bincount(labels, minlength=classes)
    counts = accelerator.reduce(counts, reduction="sum")
    return {"total": int(counts[0]), "per_class": counts[1:].tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train", help="packed ImageFolder dataset to train on (directory, index.json or URL)")
    parser.add_argument("val", help="packed ImageFolder dataset to evaluate on")
    parser.add_argument("result", help="JSON file the result is written to")
    parser.add_argument("--batch-size", type=at_least(1), default=4, help="samples per batch per rank [default: 4]")
    args = parser.parse_args()
    folder = os.path.dirname(os.path.abspath(args.result))
    if not os.path.isdir(folder):  # said before training, not after it
        parser.error(f"{args.result}: no folder {folder} to write it in")
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    try:
        result = {
            "stepped": train(accelerator, args.train, epochs=2, batch_size=args.batch_size),
            "per_batch": evaluate_per_batch(accelerator, args.val, batch_size=args.batch_size),
            "once": evaluate_once(accelerator, args.val, batch_size=args.batch_size),
            "world": accelerator.num_processes,
        }
    except ShardkitError as err:  # not there, not a dataset, not images with labels
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    if accelerator.is_main_process:
        with open(args.result, "w") as f:
            json.dump(result, f)
    accelerator.end_training()
    if accelerator.num_processes > 1:
        # Once DDP has used it, torch's gloo backend keeps its worker threads past
        # destroy_process_group(), and one can still be releasing the last collective's tensors
        # as this rank ends; a thread asking for the GIL while the interpreter finalises aborts
        # the process ("terminate called without an active exception"). Leave without
        # finalising: the result is written and nothing else runs at exit here.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
