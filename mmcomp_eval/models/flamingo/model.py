"""The Flamingo module: a vision tower, a Perceiver resampler and gated cross-attention around an unmodified causal LM.

The cross-attention is attached with forward pre-hooks, so the language
model keeps its own module tree and loads its weights with
``from_pretrained`` unchanged (MPT, RedPajama/GPT-NeoX, LLaMA, ...). A hook
on the language model counts, for every text token, the images before it;
a hook on every n-th decoder layer runs its cross-attention block first.

Generation runs with a KV cache, so after the prompt each forward sees one
new token. What it attends to is the original code's choice
(``generated_tokens_attend``):

* ``last_image``: OpenFlamingo's ``generate`` caches the prompt's media
  locations and lets new tokens attend to its last image -- also what
  Otter computes when it generates without a cache (Otter-MPT7B's config
  sets ``use_cache: false``), since each step then re-reads the whole sequence;
* ``no_image``: Otter with a cache (a LLaMA config's default) recomputes the
  media locations from each forward's own ``input_ids``; a lone new token
  holds no ``<image>``, so every token after the first attends to no image
  (its cross-attention output is zero; the gated feed-forward still runs).

Imports torch at the top: the adapter imports this module only when it
builds a model.
"""

from __future__ import annotations

import torch
from torch import nn

from mmcomp_eval.errors import UserError
from mmcomp_eval.models.flamingo.cross_attention import GatedCrossAttentionBlock
from mmcomp_eval.models.flamingo.resampler import PerceiverResampler
from mmcomp_eval.models.flamingo.vision import VISION_FEATURES, patch_features

#: what generated tokens attend to after the prompt (see the module docstring)
GENERATED_TOKENS_ATTEND = ("last_image", "no_image")
#: where transformers causal LMs keep their decoder layers
DECODER_LAYER_PATHS = ("model.layers", "transformer.blocks", "gpt_neox.layers", "transformer.h",
                       "model.decoder.layers")


