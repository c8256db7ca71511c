"""Which route a loader takes: COCO (GPU or CPU), GPU or CPU, decided once from the dataset, transform and device."""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

from shardkit.codec.jpeg_region import roi_available
from shardkit.codec.nvjpeg import gpu_decode_unavailable
from shardkit.errors import LoaderError
from shardkit.index.manifest import Manifest
from shardkit.loader.read.captions import CaptionTargets
from shardkit.loader.read.reader import ShardReader
from shardkit.loader.routes.base import Route
from shardkit.loader.routes.cpu import CpuRoute
from shardkit.loader.routes.gpu import GpuRoute
from shardkit.loader.routes.spec import RouteSpec
from shardkit.transforms.base import ImageTransform

__all__ = ["choose_route", "mark_warned", "warned_routes"]

log = logging.getLogger("shardkit.loader")

_warned: set[str] = set()


def warned_routes() -> frozenset[str]:
    """The fallback warnings this process has given (a feeder it starts need not repeat them)."""
    return frozenset(_warned)


def mark_warned(texts: frozenset[str]) -> None:
    """Count ``texts`` as given here (in a feeder: the training process gave them)."""
    _warned.update(texts)


def _warn_once(message: str, *args: object) -> None:
    """Log a fallback warning the first time this process takes that fallback."""
    text = message % args
    if text not in _warned:
        _warned.add(text)
        log.warning(text)


def _is_detection(transform: object) -> bool:
    """``transform`` is a detection transform (whose module, and torchvision, are imported only
    where one was made)."""
    detection = sys.modules.get("shardkit.transforms.detection")
    return detection is not None and isinstance(transform, detection.DetectionTransform)


def _needs_coco(masks: bool, pad: int, contiguous_labels: bool, kind: str) -> LoaderError:
    """The error for detection-only arguments on a dataset that is not COCO, naming those given."""
    given = [f"{name}={value!r}" for name, value in (("masks", masks), ("pad", pad),
                                                      ("contiguous_labels", contiguous_labels)) if value]
    return LoaderError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} a COCO dataset (packed with "
                       f"shardkit pack --annotations); this one is {kind!r}")


def _captions_route(reader: ShardReader, spec: RouteSpec) -> Route[Any, Any]:
    """The route of a captioned dataset: the GPU or CPU route as for ImageFolder (same choice, same
    fallbacks), with the batch's text in place of labels."""
    transform, device = spec.transform, spec.device
    captions = spec.captions or CaptionTargets()
    if spec.masks or spec.pad or spec.contiguous_labels:
        raise _needs_coco(spec.masks, spec.pad, spec.contiguous_labels, "captions")
    if _is_detection(transform):
        raise LoaderError("transforms.detection_train/detection_val need a COCO dataset; this one is 'captions': use "
                          "transforms.imagenet_train/imagenet_val (or any callable on images)")
    device, gpu_route = _gpu_or_fallback(spec)
    if gpu_route and isinstance(transform, ImageTransform):
        return GpuRoute(reader, transform, device=device, on_error=spec.on_error, batch_size=spec.batch_size,
                        num_workers=spec.num_workers, prefetch=spec.prefetch, options=spec.gpu, captions=captions)
    if not spec.service:  # the service's nodes decode, with their own decoder
        _warn_region_decoder(transform)
    return CpuRoute(reader, transform, device=device, on_error=spec.on_error, batch_size=spec.batch_size,
                    num_workers=spec.num_workers, prefetch=spec.prefetch, captions=captions)


def _gpu_or_fallback(spec: RouteSpec) -> tuple[torch.device, bool]:
    """``(device, GPU route)`` of an ImageFolder-like dataset: the GPU route on ``spec.device`` when
    it is asked for (CUDA and an :class:`ImageTransform`) and can run; when it cannot (a bicubic
    resize, no nvJPEG), one warning and the CPU route delivering on the CUDA device (the CPU when
    CUDA is missing altogether); otherwise the CPU route on ``spec.device``."""
    transform, device = spec.transform, spec.device
    if device.type != "cuda":
        return device, False
    if not isinstance(transform, ImageTransform) or spec.service:
        return _deliverable(device), False
    fallback = device if torch.cuda.is_available() else torch.device("cpu")
    if transform.interpolation != "bilinear":
        _warn_once("shardkit: the GPU route resizes bilinear only; %s resizing runs on the CPU route, batches on %s",
                   transform.interpolation, fallback)
        return fallback, False
    reason = gpu_decode_unavailable(device)
    if reason is None:
        return device, True
    _warn_once("shardkit: GPU decoding unavailable (%s); decoding on the CPU, batches on %s "
               "(`shardkit doctor` checks CUDA and nvJPEG)", reason, fallback)
    return fallback, False


def _deliverable(device: torch.device) -> torch.device:
    """``device``, or the CPU (with one warning) when it is a CUDA device and CUDA is missing
    altogether: the routes that would only copy batches there fall back as the GPU route does."""
    if device.type == "cuda" and not torch.cuda.is_available():
        _warn_once("shardkit: device=%r, but CUDA is not available here (torch.cuda.is_available() is False); "
                   "batches on cpu (`shardkit doctor` checks CUDA)", str(device))
        return torch.device("cpu")
    return device


