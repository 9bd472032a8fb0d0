"""The vision tower's output that Flamingo reads: CLIP's patch tokens, by default without CLIP's last LayerNorm.

OpenFlamingo runs open_clip's ``ViT-L-14`` (the same network as the Hub's
``openai/clip-vit-large-patch14``, loaded here as transformers'
``CLIPVisionModel``). open_clip before 2.23 -- what OpenFlamingo v2 was
trained with (its setup pins ``open_clip_torch>=2.16.0``) -- returns the
patch tokens *before* ``ln_post`` (``_global_pool`` splits the tokens and
only the pooled CLS token is normalised); Otter reads
``CLIPVisionModel(...)[0][:, 1:]``, the same tokens. So both default to
``patches``. open_clip 2.23 moved ``ln_post`` before the split, so an
OpenFlamingo run under a newer open_clip feeds the perceiver normalised
tokens, which the released weights never saw (``ln_post_patches``, kept to
reproduce such runs; in a tiny model it moves logits by about 2). Either way
the CLS token is dropped.
"""

from __future__ import annotations

#: which features feed the perceiver (see the module docstring)
VISION_FEATURES = ("patches", "ln_post_patches")


def patch_features(vision_encoder, pixel_values, vision_features: str):
    """``(N, patches, D)`` features of ``N`` images."""
    out = vision_encoder(pixel_values=pixel_values.to(vision_encoder.dtype))
    feats = out.last_hidden_state
    if vision_features == "ln_post_patches":
        tower = getattr(vision_encoder, "vision_model", vision_encoder)
        feats = tower.post_layernorm(feats)
    return feats[:, 1:]