def getattr_path(obj, path: str):
    """``getattr_path(lm, "model.layers")`` is ``lm.model.layers``."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def decoder_layers_path(lm) -> str:
    for path in DECODER_LAYER_PATHS:
        try:
            getattr_path(lm, path)
            return path
        except AttributeError:
            continue
    raise UserError(f"cannot find the decoder layers of {type(lm).__name__} "
                    f"(looked for {', '.join(DECODER_LAYER_PATHS)})")


class Flamingo(nn.Module):
    """A Flamingo around a ``CLIPVisionModel`` and a causal LM (weights of the new parts random until loaded)."""

    def __init__(self, vision_encoder, lang_encoder, media_token_id: int, cross_attn_every_n_layers: int,
                 vision_features: str = "patches", generated_tokens_attend: str = "last_image",
                 max_num_frames: int | None = None):
        super().__init__()
        if vision_features not in VISION_FEATURES:
            raise UserError(f"vision_features={vision_features!r} is not one of {', '.join(VISION_FEATURES)}")
        if generated_tokens_attend not in GENERATED_TOKENS_ATTEND:
            raise UserError(f"generated_tokens_attend={generated_tokens_attend!r} is not one of "
                            f"{', '.join(GENERATED_TOKENS_ATTEND)}")
        if cross_attn_every_n_layers < 1:
            raise UserError(f"cross_attn_every_n_layers={cross_attn_every_n_layers} must be at least 1")
        self.vision_encoder = vision_encoder
        self.lang_encoder = lang_encoder
        self.media_token_id = media_token_id
        self.vision_features = vision_features
        self.generated_tokens_attend = generated_tokens_attend
        self.cross_attn_every_n_layers = cross_attn_every_n_layers
        vis_dim = vision_encoder.config.hidden_size
        lang_dim = lang_encoder.get_input_embeddings().embedding_dim
        self.decoder_path = decoder_layers_path(lang_encoder)
        layers = getattr_path(lang_encoder, self.decoder_path)
        self.perceiver = PerceiverResampler(dim=vis_dim, max_num_frames=max_num_frames)
        self.gated_cross_attn_layers = nn.ModuleList([
            GatedCrossAttentionBlock(dim=lang_dim, dim_visual=vis_dim)
            if (i + 1) % cross_attn_every_n_layers == 0 else None for i in range(len(layers))])
        self._media = None         # (B, T_img, n, D) perceiver output of the current batch
        self._text_time = None     # (B, T) index (1-based) of the latest image per prompt token
        self._last_time = None     # (B,) images per prompt: what generated tokens attend to
        lang_encoder.register_forward_pre_hook(self._condition, with_kwargs=True)
        for i, layer in enumerate(layers):
            if self.gated_cross_attn_layers[i] is not None:
                layer.register_forward_pre_hook(self._hook(i), with_kwargs=True)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the Flamingo parts (the language model may be quantised)."""
        return self.perceiver.latents.dtype

    def decoder_layers(self) -> nn.ModuleList:
        return getattr_path(self.lang_encoder, self.decoder_path)

    # -- images --------------------------------------------------------

    def encode_images(self, pixel_values, counts: list[int]):
        """Perceiver latents for each row's images: (B, max(counts), n, D); absent images are zeros."""
        param = self.perceiver.latents
        n_lat, dim = param.shape
        media = torch.zeros(len(counts), max(max(counts), 1), n_lat, dim, dtype=param.dtype, device=param.device)
        if sum(counts):
            feats = patch_features(self.vision_encoder, pixel_values, self.vision_features).to(param.dtype)
            latents = self.perceiver(feats[:, None, None].to(param.device))[:, 0]  # (N, n, D)
            k = 0
            for row, c in enumerate(counts):
                media[row, :c] = latents[k:k + c]
                k += c
        return media

    # -- conditioning hooks --------------------------------------------

    def _condition(self, module, args, kwargs):
        if self._media is None:
            raise RuntimeError("Flamingo language model called without images; use Flamingo.generate")
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        rows, prompts = input_ids.shape[0], self._media.shape[0]
        if rows != prompts:  # beam search: generate repeats each prompt num_beams times, adjacent
            if rows % prompts:
                raise RuntimeError(f"{rows} rows for {prompts} prompts' images")
            self._media = self._media.repeat_interleave(rows // prompts, dim=0)
        if self._text_time is None or input_ids.shape[1] > 1:  # the whole sequence: count images so far
            locations = input_ids == self.media_token_id
            self._text_time = locations.cumsum(dim=-1)
            self._last_time = locations.sum(dim=-1)
        elif self.generated_tokens_attend == "no_image":  # Otter with a cache: no <image> in this input
            self._text_time = torch.zeros_like(input_ids)
        else:  # one generated token with the rest in the KV cache: the prompt's last image
            self._text_time = self._last_time[:, None].expand(input_ids.shape[0], input_ids.shape[1])
        return None

    def _hook(self, i: int):
        def cross_attend(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            block = self.gated_cross_attn_layers[i]
            out = block(hidden, self._media.to(hidden.device, hidden.dtype), self._text_time.to(hidden.device))
            if args:
                return (out, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": out}
        return cross_attend

    # -- running ---------------------------------------------------------

    def forward(self, pixel_values, counts: list[int], input_ids, attention_mask, **kwargs):
        """The language model's output on whole sequences (logits of every position), without a cache."""
        return self._with_images(pixel_values, counts,
                                 lambda: self.lang_encoder(input_ids=input_ids, attention_mask=attention_mask,
                                                           use_cache=False, **kwargs))

    def generate(self, pixel_values, counts: list[int], input_ids, attention_mask, **kwargs):
        return self._with_images(pixel_values, counts,
                                 lambda: self.lang_encoder.generate(input_ids=input_ids, attention_mask=attention_mask,
                                                                    **kwargs))

    def _with_images(self, pixel_values, counts: list[int], run):
        self._media = self.encode_images(pixel_values, counts)
        self._text_time = None
        try:
            return run()
        finally:
            self._media = self._text_time = self._last_time = None
