"""``ShardLoader``: what a user iterates in place of ``DataLoader(ImageFolder(...))``."""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Unpack

import torch

from shardkit.codec.backend import preferred_decoder
from shardkit.errors import LoaderError
from shardkit.loader.arguments import (
    as_device,
    as_flags,
    as_int,
    caption_targets,
    check_arguments,
    check_service,
    feeder_count,
    plain_int,
    say_if_no_batch,
    worker_count,
)
from shardkit.loader.epochs.config import PlanConfig
from shardkit.loader.epochs.position import Position
from shardkit.loader.epochs.state import MAX_INT
from shardkit.loader.feed.layout import feeder_workers
from shardkit.loader.feed.pool import FeederPool, FeederSpec
from shardkit.loader.feed.supply import Batches, Supply
from shardkit.loader.feed.trial import PaceTrial
from shardkit.loader.frameworks import (
    NO_DATASET,
    NOT_A_DATASET,
    EpochBatches,
    EpochSampler,
    check_accelerate_world,
    epoch_sampler,
    say_if_uneven,
    seen_by_accelerate,
)
from shardkit.loader.habits import DataLoaderArgs, check_call, check_dataloader_args, init_signature
from shardkit.loader.read.cache import DEFAULT_CACHE_BYTES, default_cache_dir
from shardkit.loader.read.captions import TextTransform
from shardkit.loader.read.datasets import open_datasets
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.base import Route
from shardkit.loader.routes.choose import choose_route
from shardkit.loader.routes.cpu.worker import CpuBatchBuilder
from shardkit.loader.routes.device.options import GpuOptions
from shardkit.loader.routes.spec import RouteSpec
from shardkit.loader.run.epoch_run import Delivery
from shardkit.loader.run.iteration import Iteration
from shardkit.loader.run.stream import BatchStream
from shardkit.loader.run.workers import rank_and_world, worker_death
from shardkit.loader.service.client import ServiceClient, dataset_checks
from shardkit.loader.service.options import RayService
from shardkit.loader.stats import StageStats
from shardkit.transforms.base import ImageTransform

log = logging.getLogger("shardkit.loader")


class _PoolMaker:
    """``loader._feeder_pool`` for its :class:`Supply`, holding the loader only weakly: a bound
    method would make a cycle, and a loader dropped without ``close()`` would then keep its
    worker processes until Python's cycle collector ran (a DataLoader's stop at once). Pickles
    as a reference to the loader, as the bound method did."""

    def __init__(self, loader: ShardLoader) -> None:
        self._loader = weakref.ref(loader)

    def __reduce__(self) -> tuple[type[_PoolMaker], tuple[ShardLoader | None]]:
        return _PoolMaker, (self._loader(),)

    def __call__(self, parts: int) -> FeederPool:
        owner = self._loader()
        if owner is None:
            raise LoaderError("the loader these feeders were for is gone")
        return owner._feeder_pool(parts)


