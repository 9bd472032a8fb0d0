"""Keyframe strategies: which frames stand for a clip, and how they become one image.

A template places one ``<image>`` per clip, so every strategy turns a clip
(first and last frame number) into exactly one image:

* ``middle`` -- the clip's middle frame (what CompAct used for ImageBind);
* ``uniform`` -- ``n`` evenly spaced frames tiled into one grid image, so a
  single-image slot still shows the clip's motion;
* ``informative`` -- ``n`` evenly spaced candidates scored by a pluggable
  scorer; the best-scoring frame wins (ties: the earliest). CompAct (A.3.1)
  ran an object detector and kept the frame with the most proposals: that is
  the ``detector`` scorer, available when a detection checkpoint can be
  loaded; ``sharpness`` (gradient energy, no model) is the default.

Scorers are registered in :data:`SCORERS` as factories ``options -> scorer``
where a scorer maps a list of images to one float each; register your own
with ``@SCORERS.register("name")``. A strategy's :meth:`describe` goes into
the keyframe cache key, so changing a strategy or its options never reuses a
stale keyframe.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.media.video import uniform_indices
from mmcomp_eval.registry import Registry

if TYPE_CHECKING:
    from PIL import Image

Scorer = Callable[[Sequence["Image.Image"]], list[float]]
SCORERS: Registry[Callable[..., Scorer]] = Registry("keyframe scorer")


class KeyframeStrategy:
    name = "strategy"
    #: accepted options and their defaults
    defaults: dict[str, Any] = {}

    def __init__(self, **options: Any):
        for key in options:
            if key not in self.defaults:
                raise UserError(f"keyframe strategy '{self.name}' has no option '{key}'"
                                f"{did_you_mean(key, self.defaults)}; accepted: {', '.join(self.defaults) or 'none'}")
        self.options = {**self.defaults, **options}

    def frames(self, start: int, stop: int) -> list[int]:
        """The frame numbers to read for a clip spanning ``[start, stop]``."""
        raise NotImplementedError

    def combine(self, images: list[Image.Image]) -> Image.Image:
        """One image from the frames read (same order as :meth:`frames`)."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, **self.options}


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"keyframe option n={value!r} of '{name}' must be a positive integer")
    return value


class Middle(KeyframeStrategy):
    name = "middle"

    def frames(self, start: int, stop: int) -> list[int]:
        return [(start + stop) // 2]

    def combine(self, images):
        return images[0]


class Uniform(KeyframeStrategy):
    name = "uniform"
    defaults = {"n": 4}

    def __init__(self, **options):
        super().__init__(**options)
        _count(self.name, self.options["n"])

    def frames(self, start: int, stop: int) -> list[int]:
        return uniform_indices(start, stop, self.options["n"])

    def combine(self, images):
        return tile(images)


class Informative(KeyframeStrategy):
    name = "informative"
    defaults = {"n": 8, "scorer": "sharpness", "scorer_options": {}}

    def __init__(self, **options):
        super().__init__(**options)
        _count(self.name, self.options["n"])
        if not isinstance(self.options["scorer_options"], dict):
            raise UserError(f"keyframe option scorer_options of '{self.name}' must be a mapping")
        factory = SCORERS.get(str(self.options["scorer"]))
        self._scorer = factory(**self.options["scorer_options"])

    def frames(self, start: int, stop: int) -> list[int]:
        return sorted(set(uniform_indices(start, stop, self.options["n"])))

    def combine(self, images):
        scores = self._scorer(images)
        best = max(range(len(images)), key=lambda i: (scores[i], -i))
        return images[best]


STRATEGIES: dict[str, type[KeyframeStrategy]] = {c.name: c for c in (Middle, Uniform, Informative)}


def build_strategy(name: str, options: dict | None = None) -> KeyframeStrategy:
    if name not in STRATEGIES:
        raise UserError(f"unknown keyframe strategy '{name}'{did_you_mean(name, STRATEGIES)}; "
                        f"known: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name](**(options or {}))


def tile(images: Sequence[Image.Image]) -> Image.Image:
    """Frames in reading order on a near-square grid (empty cells black)."""
    from PIL import Image

    if len(images) == 1:
        return images[0]
    w, h = images[0].size
    cols = math.ceil(math.sqrt(len(images)))
    rows = math.ceil(len(images) / cols)
    canvas = Image.new("RGB", (cols * w, rows * h))
    for k, im in enumerate(images):
        if im.size != (w, h):
            im = im.resize((w, h), Image.Resampling.BICUBIC)
        canvas.paste(im, ((k % cols) * w, (k // cols) * h))
    return canvas


def resize_short_side(image: Image.Image, short: int) -> Image.Image:
    """Downscale so the shorter side is ``short`` pixels (never upscale; 0 keeps the size)."""
    from PIL import Image

    w, h = image.size
    if not short or min(w, h) <= short:
        return image
    scale = short / min(w, h)
    return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BICUBIC)


# -- scorers -------------------------------------------------------------------


@SCORERS.register("sharpness")
def sharpness_scorer() -> Scorer:
    """Mean squared intensity gradient: blurred or blank frames score low, busy sharp ones high."""
    import numpy as np

    def score(images):
        out = []
        for im in images:
            g = np.asarray(im.convert("L"), dtype=np.float64)
            dx = np.diff(g, axis=1)
            dy = np.diff(g, axis=0)
            out.append(float((dx**2).mean() + (dy**2).mean()) if g.size > 1 else 0.0)
        return out

    return score


@SCORERS.register("detector")
def detector_scorer(model: str | None = None, threshold: float = 0.5, device: str = "cpu",
                    local_files_only: bool = False) -> Scorer:
    """Number of detections above ``threshold`` (CompAct A.3.1's "most object proposals").

    ``model`` is any ``transformers`` object-detection checkpoint (a Hub id
    or a folder), e.g. ``hustvl/yolos-small`` or ``facebook/detr-resnet-50``.
    """
    if not model:
        raise UserError("keyframe scorer 'detector' needs scorer_options: {model: <detection checkpoint>}")
    detector, processor = _load_detector(str(model), device, bool(local_files_only))

    def score(images):
        import torch

        with torch.inference_mode():
            inputs = processor(images=list(images), return_tensors="pt").to(device)
            outputs = detector(**inputs)
        sizes = [(im.size[1], im.size[0]) for im in images]
        found = processor.post_process_object_detection(outputs, threshold=float(threshold), target_sizes=sizes)
        return [float(len(r["scores"])) for r in found]

    return score


@functools.cache
def _load_detector(model: str, device: str, local_files_only: bool):
    try:
        from transformers import AutoImageProcessor, AutoModelForObjectDetection

        processor = AutoImageProcessor.from_pretrained(model, local_files_only=local_files_only)
        detector = AutoModelForObjectDetection.from_pretrained(model, local_files_only=local_files_only)
    except (OSError, ValueError, ImportError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"keyframe detector '{model}' cannot be loaded: {reason}") from None
    return detector.to(device).eval(), processor
