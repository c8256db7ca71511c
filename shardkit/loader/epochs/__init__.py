"""The epoch plan: which samples each rank and worker gets, in which order, and how to resume.

Pure arithmetic on the shard sizes, no torch and no I/O: :mod:`~shardkit.loader.epochs.plan`
(an epoch's order and a rank's batches), :mod:`~shardkit.loader.epochs.seeds` (per-sample
augmentation seeds), :mod:`~shardkit.loader.epochs.mix` (several datasets by weight),
:mod:`~shardkit.loader.epochs.remainder` (what an elastic resume has left),
:mod:`~shardkit.loader.epochs.state` (the resume state) and :mod:`~shardkit.loader.epochs.config`
(:class:`~shardkit.loader.epochs.config.PlanConfig`, the plan of one rank).
"""
