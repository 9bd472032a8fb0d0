"""The vision tower's output that Flamingo reads: CLIP patch tokens, with or without CLIP's last LayerNorm.

OpenFlamingo runs open_clip's ``ViT-L-14`` (the same network as the Hub's
``openai/clip-vit-large-patch14``, loaded here as transformers'
``CLIPVisionModel``) and feeds the perceiver the patch tokens after
``ln_post`` (``ln_post_patches``); Otter, built on transformers' CLIP, feeds
``last_hidden_state`` as it is (``patches``). Either way the CLS token is
dropped.
"""

from __future__ import annotations

#: which features feed the perceiver (see the module docstring)
VISION_FEATURES = ("ln_post_patches", "patches")


def patch_features(vision_encoder, pixel_values, vision_features: str):
    """``(N, patches, D)`` features of ``N`` images."""
    out = vision_encoder(pixel_values=pixel_values.to(vision_encoder.dtype))
    feats = out.last_hidden_state
    if vision_features == "ln_post_patches":
        tower = getattr(vision_encoder, "vision_model", vision_encoder)
        feats = tower.post_layernorm(feats)
    return feats[:, 1:]
