"""``shardkit bench IMAGES --annotations ANN --train DETECTOR``: a detection training step fed by each loader.

The measurement is :mod:`shardkit.bench.train`'s: for every contender and repetition, the step's
rate on batches already on the device (*synthetic*), then on the loader's batches (*fed*),
``share = fed / synthetic``, contenders in alternating order, ``host_wait`` and ``loader_gpu_ms``
as there. A detection batch's cost follows its images' sizes (the model pads a batch to its
largest height and width: portrait and landscape images together cost more), so the synthetic
run cycles over the loader's first ``fixed_batches`` (8) rather than repeating one. A bench
stopped part-way keeps the runs it finished, as there (:mod:`shardkit.bench.finished`).

Every contender delivers the steps of ``transforms.detection_train(size, max_size)`` (IoU crop,
shortest side ``size``, longer at most ``max_size``, flip, sanitize) on the images that have
annotations, full batches only:

* ``cocodetection``: torchvision ``CocoDetection`` + ``DataLoader``
  (:func:`~shardkit.bench.baselines.cocodetection_loader`), pinned on CUDA;
* ``shardloader``: ShardLoader on ``device`` with ``contiguous_labels=True``: on CUDA its COCO GPU
  route (nvJPEG decode, crop-resize-flip on the GPU), the one with a ``loader_gpu_ms``;
* ``shardloader_cpu``: the same on ``device="cpu"`` (the COCO route); the step copies its batches
  to the device, as it does CocoDetection's.

Every contender trains the same task: CocoDetection's labels are COCO category ids, which the step
maps to ShardLoader's ``contiguous_labels`` (sorted ids -> 1..K, 0 the background) as it brings
the batch to the device.

The step (:class:`DetectionStep`): an untrained torchvision detector (nothing downloaded) with
K + 1 classes resizing to the loader's ``size``/``max_size`` (its own resize then keeps the size), in
train mode; on CUDA ``channels_last`` and bf16 autocast (float32 on the CPU: tests); SGD with
momentum; eager by default, as torchvision's detection references train (``compile=True``
compiles the backbone only, as ``pipelines/train_detector.py --compile`` does; every batch pads to
its own size, so the backbone recompiles for new shapes: on the H200 a 2,000-image bench had not
finished its first run after 230 s of it).
Images go in one by one as ``float / 255``, targets as boxes and labels; the loss is the sum of
the model's losses. Images whose boxes were all cropped away train on no box, as torchvision allows.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from shardkit.bench import baselines, conditions, runner
from shardkit.bench.checks import check_same_data, check_shards_intact
from shardkit.bench.finished import FinishedRuns
from shardkit.bench.report import created
from shardkit.bench.train import SETTLE_S, TrainRun, counted, run_contenders, summarise
from shardkit.bench.train_report import train_table
from shardkit.bench.train_step import synchronize

__all__ = ["DETECTION_CONTENDERS", "DETECTION_MODELS", "DetectionBenchConfig", "DetectionStep",
           "format_detection_table", "run_detection_train_bench"]

#: torchvision detectors that take ``min_size``/``max_size`` and train on boxes and labels alone.
DETECTION_MODELS = ("fasterrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn_v2", "fasterrcnn_mobilenet_v3_large_fpn",
                    "retinanet_resnet50_fpn", "retinanet_resnet50_fpn_v2", "fcos_resnet50_fpn")
DETECTION_CONTENDERS = ("cocodetection", "shardloader", "shardloader_cpu")
SCHEMA = "shardkit.bench.train_detection/1"


@dataclass(frozen=True)
class DetectionBenchConfig:
    """What to feed and how long. ``images``/``annotations``: the COCO source; ``shards``: a pack
    of its annotated images (``shardkit pack IMAGES SHARDS --annotations ANN --drop-empty``);
    ``size``/``max_size``: the shorter side and the longer side's limit;
    ``steps``/``warmup``/``repeats``/``compile``/``settle_s`` as in
    :class:`~shardkit.bench.train.TrainBenchConfig`;
    ``fixed_batches``: the loader's first batches the synthetic run cycles over (kept on the device)."""

    images: str
    annotations: str
    shards: str
    model: str = "fasterrcnn_resnet50_fpn"
    size: int = 800
    max_size: int = 1333
    batch_size: int = 16
    workers: int = 8
    steps: int = 100
    warmup: int = 10
    repeats: int = 3
    device: str = "cuda"
    compile: bool = False
    contenders: tuple[str, ...] = DETECTION_CONTENDERS
    fixed_batches: int = 8
    settle_s: float = SETTLE_S

    def validate(self) -> None:
        """Raise ValueError on settings that cannot be measured."""
        if self.model not in DETECTION_MODELS:
            raise ValueError(f"model must be one of {DETECTION_MODELS}, got {self.model!r}")
        if (min(self.size, self.batch_size, self.steps, self.repeats, self.fixed_batches) < 1 or self.workers < 0
                or self.warmup < 0):
            raise ValueError("size, batch_size, steps, repeats and fixed_batches must be >= 1; workers and "
                             "warmup >= 0")
        if self.max_size < self.size:
            raise ValueError(f"max_size must be >= size, got size={self.size}, max_size={self.max_size}")
        unknown = set(self.contenders) - set(DETECTION_CONTENDERS)
        if unknown or not self.contenders:
            raise ValueError(f"contenders must be among {DETECTION_CONTENDERS}, got {self.contenders}")


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor (CocoDetection's boxes are torchvision ``BoundingBoxes``)."""
    return t.as_subclass(torch.Tensor)


class DetectionStep:
    """One SGD step of a torchvision detector (see the module doc) on ``(images, targets)``:
    lists of uint8 ``[3,H,W]`` images and of dicts with ``boxes`` (xyxy) and ``labels`` (1..K).

    Example::

        step = DetectionStep("fasterrcnn_mobilenet_v3_large_fpn", 16, torch.device("cpu"), min_size=64,
                             max_size=96, compile=False)
        step(*step.to_device(next(iter(loader))))
    """

    def __init__(self, model: str, num_classes: int, device: torch.device, *, min_size: int, max_size: int,
                 compile: bool = True) -> None:
        import torchvision

        net = torchvision.models.get_model(model, weights=None, weights_backbone=None, num_classes=num_classes,
                                           min_size=min_size, max_size=max_size).to(device)
        if device.type == "cuda":
            net = net.to(memory_format=torch.channels_last)
        net.train()
        if compile:
            net.backbone.compile()
        self.net, self.device = net, device
        self.opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.01, momentum=0.9,
                                   weight_decay=1e-4)
        #: COCO category id -> label, for a loader that delivers category ids; None: labels as delivered.
        self.label_map: dict[Any, int] | None = None

    def reading_category_ids(self, label_map: Mapping[Any, int]) -> DetectionStep:
        """This step (the same model and optimiser) for a loader whose labels are COCO category ids:
        :meth:`to_device` maps them through ``label_map``."""
        view = copy.copy(self)
        view.label_map = dict(label_map)
        return view

    def _labels(self, labels: torch.Tensor) -> torch.Tensor:
        if self.label_map is None:
            return _plain(labels)
        try:
            return torch.tensor([self.label_map[c] for c in labels.tolist()], dtype=torch.int64)
        except KeyError as err:
            raise ValueError(f"category id {err.args[0]!r} is not among the dataset's categories") from None

    def to_device(self, batch: Any) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        images, targets, *_ = batch
        dev = self.device
        return ([im.to(dev, non_blocking=True) for im in images],
                [{"boxes": _plain(t["boxes"]).reshape(-1, 4).to(dev, non_blocking=True),
                  "labels": self._labels(t["labels"]).to(dev, non_blocking=True)} for t in targets])

    def clone(self, batch: tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]
              ) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        images, targets = batch
        return [im.clone() for im in images], [{k: v.clone() for k, v in t.items()} for t in targets]

    def __call__(self, images: list[torch.Tensor], targets: list[dict[str, torch.Tensor]]) -> None:
        inputs = [im.float().div_(255) for im in images]
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.device.type == "cuda"):
            losses = self.net(inputs, targets)
        loss = torch.stack([v.float() for v in losses.values()]).sum()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def sync(self) -> None:
        synchronize(self.device)


