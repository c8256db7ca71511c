"""Running an epoch: the batch stream each worker runs (:mod:`~shardkit.loader.run.stream`), the
worker processes (:mod:`~shardkit.loader.run.workers`), naming a worker that died
(:mod:`~shardkit.loader.run.deaths`) and one epoch's delivery through a route, kept across epochs
with read-ahead (:mod:`~shardkit.loader.run.epoch_run`), and what ``iter(loader)`` returns
(:mod:`~shardkit.loader.run.iteration`).
"""
