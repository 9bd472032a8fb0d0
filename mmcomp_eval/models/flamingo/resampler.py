"""The Perceiver resampler: a fixed number of latents per image, whatever the vision tower's patch count.

The language model's cross-attention reads these latents (64 per image in
OpenFlamingo v2) instead of the patch tokens. Parameter names and shapes
follow OpenFlamingo's ``perceiver.layers.<i>.<0|1>.*`` so released weights
load by name. Otter models trained on video frames (``max_num_frames`` in
their config) add a learned embedding per frame (``frame_embs``); an image
is frame 0.
"""

from __future__ import annotations

import torch
from torch import nn

from mmcomp_eval.models.flamingo.layers import feed_forward, split_heads


class PerceiverAttention(nn.Module):
    """Latents attend to the media tokens and to themselves."""

    def __init__(self, *, dim, dim_head=64, heads=8):
        super().__init__()
        self.scale, self.heads = dim_head**-0.5, heads
        inner = dim_head * heads
        self.norm_media, self.norm_latents = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x, latents):  # x: (b, T, n1, D), latents: (b, T, n2, D)
        x, latents = self.norm_media(x), self.norm_latents(latents)
        q = self.to_q(latents)
        k, v = self.to_kv(torch.cat((x, latents), dim=-2)).chunk(2, dim=-1)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))  # (b, h, T, n, d)
        sim = torch.einsum("...id,...jd->...ij", q * self.scale, k)
        attn = (sim - sim.amax(dim=-1, keepdim=True).detach()).softmax(dim=-1)
        out = torch.einsum("...ij,...jd->...id", attn, v)
        b, h, t, n, d = out.shape
        return self.to_out(out.permute(0, 2, 3, 1, 4).reshape(b, t, n, h * d))


class PerceiverResampler(nn.Module):
    def __init__(self, *, dim, depth=6, dim_head=64, heads=8, num_latents=64, ff_mult=4,
                 max_num_frames: int | None = None):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(num_latents, dim))
        self.frame_embs = nn.Parameter(torch.randn(max_num_frames, dim)) if max_num_frames else None
        self.layers = nn.ModuleList([nn.ModuleList([PerceiverAttention(dim=dim, dim_head=dim_head, heads=heads),
                                                    feed_forward(dim, ff_mult)]) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):  # x: (b, T, F, v, D) -> (b, T, num_latents, D)
        b, T, F, v, d = x.shape
        if self.frame_embs is not None:
            x = x + self.frame_embs[:F, None, :]
        x = x.reshape(b, T, F * v, d)
        latents = self.latents.expand(b, T, *self.latents.shape)
        for attn, ff in self.layers:
            latents = attn(x, latents) + latents
            latents = ff(latents) + latents
        return self.norm(latents)
