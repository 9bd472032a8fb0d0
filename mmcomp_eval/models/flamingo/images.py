"""Pixels as each model's own code makes them: OpenFlamingo through open_clip, Otter through ``CLIPImageProcessor()``.

Both resize the shorter side to the tower's size (the longer one to
``int(size * long / short)``, bicubic, PIL), centre-crop a square and
normalise with OpenAI CLIP's mean and standard deviation. They differ in
the crop offset:

* ``open_clip`` (OpenFlamingo's ``image_processor``, the transform it was
  trained and evaluated with): torchvision's ``CenterCrop`` starts at
  ``round((w - size) / 2)``, Python's round (half to even);
* ``clip_processor`` (what Otter's demos, benchmarks and server build with
  ``transformers.CLIPImageProcessor()``): starts at ``(w - size) // 2``.

An EK-100 frame (456x256 -> 399x224) is cropped at x=88 by the first and at
x=87 by the second: one pixel column apart, which moves normalised pixel
values by up to 1.1 on a real frame (3.5 on noise). Neither original reads a checkpoint's
``preprocessor_config.json`` (Otter builds the processor with its defaults),
so neither does this module: the size comes from the vision tower's config.

transformers 5 gives ``CLIPImageProcessor`` a torchvision backend when
torchvision is installed (other resampling); ``clip_processor`` pins the
PIL backend, the arithmetic of the transformers 4 processor Otter ran with.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmcomp_eval.errors import UserError

if TYPE_CHECKING:
    import torch
    from PIL import Image

IMAGE_TRANSFORMS = ("open_clip", "clip_processor")


@dataclass(frozen=True)
class ImageTransform:
    """One of :data:`IMAGE_TRANSFORMS` at a square ``size``: PIL images -> ``(N, 3, size, size)`` float32."""

    name: str
    size: int

    def __post_init__(self) -> None:
        if self.name not in IMAGE_TRANSFORMS:
            raise UserError(f"model argument image_transform={self.name!r} is not one of {', '.join(IMAGE_TRANSFORMS)}")

    def __call__(self, images: Sequence[Image.Image]) -> torch.Tensor:
        import torch

        if self.name == "clip_processor":
            return self._clip_processor(images=list(images), return_tensors="pt")["pixel_values"]
        return torch.stack([self._open_clip(im) for im in images])

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size}

    def _open_clip(self, image: Image.Image) -> torch.Tensor:
        """torchvision's Resize(size, bicubic) + CenterCrop(size) on a PIL image, then ToTensor + Normalize."""
        import numpy as np
        import torch
        from PIL import Image
        from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

        w, h = image.size
        short, long = min(w, h), max(w, h)
        resized_long = int(self.size * long / short)
        new_w, new_h = (self.size, resized_long) if w <= h else (resized_long, self.size)
        image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
        left, top = round((new_w - self.size) / 2.0), round((new_h - self.size) / 2.0)
        image = image.crop((left, top, left + self.size, top + self.size)).convert("RGB")
        pixels = np.asarray(image, dtype=np.uint8).astype(np.float32) / np.float32(255)
        mean, std = np.asarray(OPENAI_CLIP_MEAN, np.float32), np.asarray(OPENAI_CLIP_STD, np.float32)
        return torch.from_numpy(np.ascontiguousarray(((pixels - mean) / std).transpose(2, 0, 1)))

    @functools.cached_property
    def _clip_processor(self):
        try:
            from transformers import CLIPImageProcessorPil as processor_class
        except ImportError:  # transformers 4: CLIPImageProcessor is the PIL one
            from transformers import CLIPImageProcessor as processor_class
        return processor_class(size={"shortest_edge": self.size}, crop_size={"height": self.size, "width": self.size})
