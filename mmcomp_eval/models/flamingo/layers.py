"""Pieces the Perceiver resampler and the gated cross-attention both use.

OpenFlamingo writes them once (``helpers.py``) and so do we: the parameter
names they create (``ff.0``, ``ff.1``, ``ff.3``) are part of the released
checkpoints' key names, so both users must build them the same way.
"""

from __future__ import annotations

import torch
from torch import nn


def feed_forward(dim: int, mult: int = 4) -> nn.Sequential:
    """LayerNorm, a bias-free MLP with GELU (OpenFlamingo's ``FeedForward``)."""
    inner = int(dim * mult)
    return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, inner, bias=False), nn.GELU(),
                         nn.Linear(inner, dim, bias=False))


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """``(b, [T,] n, h*d)`` -> ``(b, h, [T,] n, d)``."""
    *lead, n, hd = t.shape
    t = t.reshape(*lead, n, heads, hd // heads)
    return t.movedim(-2, 1)
