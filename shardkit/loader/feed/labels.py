"""What a feeder's ring slot holds beside a batch's images: its int64 labels, or for a captioned
dataset the one tensor its ``text_transform`` makes of the batch's captions (token ids padded
to a fixed length, e.g. :class:`~shardkit.transforms.ByteTokenizer`).

A slot is made before the feeder's first batch, so the shape and dtype of a captioned batch's
tensor are learnt before any feeder starts: :func:`probe_text` calls the text transform on two
batches of made-up captions (one short caption; two of different lengths) in the loader's
process, and a transform whose output is not one tensor with a row per caption, or whose rows
change with the captions (padding to the batch's longest), is refused there, naming why. A
transform that passes the probe and later returns another shape or dtype ends the epoch with a
:class:`~shardkit.errors.LoaderError` naming it (:meth:`SlotLabels.check`, in the feeder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shardkit.errors import LoaderError
from shardkit.loader.read.captions import CaptionTargets

__all__ = ["PROBE_CAPTIONS", "SlotLabels", "probe_text"]

#: The made-up captions :func:`probe_text` gives the text transform: one short, then two of
#: different lengths (a tokenizer that pads to the batch's longest caption shows it).
PROBE_CAPTIONS = (["a photo"], ["a cat", "a photograph of a dog running along a beach at sunset, seen from high above "
                                        "the water, with two boats and a lighthouse far away"])


@dataclass(frozen=True)
class SlotLabels:
    """Per sample, what a slot holds beside its image: an int64 label (``shape ()``), or with
    ``text`` a row of ``shape`` and ``dtype`` of the text transform's tensor.

    Example:
        >>> slot = SlotLabels((4,), torch.int64, text=True)
        >>> tuple(slot.empty(8, torch.device("cpu")).shape)
        (8, 4)
        >>> slot.check(torch.zeros((3, 4), dtype=torch.int32), 3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        shardkit.errors.LoaderError: text_transform returned torch.int32 (3, 4) for a batch of 3 captions; ...
    """

    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.int64
    text: bool = False

    def empty(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """A slot's tensor for ``batch_size`` samples on ``device``."""
        return torch.empty((batch_size, *self.shape), dtype=self.dtype, device=device)

    def check(self, labels: Any, n: int) -> None:
        """Refuse ``labels`` of a batch of ``n`` samples that a slot cannot hold.

        Raises:
            LoaderError: ``labels`` is not a tensor of ``n`` rows of :attr:`shape` and
                :attr:`dtype` (naming the text transform for a captioned batch).
        """
        if (isinstance(labels, torch.Tensor) and labels.dtype == self.dtype
                and tuple(labels.shape) == (n, *self.shape)):
            return
        got = _described(labels)
        if not self.text:
            raise LoaderError(f"labels of {got} for a batch of {n} do not fit the feeders' slots of "
                              f"{self.dtype} {(n, *self.shape)}; use feeders=0")
        raise LoaderError(f"text_transform returned {got} for a batch of {n} captions; the feeders' slots hold "
                          f"{self.dtype} {(n, *self.shape)}, as it returned when the loader tried it: feeders need "
                          "the same shape and dtype per caption in every batch; use feeders=0")


def _described(value: Any) -> str:
    """``value`` for messages: a tensor's dtype and shape, else its type."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def probe_text(captions: CaptionTargets | None) -> SlotLabels:
    """What a feeder's slots hold for a captioned dataset's batches (see the module doc): the text
    transform's output for :data:`PROBE_CAPTIONS`, which must be one tensor with a row per caption,
    of the same shape and dtype for both batches.

    Example:
        >>> from shardkit.transforms import ByteTokenizer
        >>> probe_text(CaptionTargets(text_transform=ByteTokenizer(77)))
        SlotLabels(shape=(77,), dtype=torch.int64, text=True)

    Raises:
        LoaderError: a one-line reason feeders cannot carry this text: no text transform (the
            captions are strings), ``fields`` (the text is a dict), a transform that fails on
            the probe, returns something else than one tensor, has no row per caption or rows
            that change with the captions.
    """
    transform = captions.text_transform if captions is not None else None
    if transform is None:
        raise LoaderError("feeders hand over one tensor per batch beside the images: a captioned dataset needs a "
                          "text_transform that returns one (e.g. transforms.ByteTokenizer(77)), not the captions as "
                          "strings; use feeders=0")
    assert captions is not None
    if captions.fields:
        raise LoaderError(f"feeders hand over one tensor per batch beside the images: with fields= "
                          f"({', '.join(captions.fields)}) a batch's text is a dict; use feeders=0")
    outputs = []
    for texts in PROBE_CAPTIONS:
        try:
            out = transform(list(texts))
        except Exception as err:
            raise LoaderError(f"text_transform failed on {len(texts)} made-up caption(s) ({type(err).__name__}: "
                              f"{err}): feeders try it before they start, to shape their slots; use "
                              "feeders=0") from err
        if not isinstance(out, torch.Tensor):
            raise LoaderError(f"text_transform returned {_described(out)}, not one tensor: feeders hand over one "
                              "tensor per batch beside the images (e.g. token ids padded to a fixed length); use "
                              "feeders=0")
        if out.dim() == 0 or out.shape[0] != len(texts):
            raise LoaderError(f"text_transform returned {_described(out)} for {len(texts)} caption(s): feeders need "
                              "one row per caption (a tensor [B, ...]); use feeders=0")
        outputs.append(out)
    one, two = outputs
    if one.shape[1:] != two.shape[1:] or one.dtype != two.dtype:
        raise LoaderError(f"text_transform's output changes with the captions ({_described(one)} for 1 short "
                          f"caption, {_described(two)} for 2 of different lengths): feeders need one shape and dtype "
                          "per caption (pad to a fixed length); use feeders=0")
    return SlotLabels(tuple(one.shape[1:]), one.dtype, text=True)
