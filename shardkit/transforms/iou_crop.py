"""torchvision's ``RandomIoUCrop`` with the same draws, sampled about ten times faster.

v2's ``RandomIoUCrop`` draws an IoU threshold, then up to 40 candidate crops per threshold, and
for each candidate converts the boxes and computes their IoU with small torch ops; a COCO-like
image needs dozens of candidates, so its parameter sampling alone measured 7-8 ms per image at
800/1333 on our 2-core box, half of the CPU route's worker time. :class:`IoUCrop` draws the
same random numbers from torch's generator in the same order (``torch.randint`` per threshold,
two ``torch.rand(2)`` per candidate) and does the arithmetic in numpy float32, the dtype torch
computes it in, with the boxes converted once per image: the same crop for every seed
(tested against ``v2.RandomIoUCrop`` on random boxes, tests/transforms/test_iou_crop.py).
Cropping itself is v2's.

Example:
    >>> import torch
    >>> from torchvision import tv_tensors
    >>> boxes = tv_tensors.BoundingBoxes([[10.0, 10, 50, 60]], format="XYXY", canvas_size=(100, 120))
    >>> image = tv_tensors.Image(torch.zeros(3, 100, 120, dtype=torch.uint8))
    >>> _ = torch.manual_seed(3)
    >>> params = IoUCrop().make_params([image, boxes])
    >>> sorted(params) in ([], ['height', 'is_within_crop_area', 'left', 'top', 'width'])
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = ["IoUCrop"]

_F32 = np.float32


class IoUCrop(v2.RandomIoUCrop):
    """``v2.RandomIoUCrop`` (same arguments, draws and crops) with a faster parameter sampler;
    see the module doc."""

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        orig_h, orig_w = v2.query_size(flat_inputs)
        boxes = next(i for i in flat_inputs if isinstance(i, tv_tensors.BoundingBoxes))
        xyxy = F.convert_bounding_box_format(boxes.as_subclass(torch.Tensor), boxes.format,
                                             tv_tensors.BoundingBoxFormat.XYXY)
        b = xyxy.detach().to("cpu", torch.float32).numpy().reshape(-1, 4)
        x0, y0, x1, y1 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        # torch: 0.5 * (x0 + x2) in float32, area (x2 - x0) * (y2 - y0)
        cx, cy = _F32(0.5) * (x0 + x1), _F32(0.5) * (y0 + y1)
        area = (x1 - x0) * (y1 - y0)
        low, span = _F32(self.min_scale), _F32(self.max_scale - self.min_scale)
        fw, fh = _F32(orig_w), _F32(orig_h)
        while True:
            min_iou = self.options[int(torch.randint(low=0, high=len(self.options), size=(1,)))]
            if min_iou >= 1.0:  # leave the image as it is
                return {}
            for _ in range(self.trials):
                r = torch.rand(2).numpy()
                new_w, new_h = int(fw * (low + span * r[0])), int(fh * (low + span * r[1]))
                if not self.min_aspect_ratio <= new_w / new_h <= self.max_aspect_ratio:
                    continue
                r = torch.rand(2).numpy()
                left, top = int(_F32(orig_w - new_w) * r[0]), int(_F32(orig_h - new_h) * r[1])
                right, bottom = left + new_w, top + new_h
                if left == right or top == bottom:
                    continue
                within = (_F32(left) < cx) & (cx < _F32(right)) & (_F32(top) < cy) & (cy < _F32(bottom))
                if not within.any():
                    continue
                cl, ct, cr, cb = _F32(left), _F32(top), _F32(right), _F32(bottom)
                w = np.maximum(np.minimum(x1[within], cr) - np.maximum(x0[within], cl), _F32(0))
                h = np.maximum(np.minimum(y1[within], cb) - np.maximum(y0[within], ct), _F32(0))
                inter = w * h
                iou = inter / (area[within] + (cr - cl) * (cb - ct) - inter)
                if iou.max() < _F32(min_iou):  # NaN (0/0) passes, as torch's max and < do
                    continue
                return {"top": top, "left": left, "height": new_h, "width": new_w,
                        "is_within_crop_area": torch.from_numpy(within)}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        """v2's crop; a cropped image comes back in HWC memory (channels-last), where torch's uint8
        resize that follows takes its fast path: 0.9 instead of 3.4 ms from a 300x400 crop to
        800x1066 on our 2-core box (the crop's strided view takes the slow one). Same values."""
        parent: Any = super()  # torchvision < 0.21 names it _transform
        out = parent.transform(inpt, params) if hasattr(parent, "transform") else parent._transform(inpt, params)
        if params and isinstance(out, tv_tensors.Image) and out.dim() == 3 and out.numel():
            hwc = out.as_subclass(torch.Tensor).permute(1, 2, 0).contiguous().permute(2, 0, 1)
            return tv_tensors.wrap(hwc, like=out)
        return out

    _get_params = make_params  # torchvision < 0.21 calls them by these names
    _transform = transform
