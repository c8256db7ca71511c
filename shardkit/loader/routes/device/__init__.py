"""What both GPU routes share: the payload a worker ships (:mod:`~shardkit.loader.routes.device.payload`),
the pinned host slots it is staged in (:mod:`~shardkit.loader.routes.device.pinned`), the device stages
that decode JPEGs with nvJPEG and transform them (:mod:`~shardkit.loader.routes.device.stages`), the
threads that run them ahead of the training loop (:mod:`~shardkit.loader.routes.device.prefetch`), and
the options (:class:`~shardkit.loader.routes.device.options.GpuOptions`).
"""
