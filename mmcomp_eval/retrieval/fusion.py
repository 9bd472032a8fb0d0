"""The arithmetic of the ``fusion`` baseline: per-modality cosines, normalised over the gallery, weighted, summed.

Raw cosines from different embedding spaces are not comparable, and a sum of
them rewards having a part at all: CLIP gives any two texts a cosine of about
+0.3, so an *unrelated* transcript lifts its video above every video without
one (on the tiny test CLIP, captions of videos with an unrelated transcript
ranked 4.1 on average against 16.4 without, where CLIP alone gave 7.9 and 7.5;
see docs/retrieval.md). So
each modality's score is z-scored per caption over the videos that have that
modality, and a video without it scores that gallery mean, 0::

    z_m(c, v) = (cos_m(c, v) - mean_{u in V_m} cos_m(c, u)) / std_{u in V_m} cos_m(c, u)   if v in V_m, else 0
    s(c, v)   = sum_m w_m z_m(c, v)

A missing transcript or audio track then neither helps nor hurts a video: it
scores what an average member of the gallery scores, and an unrelated part
scores that on average too.

This stays a dot product, so ranking still runs blockwise from embeddings
without a captions x videos matrix: with ``mu_m`` the mean and ``Sigma_m``
the covariance of the present videos' embeddings,
``cos_m(c, u) - mean = t_m(c) . (e_m(u) - mu_m)`` and
``std^2 = t_m(c)^T Sigma_m t_m(c)``. The caption vector is
``w_m t_m(c) / std_m(c)`` and the video vector ``e_m(v) - mu_m`` (zero when
absent), concatenated over modalities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mmcomp_eval.errors import UserError

#: how per-modality cosines are made comparable before they are weighted and summed
NORMALISATIONS = {
    "zscore": "each modality's cosines z-scored per caption over the videos that have that modality; a video "
              "without it scores the gallery mean (0)",
    "none": "raw cosines from different spaces summed; a missing part scores 0, so having any part moves a "
            "video up (kept only to measure that bias)",
}
#: a caption whose scores in a modality vary less than this over the gallery gets no term from it
MIN_STD = 1e-6


@dataclass(frozen=True)
class Modality:
    """One part of the fused score: caption-side and video-side embeddings in one space."""

    name: str
    weight: float
    #: (captions, d) unit vectors
    captions: np.ndarray
    #: (videos, d) unit vectors; an all-zero row means the video lacks this part
    videos: np.ndarray

    @property
    def present(self) -> np.ndarray:
        return np.any(self.videos != 0, axis=1)


def fusion_vectors(modalities: Sequence[Modality], normalise: str = "zscore") -> tuple[np.ndarray, np.ndarray]:
    """Caption and video vectors whose dot product is the fused score ``sum_m w_m z_m(c, v)``."""
    if normalise not in NORMALISATIONS:
        raise UserError(f"model argument normalise={normalise} is not one of {', '.join(NORMALISATIONS)}")
    caption_parts, video_parts = [], []
    for m in modalities:
        if m.weight == 0:
            continue
        if normalise == "none":
            caption_parts.append(m.weight * m.captions.astype(np.float64))
            video_parts.append(m.videos.astype(np.float64))
            continue
        t, v = _zscored(m)
        caption_parts.append(t)
        video_parts.append(v)
    n_c = modalities[0].captions.shape[0] if modalities else 0
    n_v = modalities[0].videos.shape[0] if modalities else 0
    if not caption_parts:
        return np.zeros((n_c, 1)), np.zeros((n_v, 1))
    return np.concatenate(caption_parts, axis=1), np.concatenate(video_parts, axis=1)


def _zscored(m: Modality) -> tuple[np.ndarray, np.ndarray]:
    present = m.present
    t = m.captions.astype(np.float64)
    centred = np.zeros(m.videos.shape, dtype=np.float64)
    if not present.any():  # nobody has this part: it adds nothing
        return np.zeros_like(t), centred
    e = m.videos[present].astype(np.float64)
    centred[present] = e - e.mean(axis=0)
    cov = centred[present].T @ centred[present] / len(e)
    std = np.sqrt(np.maximum(np.einsum("id,de,ie->i", t, cov, t), 0.0))
    scale = np.divide(m.weight, std, out=np.zeros_like(std), where=std > MIN_STD)
    return t * scale[:, None], centred
