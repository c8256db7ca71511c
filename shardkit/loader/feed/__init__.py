"""Feeder processes: a route's host half run in processes of its own, handing batches to the
training process through shared device memory.

:mod:`~shardkit.loader.feed.supply` decides, epoch by epoch, where a loader's route runs (here or
in feeders) and switches between the two;
:mod:`~shardkit.loader.feed.pool` is the training process's side (start, hand over, stop),
:mod:`~shardkit.loader.feed.process` a feeder's side, :mod:`~shardkit.loader.feed.layout` which
worker and batch belong to which feeder, :mod:`~shardkit.loader.feed.labels` what a slot holds
beside the images (labels, or a captioned batch's token ids), :mod:`~shardkit.loader.feed.logs`
their log records relayed, :mod:`~shardkit.loader.feed.ready` whether their forkserver can fork
them yet, :mod:`~shardkit.loader.feed.cuda_sync` how they wait for the device,
:mod:`~shardkit.loader.feed.trial` whether ``feeders="auto"`` keeps them (the loop timed both ways).
"""