def _contenders(cfg: DetectionBenchConfig, step: DetectionStep, label_map: Mapping[Any, int]
                ) -> dict[str, tuple[str, DetectionStep, Callable[[], Any]]]:
    """name -> (label, the step it feeds, its loader's builder), in ``DETECTION_CONTENDERS`` order."""
    common: dict[str, Any] = {"min_size": cfg.size, "max_size": cfg.max_size, "batch_size": cfg.batch_size,
                              "workers": cfg.workers}

    def shardloader(device: str) -> Callable[[], Any]:
        return lambda: runner.detection_shardloader(cfg.shards, device=device, contiguous_labels=True, **common)

    gpu = cfg.device.startswith("cuda")
    every = {
        "cocodetection": ("torchvision CocoDetection + DataLoader", step.reading_category_ids(label_map),
                          lambda: baselines.cocodetection_loader(cfg.images, cfg.annotations, device=cfg.device,
                                                                 **common)),
        "shardloader": (f"shardkit ShardLoader (COCO {'GPU ' if gpu else ''}route)", step, shardloader(cfg.device)),
        "shardloader_cpu": ("shardkit ShardLoader (COCO route, CPU)", step, shardloader("cpu")),
    }
    return {name: every[name] for name in DETECTION_CONTENDERS if name in cfg.contenders}