def _warn_region_decoder(transform: Any) -> None:
    """Warn once when a crop-first transform runs without the libjpeg-turbo region decoder."""
    if isinstance(transform, ImageTransform) and transform.crop_first and not roi_available():
        _warn_once("shardkit: the libjpeg-turbo region decoder is not built, so whole JPEGs are decoded before "
                   "cropping (slower); install the libjpeg-turbo headers (Debian: libjpeg62-turbo-dev, Ubuntu: "
                   "libjpeg-turbo8-dev, conda: libjpeg-turbo) and reinstall shardkit (`shardkit doctor` checks)")


def choose_route(manifest: Manifest, reader: ShardReader, spec: RouteSpec) -> Route[Any, Any]:
    """The route for this dataset and ``spec`` (its transform and device above all).

    - a COCO dataset on a CUDA ``device``: :class:`CocoGpuRoute` when nvJPEG works and the
      transform is one crop-resize-flip window per image (``detection_train``,
      ``detection_val`` or None; :func:`~shardkit.transforms.detection_geometry.gpu_unsupported`);
      otherwise one warning saying why and :class:`CocoRoute`, delivering on ``device`` (or on
      the CPU when CUDA is missing altogether);
    - a COCO dataset otherwise: :class:`CocoRoute` (a detection transform or None);
    - a CUDA ``device`` with an :class:`ImageTransform` that resizes bilinear (not bicubic: one
      warning and the CPU route, delivering on ``device``): :class:`GpuRoute` when nvJPEG works;
      otherwise one warning and the CPU route, delivering on ``device`` (or on the CPU when
      CUDA is missing altogether);
    - a captioned dataset: as ImageFolder (:class:`GpuRoute` or :class:`CpuRoute`, same fallbacks),
      with the batch's text in place of labels;
    - anything else: :class:`CpuRoute`;
    - with a preprocessing service (``spec.service``): :class:`CpuRoute` on ``device`` whatever it
      is (the service's workers decode; the GPU route is not served), COCO refused.

    The route's :attr:`~shardkit.loader.routes.base.Route.device` is where batches end up.

    A fallback is logged once per process with its fix: no nvJPEG (the CPU route decodes), no
    libjpeg-turbo region decoder (whole JPEGs are decoded before cropping).

    Raises:
        LoaderError: detection-only options (``masks``, ``pad``, ``contiguous_labels``) or a
            detection transform on a dataset that is not COCO, or a classification transform on
            a COCO dataset; ``text_transform``/``fields`` on a dataset that is not captioned; a
            COCO dataset with a service.
    """
    transform, device = spec.transform, spec.device
    on_error, batch_size, num_workers, prefetch, gpu = (spec.on_error, spec.batch_size, spec.num_workers, spec.prefetch,
                                                        spec.gpu)
    masks, pad, contiguous_labels = spec.masks, spec.pad, spec.contiguous_labels
    if spec.service and manifest.kind == "coco":
        raise LoaderError("service= serves ImageFolder and captioned datasets (the CPU route); a COCO dataset is "
                          "not served: leave service out and use local workers")
    if manifest.kind == "captions":
        return _captions_route(reader, spec)
    if spec.captions is not None:
        raise LoaderError(f"text_transform and fields need a captioned dataset; this one is {manifest.kind!r}")
    if manifest.kind == "coco":
        # here only: COCO needs torchvision, whose import costs each process seconds of CPU
        from shardkit.loader.routes.coco import CocoRoute
        from shardkit.loader.routes.coco_gpu import CocoGpuRoute
        from shardkit.transforms.detection_geometry import gpu_unsupported

        if device.type == "cuda" and not isinstance(transform, ImageTransform):
            why = gpu_unsupported(transform)
            reason = why or gpu_decode_unavailable(device)
            if reason is None:
                return CocoGpuRoute(manifest, reader, transform, device=device, on_error=on_error,
                                    batch_size=batch_size, num_workers=num_workers, prefetch=prefetch, options=gpu,
                                    masks=masks, pad=pad, contiguous_labels=contiguous_labels)
            if why is None:
                device = device if torch.cuda.is_available() else torch.device("cpu")
                _warn_once("shardkit: GPU decoding unavailable (%s); COCO images are decoded and transformed on "
                           "the CPU, batches on %s (`shardkit doctor` checks CUDA and nvJPEG)", reason, device)
            elif torch.cuda.is_available():
                _warn_once("shardkit: the COCO GPU route cannot run this transform (%s); decoding and transforming "
                           "on the CPU, batches on %s", why, device)
            else:
                device = _deliverable(device)  # no CUDA at all: that is the one thing to say
        return CocoRoute(manifest, reader, transform, device=device, on_error=on_error, masks=masks, pad=pad,
                         contiguous_labels=contiguous_labels)
    if masks or pad or contiguous_labels:
        raise _needs_coco(masks, pad, contiguous_labels, manifest.kind)
    if _is_detection(transform):
        raise LoaderError(f"transforms.detection_train/detection_val need a COCO dataset; this one is "
                          f"{manifest.kind!r}: use transforms.imagenet_train/imagenet_val (or any callable on images)")
    device, gpu_route = _gpu_or_fallback(spec)
    if gpu_route and isinstance(transform, ImageTransform):
        return GpuRoute(reader, transform, device=device, on_error=on_error, batch_size=batch_size,
                        num_workers=num_workers, prefetch=prefetch, options=gpu, classes=manifest.classes)
    if not spec.service:  # the service's nodes decode, with their own decoder
        _warn_region_decoder(transform)
    return CpuRoute(reader, transform, device=device, on_error=on_error, batch_size=batch_size,
                    num_workers=num_workers, prefetch=prefetch, classes=manifest.classes)