class ShardLoader:
    """Stream a packed dataset, or a weighted mix of several, as batches, with exact epochs over
    ranks and workers.

    Args:
        dataset: a packed dataset: directory, ``index.json`` path or fsspec URL; or a list of
            them, mixed (see *Mixing* below).
        batch_size: samples per batch (per rank).
        transform: an :class:`~shardkit.transforms.ImageTransform` such as
            ``transforms.imagenet_train(224)`` (images come as one uint8 ``[B,3,H,W]`` tensor,
            finalised on ``device``), any callable on uint8 ``[3,H,W]`` tensors (a batch of
            tensors, or of numpy arrays, of one shape is one stacked tensor; numbers, and tuples,
            lists and dicts of these, are joined as ``default_collate`` joins them; else a list), or
            ``None`` (a list of decoded images). COCO datasets: a detection transform
            (``transforms.detection_train(...)``/``detection_val(...)``) or ``None``; batches
            are ``(images, targets)``, see :mod:`shardkit.loader.routes.coco`.
        num_workers: worker processes (persistent across epochs); 0 reads in this process;
            ``"auto"``: this process's share of the host's cores less one for the training loop,
            1 to 32 (:func:`shardkit.machine.auto_workers`); ``loader.num_workers`` says how many.
        device: where batches are delivered (``"cpu"`` or ``"cuda[:i]"``).
        shuffle, seed: epoch order is a pure function of ``(seed, epoch, manifest)``. ``shuffle``
            defaults to True (``DataLoader``'s to False): pass False for evaluation. Unshuffled, the
            order is the shards' own, which ``shardkit pack`` shuffles unless ``--no-shuffle``.
        drop_last: True: every sample at most once per epoch; False: at least once. At one rank
            (``world_size=1``) the last batch is then short, as with ``DataLoader``; over several
            ranks with ``even_batches=True`` it is padded with repeats of the epoch's first
            samples, so every rank steps the same number of full batches.
        even_batches: False (evaluation): every sample exactly once over all ranks, the last
            batch short, no padding; ranks' ``len`` may differ by one batch (reduce metrics as
            sums, e.g. ``all_reduce`` of correct and total). True: equal full batches per rank.
        rank, world_size: default from ``torch.distributed`` when initialised, else from the
            launcher's ``RANK``/``WORLD_SIZE`` (or ``LOCAL_RANK`` where it sets no ``RANK``), else 0
            and 1 -- read again when the first iteration starts, so a loader built before
            ``init_process_group`` (e.g. before Lightning's ``trainer.fit``) reads its rank's share.
            A world that changes after iteration began is an error naming both.
        keys: also yield each batch's list of sample keys.
        window: shards mixed by the within-window shuffle (bounds memory and open files).
        on_error: ``"replace"`` corrupt samples (counted in :attr:`stats`) or ``"raise"``.
        prefetch: batches each worker prepares ahead.
        cache_dir: local cache for shards of a remote dataset, shared by the node's processes
            (files named by content hash, so re-packing a URL never serves stale bytes; each
            process hashes a cached shard before its first use). Default: the user's own
            ``$XDG_CACHE_HOME/shardkit`` (``~/.cache/shardkit``), created ``0700``.
        cache_bytes: the cache's budget; least recently used shards beyond it are deleted
            (default 20 GB; see :class:`~shardkit.loader.read.cache.ShardCache`).
        storage_options: fsspec options for a remote dataset.
        verify_hashes: hash each local shard the first time a process opens it and refuse one
            that differs from its ``sha256`` in ``index.json`` (shards of a remote dataset are
            always checked as they are fetched into the cache; ``shardkit verify`` checks all).
        gpu: options of the GPU route (:class:`~shardkit.loader.routes.gpu.GpuOptions`: Triton kernel or
            eager resize, device prefetch depth, decode threads).
        contiguous_labels: COCO only: labels 1..K in category-id order (0: background) instead
            of the category ids; the mapping is :attr:`label_map`.
        masks: COCO only: targets also hold ``masks`` uint8 ``[N,H,W]`` (needs pycocotools).
        pad: COCO only: images as one zero-padded :class:`~shardkit.loader.routes.coco.PaddedImages`
            ``(images, sizes)`` instead of a list (an int: sides rounded up to its multiple).
        weights: a mix's weights, one positive number per dataset (None: proportional to the
            datasets' sizes, i.e. plain concatenation).
        disjoint_labels: a mix of ImageFolder datasets with different class lists: dataset
            ``i``'s labels are offset by the class counts of the datasets before it, and
            :attr:`classes` is the lists one after another.
        feeders: processes that run the route's host half (decode, augment) outside this one
            and hand batches over through shared device memory (:mod:`~shardkit.loader.feed.pool`),
            sharing the ``num_workers`` workers: the training loop keeps its interpreter (its GIL)
            to itself. ``"auto"``: on the GPU route one per 5 workers (1 to 4), elsewhere 0, and
            the first batches come from this process while they start (launched from the
            loader's second batch once their forkserver is ready: :meth:`wait_for_feeders`); once
            up, they and this process deliver phases of 32 batches in turn while the loop is
            timed, and the faster stays, the feeders only if their time per batch is 15% shorter
            (:mod:`~shardkit.loader.feed.trial`; :attr:`feeders` becomes 0 if that is this
            process, logged at info level);
            a number: started before the first batch. 0: this process. Same batches, order and
            state either way. Needed: an
            :class:`~shardkit.transforms.ImageTransform`, ``num_workers >= feeders``, and an
            ImageFolder dataset or a captioned one whose ``text_transform`` returns one tensor of
            fixed shape and dtype (token ids: :mod:`~shardkit.loader.feed.labels`); else ``"auto"``
            runs none and a number is refused, naming why. The number taken is :attr:`feeders`.
            Which is faster depends on the step and the machine (docs/concepts/feeders.md).
        text_transform: captioned datasets only: called in the workers with each batch's captions
            (a list of str), e.g. a tokenizer; its result is the batch's text (tensors in it, or in
            a dict of it, are moved to ``device``). None: the captions as a list of str.
        fields: captioned datasets only: names of ``json`` fields to deliver too (``"url"``,
            ``"similarity"``, ...); the batch's text is then a dict, the captions (or what
            ``text_transform`` made of them) under ``"text"`` and a list of values per field
            (``None`` where a sample's ``json`` lacks it).
        read_ahead: the workers (and the route's host pipeline) go on into the next epoch while
            this one ends, so an epoch does not start from empty; an iteration that asks for the
            next epoch from its start (the usual loop) takes over what they prepared, any other
            drops it. Same batches either way; False: workers stop at each epoch's end.
        service: a :class:`~shardkit.loader.service.RayService`: the workers that read, decode and
            augment run as Ray actors on a cluster's CPU nodes and stream batches (uint8, as the CPU
            route builds them) to this process, which keeps the epoch plan, ranks, resume state and
            order: the same batches, order and augmentation as local workers. A worker or node lost
            mid-epoch has its outstanding batches built again elsewhere. ImageFolder and captioned
            datasets; ``num_workers`` stays 0 (the service's ``workers`` count), no feeders; on a
            CUDA ``device`` batches are copied there and finalised (the GPU route is not served).
            :attr:`service` is the running service (its workers, batches per node). See
            docs/guides/service.md.
        dataloader_args: DataLoader's own arguments, taken where a DataLoader would do with them
            what this loader does anyway, so that a DataLoader call converts by its name:
            ``persistent_workers`` (either: the workers persist), ``pin_memory=False`` (True with
            a CUDA ``device``: batches arrive through pinned memory), ``collate_fn``, ``sampler``,
            ``batch_sampler``, ``generator``, ``worker_init_fn`` and ``multiprocessing_context``
            at None, ``timeout=0``, ``in_order=True``, ``prefetch_factor`` None or ``prefetch``'s
            value. Any other value is refused (``TypeError``) with what to write instead
            (:class:`~shardkit.loader.habits.DataLoaderArgs`).

    Mixing (:mod:`shardkit.loader.epochs.mix`): an epoch has ``L`` samples, the datasets' total, of which
    dataset ``i`` supplies ``L * w_i / sum(w)`` (largest-remainder rounding, so they sum to ``L``):
    whole passes over it plus a turn of its samples that moves on each epoch, so a dataset given
    less than its size shows every sample once every ``ceil(N_i / quota)`` epochs and never one
    twice in an epoch. The slices of all datasets are shuffled together as shards are, so ranks,
    workers, ``drop_last``, exact and elastic resume work as for one dataset. The datasets must be
    of one kind, with equal class lists (ImageFolder, unless ``disjoint_labels``) or categories
    (COCO); labels are as packed.

    Captioned datasets (``kind`` ``"captions"``: packed image-text pairs, or img2dataset shards
    indexed in place) yield ``(images, texts)``: images as for ImageFolder (the same route: CPU,
    or GPU on a CUDA ``device`` with an ``ImageTransform``), ``texts`` the batch's captions (see
    ``text_transform`` and ``fields``). Epochs, resume, elastic resume, mixing, ``even_batches``
    and feeders (see ``feeders``) work as for labelled images.

    Routes (chosen once, :func:`~shardkit.loader.routes.choose.choose_route`): a COCO dataset takes the
    COCO route (:mod:`shardkit.loader.routes.coco`), or on a CUDA ``device`` with a one-window detection
    transform the COCO GPU route (:mod:`shardkit.loader.routes.coco_gpu`: nvJPEG decode and one ragged
    crop-resize-flip launch); a CUDA ``device`` with an :class:`ImageTransform`
    takes the GPU route (:mod:`shardkit.loader.routes.gpu`): workers ship JPEG bytes and crop boxes
    (drawn as on the CPU route: same crops and flips per sample), and the main process decodes
    each batch with nvJPEG and crops, resizes and flips it in one launch, overlapping the
    training step. Images nvJPEG cannot take are decoded on the CPU and joined to the batch.
    Without CUDA or nvJPEG, one warning is logged and the CPU route (:mod:`shardkit.loader.routes.cpu`)
    is used (delivering on the CPU when CUDA is missing altogether).

    Counts: ``len(loader)`` is this rank's batches in an epoch and :attr:`remaining` those still to
    come; the samples are ``loader.manifest.num_samples`` (for a mix, all datasets' together), what
    ``len(loader.dataset)`` gives with a DataLoader: a ShardLoader has no ``dataset``.

    One iteration runs at a time: an iteration begins at its first ``next()`` and ends an older
    one, whose next ``next()`` raises a :class:`LoaderError` saying so (``zip(loader, loader)`` is
    refused that way). An iteration that an error ended (a transform's, a Ctrl-C) raises a
    :class:`LoaderError` saying so at its next ``next()``, where a ``DataLoader``'s iterator goes
    on: ``iter(loader)`` begins another.

    Errors raised in worker processes reach the caller with their type, message and ``where``.
    A worker process that dies (e.g. killed by the out-of-memory killer) ends the iteration with
    a :class:`LoaderError` naming its pid and signal (torch's error as ``__cause__``).
    :meth:`close` (or leaving a ``with`` block) stops the workers and closes open shards.
    A loader pickles and deep-copies at any time (a launcher that spawns its processes copies
    it): the copy starts worker and feeder processes of its own when it first iterates, from the
    epoch after one the original had open; the original's go on.

    Example::

        with ShardLoader("shards/train", batch_size=256, transform=transforms.imagenet_train(224),
                         num_workers=8) as loader:
            for epoch in range(90):
                loader.set_epoch(epoch)
                for images, labels in loader:
                    ...
            state = loader.state_dict()  # tiny, JSON-able; load_state_dict() resumes exactly
    """

    _end_of_dataloader = False
    #: What accelerate's ``gather_for_metrics`` would cut from the last gathered batch: nothing
    #: (padding sits in the last ranks' last batches; drop it per batch with :meth:`real_samples`).
    remainder: int = 0

    def __new__(cls, *args: Any, **kwargs: Any) -> ShardLoader:
        if args or kwargs:  # a call, not an unpickling: DataLoader habits get a hint (check_call)
            check_call(cls, args, kwargs)
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = init_signature(cls)  # type: ignore[attr-defined]

    def __init__(
        self,
        dataset: str | Sequence[str],
        *,
        batch_size: int,
        transform: ImageTransform | Callable[..., Any] | None = None,
        num_workers: int | str = 0,
        device: str | torch.device = "cpu",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        even_batches: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        keys: bool = False,
        window: int = 8,
        on_error: str = "replace",
        prefetch: int = 2,
        cache_dir: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        storage_options: dict[str, Any] | None = None,
        verify_hashes: bool = False,
        gpu: GpuOptions | None = None,
        contiguous_labels: bool = False,
        masks: bool = False,
        pad: bool | int = False,
        weights: Iterable[float] | None = None,
        disjoint_labels: bool = False,
        feeders: int | str = "auto",
        read_ahead: bool = True,
        text_transform: TextTransform | None = None,
        fields: Sequence[str] | None = (),
        service: RayService | None = None,
        **dataloader_args: Unpack[DataLoaderArgs],
    ) -> None:
        check_dataloader_args(type(self), dataloader_args, {"device": device, "prefetch": prefetch})
        if service is not None:
            check_service(service, num_workers=num_workers, feeders=feeders, gpu=gpu)
        workers = worker_count(num_workers)
        batch_size, window, prefetch = (as_int(name, value, 1) for name, value in
                                        (("batch_size", batch_size), ("window", window), ("prefetch", prefetch)))
        seed = as_int("seed", seed, 0, 1 << 64)
        where = as_device(device)
        rank, world_size, pad = plain_int(rank), plain_int(world_size), plain_int(pad)
        check_arguments(batch_size=batch_size, window=window, prefetch=prefetch, on_error=on_error, rank=rank,
                        world_size=world_size, gpu=gpu, pad=pad, transform=transform, cache_dir=cache_dir)
        shuffle, drop_last, even_batches, keys, masks, contiguous_labels, verify_hashes, disjoint_labels, read_ahead = (
            as_flags(shuffle=shuffle, drop_last=drop_last, even_batches=even_batches, keys=keys, masks=masks,
                     contiguous_labels=contiguous_labels, verify_hashes=verify_hashes,
                     disjoint_labels=disjoint_labels, read_ahead=read_ahead))
        cache = cache_dir or default_cache_dir()
        datasets = open_datasets(dataset, weights=weights, disjoint_labels=disjoint_labels,
                                 storage_options=storage_options, cache_dir=cache, absolute=service is not None)
        #: The dataset's ``index.json``; for a mix, a joined view (kind, classes, categories and
        #: every shard in the loader's order, each ``url`` relative to its own dataset).
        #: ``manifest.num_samples`` counts the samples (a DataLoader's ``len(loader.dataset)``).
        self.manifest = datasets.manifest
        #: Each dataset's ``index.json`` (one for a single dataset).
        self.manifests = datasets.manifests
        #: The mix (quotas, joined shard sizes), or None for a single dataset.
        self.mix = datasets.mix
        self._given_layout, self._even_batches = (rank, world_size), even_batches
        rank, world_size = rank_and_world(rank, world_size, settled=False)  # the first iteration takes the live one
        self.config = PlanConfig(
            shard_sizes=datasets.shard_sizes, seed=seed, shuffle=shuffle,
            window=window, rank=rank, world_size=world_size, batch_size=batch_size, drop_last=drop_last,
            even_batches=even_batches and world_size > 1, mix=datasets.mix,  # one rank: a short last batch
            dataset=datasets.identity,
        )
        if self.config.num_samples == 0:
            raise LoaderError("dataset has no samples", where=datasets.parts[0].store.url)
        self._num_batches = self.config.num_batches  # validates rank/world/batch size
        say_if_no_batch(self.config)
        self.transform = transform
        self.keys = keys
        #: Worker processes (``num_workers``, with ``"auto"`` resolved).
        self.num_workers = workers
        self.reader = ShardReader.joined(datasets.parts, cache_dir=cache, cache_bytes=cache_bytes,
                                         verify_hashes=verify_hashes)
        per_reader = -(-self.config.num_samples // (world_size * max(1, workers)))  # an epoch's samples a process reads
        spec = RouteSpec(transform, where, batch_size, on_error=on_error, num_workers=workers,
                         prefetch=prefetch, gpu=gpu or GpuOptions(), masks=masks, pad=pad,
                         contiguous_labels=contiguous_labels,
                         captions=caption_targets(text_transform, fields, per_reader=per_reader),
                         service=service is not None)
        #: The delivery route this loader takes (CPU, GPU or COCO), chosen once here.
        self.route: Route[Any, Any] = choose_route(self.manifest, self.reader, spec)
        self.device = self.route.device
        #: COCO with ``contiguous_labels``: category id -> label; otherwise None (labels are the ids).
        self.label_map: dict[Any, int] | None = self.route.label_map
        #: COCO: the annotation file's categories (``id``, ``name``, ...) as packed.
        self.categories = self.manifest.categories
        self._control = torch.zeros(2, dtype=torch.int64).share_memory_()
        self._stream = BatchStream(self.config, self.route.builder, self._control, read_ahead=read_ahead)
        self._stats = StageStats()
        count, self._slot_labels = feeder_count(feeders, self.route, transform, workers, self.manifest.kind,
                                                captions=spec.captions, workers_auto=num_workers == "auto")
        self._spec, self._read_ahead = spec.on(self.device), read_ahead  # on: where the route delivers
        self._decoder = preferred_decoder()  # the feeders, started later, decode with the library chosen now
        #: The preprocessing service building this loader's batches (``service=``), or None.
        self.service: ServiceClient | None = None
        if service is not None:
            builder = self.route.builder
            if not isinstance(builder, CpuBatchBuilder):  # choose_route takes the CPU route for a service
                raise LoaderError(f"service= builds batches of the CPU route, not of {type(self.route).__name__}")
            self.service = ServiceClient(service, builder, dataset_checks(datasets.parts),
                                         writable=self.device.type == "cpu", read_ahead=read_ahead)
        # where the route runs: here, in feeder processes, or ("auto") where the loop runs faster
        self._supply = Supply(self.route, self._stream, self._control, self._stats, num_workers=workers,
                              prefetch=prefetch, feeders=count if service is None else 0, auto=feeders == "auto",
                              make_pool=_PoolMaker(self), local=service is None)
        self._pos = Position()  # where we stand, and how the next iteration starts
        self._loaded_state: dict[str, Any] | None = None  # what set _pos, while it stands (see _follow_world)
        # Iterations started so far; an older iterator finds the count moved on and ends
        # (_ended_by says why) rather than taking the newer one's batches.
        self._iterations, self._ended_by = 0, ""
        self._pid = os.getpid()  # the process whose workers, feeders and threads this loader's are
        self._active = 0  # the iteration whose generator is open (0: none)
        self._told_unchecked = False  # whether the log said that samples went unchecked (stats.unchecked)
        self._last: tuple[int, Any] | None = None  # (batch index, remainder) of the batch last yielded
        self._sampler: EpochSampler | None = None  # made at its first use: one object (Lightning tells them by id)

    @property
    def classes(self) -> tuple[str, ...] | None:
        """Class names by label: ImageFolder's folder names (as torchvision's ``ImageFolder.classes``;
        a mix with ``disjoint_labels``: each dataset's, one after another);
        COCO with ``contiguous_labels``: ``"__background__"`` then the category names in label
        order (torchvision's detection-model convention); otherwise None (COCO labels are the
        category ids: see :attr:`categories`; adopted shards without names). A tuple:
        ``list(loader.classes) == ImageFolder(root).classes``."""
        return self.route.classes

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """``{class name: label}``, as torchvision's ``ImageFolder.class_to_idx``; None where
        :attr:`classes` is. A name given twice (a mix with ``disjoint_labels``) maps to its first label."""
        classes = self.classes
        if classes is None:
            return None
        mapping: dict[str, int] = {}
        for label, name in enumerate(classes):
            mapping.setdefault(name, label)
        return mapping

    @property
    def batch_size(self) -> int:
        """Samples per batch (per rank), as ``DataLoader.batch_size``."""
        return self.config.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether an epoch's last partial batch is dropped, as ``DataLoader.drop_last``."""
        return self.config.drop_last

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (the same on every rank unless
        ``even_batches=False``), as ``len(DataLoader)``; the samples are ``loader.manifest.num_samples``.
        An epoch resumed mid-way yields only those not yet delivered: :attr:`remaining` counts them
        (e.g. ``tqdm(total=loader.remaining)``)."""
        self._follow_world()
        return self._num_batches

    @property
    def remaining(self) -> int:
        """Batches still to come: of the epoch being iterated, or else of the one the next iteration
        runs (after :meth:`load_state_dict`: what the checkpoint had not delivered; after an elastic
        resume: what the remainder makes at this layout).

        Example::

            loader.load_state_dict(ckpt)  # saved after 10 of 125 batches
            loader.remaining, len(loader)  # (115, 125)
        """
        self._follow_world()
        if self._left_mid_epoch:  # the next iteration runs the next epoch, whole
            return self._num_batches
        return self.config.epoch_batches(self._pos.remainder) - self._pos.batch

    def real_samples(self, batch_index: int | None = None) -> int:
        """How many samples of a batch are the epoch's own: the first ``real_samples()`` of it; the
        rest repeat the epoch's first samples as padding. Padding exists only over several ranks
        with ``even_batches=True`` and ``drop_last=False`` (equal full batches on every rank), in
        the last ranks' last batches; elsewhere this is the batch's length.

        ``batch_index``: this rank's batch of the epoch being iterated (Lightning's ``batch_idx``;
        a framework that fetches ahead has already taken the next batch); None: the batch last
        yielded. An evaluation that gathers per batch (accelerate's ``gather_for_metrics``) keeps
        each rank's real samples and counts every sample once::

            for images, labels in loader:
                real = torch.arange(len(labels)) < loader.real_samples()
                preds, labels, real = accelerator.gather_for_metrics((model(images).argmax(1), labels, real))
                correct += (preds == labels)[real].sum(); total += real.sum()

        Raises:
            LoaderError: no batch was yielded yet (``batch_index=None``), or ``batch_index`` is
                not one of this rank's batches.
        """
        if batch_index is None:
            if self._last is None:
                raise LoaderError("no batch was yielded yet: pass batch_index= or call real_samples() after one")
            batch_index, rest = self._last
        else:  # the epoch last yielded from (it may have ended already when a framework fetched ahead)
            rest = self._last[1] if self._last is not None else self._pos.remainder
        return self.config.real_samples(batch_index, rest)

    @property
    def end_of_dataloader(self) -> bool:
        """True while the epoch's last batch is out. Read per batch by accelerate's gradient
        accumulation and its ``gather_for_metrics``: a read during an iteration says, once, where
        ``even_batches=False`` gives the ranks different counts, that a collective per batch waits
        forever on a rank with none left (an evaluation under ``torch.no_grad()`` is not told so
        as it starts, see ``even_batches``)."""
        if self._active and self._active == self._iterations:
            say_if_uneven(self)
        return self._end_of_dataloader

    @end_of_dataloader.setter
    def end_of_dataloader(self, value: bool) -> None:
        self._end_of_dataloader = value

    @property
    def sampler(self) -> EpochSampler:
        """What ``DataLoader.sampler`` is asked for: ``loader.sampler.set_epoch(epoch)`` (Lightning's
        loops call it before each epoch's iteration, DDP scripts by hand) makes the next iteration
        run ``epoch``, as a ``DistributedSampler``'s does, and ``len(loader.sampler)`` counts the
        samples this rank yields in an epoch, padding included (as a ``DistributedSampler``'s
        ``len``). It yields no indices: the loader draws the epoch's order itself
        (:class:`~shardkit.loader.frameworks.EpochSampler`)."""
        if self._sampler is None:
            self._sampler = epoch_sampler(self)
        return self._sampler

    @property
    def batch_sampler(self) -> EpochBatches:
        """What ``DataLoader.batch_sampler`` is asked for: its ``batch_size``, ``drop_last`` and
        ``sampler`` (:attr:`sampler`) are the loader's, ``len()`` is ``len(loader)``; it yields no
        batches of indices (:class:`~shardkit.loader.frameworks.EpochBatches`)."""
        return EpochBatches(self.sampler, self.batch_size, self.drop_last)

    @property
    def dataset(self) -> Any:
        """Not there: a ShardLoader reads its shards itself (``skip_first_batches`` and other
        wrappers look for a dataset; :meth:`state_dict` does their job). The samples are counted by
        ``loader.manifest.num_samples``.

        Raises:
            AttributeError: always, naming what to do instead (``hasattr`` stays False).
        """
        raise AttributeError(NO_DATASET)

    def __getitem__(self, index: Any) -> Any:
        """Refused: a ``DataLoader`` or ``StatefulDataLoader`` wrapped around a ShardLoader indexes it.

        Raises:
            TypeError: always, naming what to do instead.
        """
        raise TypeError(NOT_A_DATASET)

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the one the next iteration runs (after an iteration left
        mid-epoch, the next epoch, as :attr:`remaining` counts it; :meth:`state_dict` still holds
        the left epoch's place, so a resume from it continues that epoch). After
        :meth:`load_state_dict` during an iteration, the state's epoch (and :meth:`state_dict` the
        state, as torchdata's ``StatefulDataLoader`` gives back a state loaded mid-iteration); an
        epoch given by :meth:`set_epoch` during an iteration shows once that iteration ends."""
        following = self._pos.following
        if following is not None and following.resume:  # a state loaded while an iteration is open
            return following.epoch
        return self._pos.epoch + 1 if self._left_mid_epoch else self._pos.epoch

    def __getstate__(self) -> dict[str, Any]:
        # a copy has no iteration open: one open here ends for it (an epoch set or a state loaded
        # meanwhile is where the copy's first iteration starts)
        pos = replace(self._pos)
        pos.ended()
        return {**self.__dict__, "_active": 0, "_pos": pos, "_sampler": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()  # a copy starts processes of its own
        # the [epoch, start] tensor that the workers read came in private memory, as any tensor
        # unpickled or deep-copied: back in shared memory, or the workers of the copy would not
        # see an epoch set after they started (the stream and the epoch run hold this same tensor)
        self._control.share_memory_()

    @property
    def _open(self) -> bool:
        """An iteration is open: its generator started, and neither a newer one nor close() ended it."""
        return self._active != 0 and self._active == self._iterations

    @property
    def _left_mid_epoch(self) -> bool:
        """The last iteration was left mid-epoch and none is open: the next one runs the next epoch."""
        return not self._pos.fresh and self._active != self._iterations

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` from its start. Called while an iteration is open,
        that iteration goes on with its own epoch (as a ``DataLoader`` whose ``DistributedSampler``
        gets ``set_epoch`` mid-iteration), and the next one runs ``epoch``; :attr:`epoch` and
        :meth:`state_dict` stay the open iteration's until it ends, so a checkpoint taken meanwhile
        resumes its batches still to come. The open iteration's own epoch, given while it still
        has batches to deliver, changes nothing (the next iteration runs the epoch after it).

        Right after :meth:`load_state_dict`, ``set_epoch`` of the epoch the state resumes in keeps
        the resume point, so the usual loop resumes mid-epoch::

            loader.load_state_dict(ckpt)
            for epoch in range(loader.epoch, epochs):
                loader.set_epoch(epoch)  # continues where the checkpoint stopped
                for batch in loader: ...

        ``set_epoch`` of another epoch there drops the resume point, with a warning (through
        :attr:`sampler`, as a framework gives the epoch, a later one is only logged at info level:
        Lightning ends an epoch early with ``limit_train_batches``).
        """
        self._set_epoch(epoch, by_sampler=False)

    def _set_epoch(self, epoch: int, *, by_sampler: bool) -> None:
        """:meth:`set_epoch`; ``by_sampler``: given to :attr:`sampler`, as a framework gives it to a
        ``DistributedSampler`` before each iteration of an epoch it counts itself: the next
        iteration runs ``epoch`` from its start even where the open one (a validation cut short
        by Lightning's sanity check) is of that epoch, and a resume point dropped for a later
        epoch (an epoch Lightning ended early, with ``limit_train_batches``) is logged at info
        level; for an earlier one (a loop counting its epochs from 0 after a resume), warned of."""
        epoch = as_int("epoch", epoch, 0, MAX_INT)  # it travels to the workers in an int64 tensor
        midway = self._open and self._pos.batch < self.config.epoch_batches(self._pos.remainder)
        dropped = self._pos.set_epoch(epoch, iterating=self._open, midway=midway and not by_sampler)
        if dropped is not None:
            left, batch, rest = dropped
            point = f"batch {batch}" if rest is None else (  # an elastic resume's: batches of what was left
                f"batch {batch} of what was left of it, {len(rest):,} samples")
            (log.info if by_sampler and epoch > left else log.warning)(
                "shardkit: set_epoch(%d) right after load_state_dict drops its resume point (epoch %d, %s): "
                "epoch %d runs from its start; set_epoch(loader.epoch) resumes where the state stopped",
                epoch, left, point, epoch)

    def wait_for_feeders(self, timeout: float | None = None) -> bool:
        """With ``feeders="auto"`` the first batches come from this process while the feeder
        processes start (see ``feeders``); wait until they have started, at most ``timeout``
        seconds (a benchmark does this before it times the loader's steady state). The batches
        then come from where the trial of ``feeders="auto"`` gives them (:attr:`settled` once it
        has chosen), or, where they could not start, from this process for good (:attr:`feeders`
        is then 0, with one warning). Before the first iteration it starts them now, waiting for
        their start whatever ``timeout`` says. True unless ``timeout`` passed first; it can pass
        unnoticed while a launch waits for a forkserver that is not ready after a minute
        (``READY_WAIT_S``).

        Raises:
            LoaderError: feeders asked for by number could not start (naming why).
        """
        self._follow_world()
        return self._supply.wait_for_feeders(timeout)

    @property
    def settled(self) -> bool:
        """Whether the batches come from where they stay: False while ``feeders="auto"`` starts
        its feeders (again, after :meth:`close`) or times the loop both ways (see ``feeders``).
        A benchmark of the steady state takes untimed batches until it holds."""
        return self._supply.settled

    @property
    def trial(self) -> PaceTrial | None:
        """With ``feeders="auto"`` and feeders that can run: its trial as it stands (``paces``, the
        loop's median seconds per batch timed on each side; ``decided``, the side kept, or None;
        ``place(n)``, the side of the loader's ``n``-th batch once the feeders are up). None
        otherwise (from the moment feeders are found unable to run, too)."""
        return self._supply.trial if self._supply.tries else None

    @property
    def feeders(self) -> int:
        """Feeder processes running the route (0: it runs in this process); see ``feeders``.
        With ``"auto"``, 0 from the moment they cannot run or its trial stopped them."""
        return self._supply.feeders

    @property
    def stats(self) -> StageStats:
        """Counters and per-stage times accumulated since the loader was created."""
        return self._stats

    def __iter__(self) -> Iteration:
        return Iteration(self._iterate(), self.__len__)  # asked when len() is: iter() itself does nothing yet

    def _iterate(self) -> Generator[Any, None, None]:
        """The batches of one iteration (see :class:`~shardkit.loader.run.iteration.Iteration`)."""
        self._follow_world()
        epoch, start, rest = self._pos.begin()
        count = self.config.epoch_batches(rest)
        self._iterations += 1
        mine, self._ended_by = self._iterations, "a newer iteration of this loader started (one runs at a time)"
        self._active = mine
        delivered: Batches
        local: Delivery | None = None  # the route's delivery in this process, which read-ahead keeps
        served: Generator[Any, None, None] | None = None  # the service's batches, in order
        if self.service is not None:
            served = self.service.batches(self.config, epoch, start, rest)
            delivered = self.route.deliver(served, self._stats)
        else:
            delivered, local = self._supply.open(epoch, start, count, rest)
        whole = died = False
        self.end_of_dataloader = False
        if torch.is_grad_enabled():  # a training loop, where a rank with no batch left hangs the others
            say_if_uneven(self)
        try:
            with seen_by_accelerate(self):
                yield from self._deliver(delivered, epoch, start, count, rest, mine)
            whole = True
        except Exception as err:  # torch's error for a dead worker varies and may come from anywhere here
            dataloader = self._supply.dataloader
            death = worker_death(dataloader) if dataloader is not None else None
            if death is None:
                raise
            died = True
            raise death from err
        finally:
            if self._active == mine:  # an older iteration closed late leaves the newer one's flag alone
                self.end_of_dataloader = False
            run = self._supply.run
            if local is None and self.service is None:
                local = self._supply.take_tail()  # feeders="auto" ended this epoch with the route here
            if local is not None and run is not None and whole and self._iterations == mine:
                run.keep(local, epoch)  # with read-ahead, on into the next epoch
            else:
                delivered.close()  # an iteration left early stops its route's (or feeders') work now
                if local is not None and local is not delivered:
                    local.close()
            if served is not None:
                served.close()  # the batches asked of the service and not taken are cancelled
            if self._active == mine:
                self._active = 0
            if not whole and self._iterations == mine:
                self._pos.ended()  # left mid-epoch: an epoch set meanwhile is the next iteration's
            if died and run is not None:  # as a DataLoader's: the next iteration starts new workers
                run.stop_workers()
        if self._iterations == mine:  # an older iteration ending late leaves the newer one's place alone
            self._pos.finished(epoch)

    def _deliver(self, delivered: Batches, epoch: int, start: int, count: int, rest: Any, mine: int
                 ) -> Generator[Any, None, None]:
        """Yield batches ``start`` to ``count - 1`` of ``epoch`` from ``delivered``, recording each
        as delivered (``end_of_dataloader`` set while the last one is out)."""
        for consumed in range(start + 1, count + 1):
            if self._iterations != mine:  # before touching the workers the newer iteration reads
                raise LoaderError(f"epoch {epoch} ended after {consumed - 1} of {count} batches: {self._ended_by}")
            item = next(delivered, None)
            if item is None:
                raise LoaderError(f"workers ended epoch {epoch} after {consumed - 1} of {count} batches")
            self._pos.delivered(epoch, consumed)
            self._last, self.end_of_dataloader = (consumed - 1, rest), consumed == count
            if self._stats.unchecked and not self._told_unchecked:
                self._tell_unchecked()
            yield item if self.keys else item[:2]
        self._supply.finish(delivered)

    def _tell_unchecked(self) -> None:
        """Log, once, that samples come from shards whose bytes nothing checks (see ``stats.unchecked``)."""
        self._told_unchecked = True
        log.warning("shardkit: samples come from shards with no offsets file (.idx) beside them: such a shard is "
                    "scanned when opened, and its samples are checked neither against their CRC-32 nor by the shard's "
                    "sha256 (copy the .idx files with the shards, or pass verify_hashes=True; `shardkit verify` lists "
                    "the shards without one; stats.unchecked counts the samples)")

    def _follow_world(self) -> None:
        """Take the live rank and world (``rank``/``world_size`` left to detection): a loader built
        before the process group existed is laid out for it before its first iteration, or before
        the next one where it iterated alone so far (a look at a batch before Lightning's
        ``trainer.fit``: its workers stop, and the next iteration starts them for this rank).

        Raises:
            LoaderError: the world changed during an iteration, or after this loader iterated as
                one rank of several.
        """
        if None not in self._given_layout:
            return
        live = rank_and_world(*self._given_layout)
        check_accelerate_world(*live)
        built = (self.config.rank, self.config.world_size)
        if live == built:
            return
        left = None
        if self._iterations:
            # its workers or feeders are another process's (a rank forked after the look)
            forked = self._pid != os.getpid() and (self.num_workers > 0 or self._supply.feeders > 0)
            if self._open:
                why = " while an iteration was open: end it (or let it go) before the process group starts"
            elif forked:
                why = (f", forked from process {self._pid} whose workers it has: build the loader after the ranks "
                       "start, or do not iterate it before")
            elif built[1] > 1:
                why = ": build the loader after init_process_group, or pass rank= and world_size="
            else:
                why = ""  # iterated alone, in this process: laid out anew below
            if why:
                raise LoaderError(f"this loader iterated as rank {built[0]} of {built[1]}, but this process is now "
                                  f"rank {live[0]} of {live[1]}{why}")
            # iterated alone, before the group: its workers were laid out for one rank
            self._supply.close()
            if self._left_mid_epoch:  # where it broke off, for a state_dict() taken before the next iteration
                left = self.config.state(*self._pos.place[:2], remainder=self._pos.place[2]).to_dict()
        log.info("shardkit: rank %d of %d (the loader was built as rank %d of %d, before the process group)",
                 *live, *built)
        self.config = replace(self.config, rank=live[0], world_size=live[1],
                              even_batches=self._even_batches and live[1] > 1)
        self._num_batches = self.config.num_batches
        say_if_no_batch(self.config)
        self._stream.config = self.config
        self._supply.relayout()
        if self._pos.loaded and self._loaded_state is not None:
            self._pos.resumed(*self.config.resume(self._loaded_state))
        elif left is not None:  # the rest of the broken-off epoch at this layout; the next iteration runs the next
            epoch, batch, remainder = self.config.resume(left)
            if epoch != left["epoch"]:  # every batch of it was out (its iterator not run to the end)
                self._pos.finished(left["epoch"])
            else:
                self._pos.epoch, self._pos.batch, self._pos.remainder = epoch, batch, remainder

    def _feeder_pool(self, parts: int) -> FeederPool:
        """``parts`` feeder processes (not started yet) for this loader's plan and route."""
        workers = self.num_workers
        return FeederPool([FeederSpec(self.manifest, self.reader,
                                      self._spec.with_workers(feeder_workers(part, parts, workers)), self.config,
                                      part, parts, workers, self._decoder, self._read_ahead, self._slot_labels)
                           for part in range(parts)])

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as a tiny JSON-able dict (the same on every rank).

        Loading it into a fresh loader (any ``num_workers``) continues with exactly the batches
        not yet delivered, with the same samples, order and augmentation; into a loader with
        another world size, batch size, ``drop_last`` or ``even_batches`` (an elastic resume),
        with the samples not yet delivered, laid out anew over its ranks (see
        :mod:`shardkit.loader.epochs.remainder`). After an iteration left mid-epoch (a ``break``),
        it still holds that epoch's place, as torchdata's ``StatefulDataLoader`` does: a resume
        continues the epoch, while this loader, iterated again, starts the next one.
        """
        epoch, batch, remainder = self._pos.place
        return self.config.state(epoch, batch, remainder=remainder).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` output, on this world size and batch size or another;
        refuses a state made for another dataset or mix, seed, ``shuffle`` or ``window``, naming it.
        Loaded while an iteration is open, the state is where the next iteration starts."""
        self._pos.resumed(*self.config.resume(state), iterating=self._open)
        self._loaded_state = state

    def close(self) -> None:
        """Stop the worker processes and the route's threads, close open shard files.

        Idempotent; iterating again afterwards starts new workers.
        """
        self._iterations, self._ended_by = self._iterations + 1, "the loader was closed"
        self._pos.ended()  # an iteration it ended: an epoch set or a state loaded meanwhile is the next one's
        self.route.close()
        if self.service is not None:
            self.service.close()
        self._supply.close()
        self.reader.close()

    def __enter__(self) -> ShardLoader:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# help(), IDEs and the docs show __init__'s parameters, not __new__'s (*args, **kwargs)
ShardLoader.__signature__ = init_signature(ShardLoader)  # type: ignore[attr-defined]