def run_detection_train_bench(cfg: DetectionBenchConfig, *,
                              after_run: Callable[[str, int, TrainRun], None] | None = None) -> dict[str, Any]:
    """Measure every contender ``repeats`` times (alternating); return the report dict.

    Raises:
        ValueError: invalid settings, ``shards`` not a pack of the COCO source (other images or
            categories), or too few images for one batch.
        SourceError: ``images``/``annotations`` are not a COCO source.
        Interrupted: the bench was stopped part-way (Ctrl-C, SIGTERM); it carries the report of
            the runs it finished (:mod:`shardkit.bench.finished`).
    """
    from shardkit.index.manifest_io import locate_dataset, read_manifest
    from shardkit.loader.routes.coco.target import contiguous_label_map

    cfg.validate()
    data = conditions.describe_coco(cfg.images, cfg.annotations)
    store = locate_dataset(cfg.shards)
    manifest = read_manifest(store)
    check_same_data(manifest, data, cfg.shards, None, can_omit=False)
    check_shards_intact(store, manifest, cfg.shards)
    if data["images"] < cfg.batch_size:
        raise ValueError(f"{data['images']} annotated images make no full batch of {cfg.batch_size}")
    label_map = contiguous_label_map(manifest.categories)  # what ShardLoader's contiguous_labels uses
    step = DetectionStep(cfg.model, len(label_map) + 1, torch.device(cfg.device), min_size=cfg.size,
                         max_size=cfg.max_size, compile=cfg.compile)
    contenders = _contenders(cfg, step, label_map)
    labels = {name: label for name, (label, _s, _b) in contenders.items()}
    finished = FinishedRuns(contenders, cfg.repeats, after_run)
    with finished.kept(lambda runs, mark: _report(cfg, data, labels, runs, mark)):
        runs = run_contenders({name: (s, build) for name, (_label, s, build) in contenders.items()},
                              steps=cfg.steps, warmup=cfg.warmup, batch_size=cfg.batch_size, repeats=cfg.repeats,
                              fixed_batches=cfg.fixed_batches, settle_s=cfg.settle_s, after_run=finished.add)
    return _report(cfg, data, labels, runs, None)


def _report(cfg: DetectionBenchConfig, data: dict[str, Any], labels: Mapping[str, str],
            runs: Mapping[str, list[TrainRun]], interrupted: dict[str, Any] | None) -> dict[str, Any]:
    """The report of ``runs``: a row per contender (``labels``: name -> label) that finished a run;
    ``interrupted``: the mark of a bench stopped part-way (None: it ran to its end)."""
    results = [{"name": name, "label": label, **summarise(runs[name])} for name, label in labels.items()
               if runs.get(name)]
    conds = {"machine": conditions.machine(), "versions": conditions.versions(), "gpu": conditions.gpu(cfg.device),
             "data": data}
    return {"schema": SCHEMA, "created": created(), "config": asdict(cfg), "conditions": conds,
            "interrupted": interrupted, "results": results}


def format_detection_table(report: dict[str, Any], width: int | None = None) -> str:
    """The report as a text table: median (min–max) of each figure over the repetitions (in
    ``width`` columns, see :func:`~shardkit.bench.train_report.train_table`)."""
    cfg = report["config"]
    cuda = cfg["device"].startswith("cuda")
    title = (f"detection training step: {cfg['model']}, shorter side {cfg['size']} px (longer at most "
             f"{cfg['max_size']}), batch {cfg['batch_size']}, "
             f"{'bf16 autocast, channels_last' if cuda else 'float32'}, "
             f"{'torch.compile (backbone)' if cfg['compile'] else 'eager'}, {counted(cfg['workers'], 'worker')}, "
             f"{counted(cfg['steps'], 'timed step')} x {counted(cfg['repeats'], 'run')} on {cfg['device']}; "
             f"synthetic: {counted(cfg['fixed_batches'], 'fixed batch', 'fixed batches')}")
    return train_table(title, report["results"], cfg["batch_size"], width, report.get("interrupted"))
