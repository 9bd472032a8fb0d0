"""Gated cross-attention: how text tokens see images, inserted before every n-th decoder layer.

Flamingo's masking rule lives here: a text token attends only to the most
recent ``<image>`` before it, and tokens before any image attend to none.
The tanh gates (``attn_gate``, ``ff_gate``) start at 0 in training, so an
untrained block leaves the language model unchanged. Names follow
OpenFlamingo's ``gated_cross_attn_layer.*``.
"""

from __future__ import annotations

import torch
from torch import nn

from mmcomp_eval.models.flamingo.layers import feed_forward, split_heads


class MaskedCrossAttention(nn.Module):
    def __init__(self, *, dim, dim_visual, dim_head=64, heads=8):
        super().__init__()
        self.scale, self.heads = dim_head**-0.5, heads
        inner = dim_head * heads
        self.norm = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim_visual, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x, media, text_time):
        """x: (B, T_txt, D); media: (B, T_img, n, Dv); text_time: (B, T_txt), 0 = no image yet."""
        _, t_img, n = media.shape[:3]
        q = split_heads(self.to_q(self.norm(x)), self.heads)               # (B, h, T_txt, d)
        k, v = self.to_kv(media.flatten(1, 2)).chunk(2, dim=-1)
        k, v = split_heads(k, self.heads), split_heads(v, self.heads)      # (B, h, T_img*n, d)
        sim = torch.einsum("...id,...jd->...ij", q * self.scale, k)
        media_time = torch.arange(t_img, device=x.device).repeat_interleave(n) + 1
        allowed = text_time[:, None, :, None] == media_time[None, None, None, :]
        sim = sim.masked_fill(~allowed, -torch.finfo(sim.dtype).max)
        attn = (sim - sim.amax(dim=-1, keepdim=True).detach()).softmax(dim=-1)
        attn = attn.masked_fill((text_time == 0)[:, None, :, None], 0.0)
        out = torch.einsum("...ij,...jd->...id", attn, v)
        b, h, t, d = out.shape
        return self.to_out(out.transpose(1, 2).reshape(b, t, h * d))


class GatedCrossAttentionBlock(nn.Module):
    def __init__(self, *, dim, dim_visual, dim_head=64, heads=8, ff_mult=4):
        super().__init__()
        self.attn = MaskedCrossAttention(dim=dim, dim_visual=dim_visual, dim_head=dim_head, heads=heads)
        self.attn_gate = nn.Parameter(torch.tensor([0.0]))
        self.ff = feed_forward(dim, ff_mult)
        self.ff_gate = nn.Parameter(torch.tensor([0.0]))

    def forward(self, x, media, text_time):
        x = self.attn(x, media, text_time) * self.attn_gate.tanh() + x
        return self.ff(x) * self.ff_gate.tanh() + x
