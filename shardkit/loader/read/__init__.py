"""Reading samples out of shards: the datasets a loader opens, shard files (local or cached from a
bucket), one sample's members, and what happens to a bad one.

:mod:`~shardkit.loader.read.datasets` (one dataset or a mix), :mod:`~shardkit.loader.read.reader`
(shard files and byte ranges), :mod:`~shardkit.loader.read.claims` (what a dataset claims,
checked before it is trusted), :mod:`~shardkit.loader.read.cache` (remote shards on local disk),
:mod:`~shardkit.loader.read.samples` (a sample's image and label, decoded for a transform) and
:mod:`~shardkit.loader.read.bad_samples` (the ``on_error`` policy).
"""
