"""OpenFlamingo and Otter, built natively from transformers parts (``--model open_flamingo`` / ``otter``).

The projects' own packages pin torch 2.0.1 and transformers 4.35.1, so
their code cannot run beside ours. A Flamingo model is small glue around
parts transformers already has, so it is rebuilt here:

* a CLIP vision tower (``CLIPVisionModel``; OpenFlamingo's open_clip
  ``ViT-L-14``/``openai`` is the same network as the Hub's
  ``openai/clip-vit-large-patch14``), whose patch tokens feed
* a Perceiver resampler (64 latents per image), whose output is read by
* gated cross-attention blocks placed before every n-th decoder layer of an
  unmodified transformers causal LM (MPT, RedPajama/GPT-NeoX, LLaMA, ...).

The modules below copy OpenFlamingo v2's parameter names and shapes
(``perceiver.layers.0.0.to_q.weight``, ``...gated_cross_attn_layer.attn_gate``)
so that a released ``checkpoint.pt`` loads by name, and its masking rule: a
text token attends only to the most recent ``<image>`` before it, tokens
before any image attend to none, and generated tokens attend to the prompt's
last image. The cross-attention is attached with forward pre-hooks, so the
language model keeps its own module tree and loads its weights with
``from_pretrained`` unchanged.

Checkpoint formats:

* ``openflamingo``: ``lang_encoder`` and ``vision_encoder`` from the Hub (or
  folders) plus the released ``checkpoint.pt`` (perceiver, cross-attention
  and the resized token embeddings).
* ``otter``: one HF-format folder (Otter's ``config.json`` with
  ``vision_config``/``text_config``, safetensors shards with
  ``vision_encoder.``/``perceiver.``/``lang_encoder.`` names); built from
  the configs, never with ``trust_remote_code``.

Prompts: the template's ``<image>`` is Flamingo's media token; each finished
few-shot example (a prompt line holding images, other than the last) ends
with ``<|endofchunk|>`` instead of a newline, as in OpenFlamingo's few-shot
evaluation, and generation stops at ``<|endofchunk|>``.

What was *not* verified here (no network, no weights): numerical parity with
the reference implementations on real checkpoints.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmcomp_eval.errors import UserError
from mmcomp_eval.models import decoding
from mmcomp_eval.models.hf import _bnb_config, _device, _guard, _resolve_pretrained
from mmcomp_eval.models.idefics import VisionLanguageAdapter, torch_dtype
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)

END_OF_CHUNK = "<|endofchunk|>"
#: where transformers causal LMs keep their decoder layers
DECODER_LAYER_PATHS = ("model.layers", "transformer.blocks", "gpt_neox.layers", "transformer.h",
                       "model.decoder.layers")
VISION_FEATURES = ("ln_post_patches", "patches")


def chunked(prompt: str) -> str:
    """End every finished example (a line with an image, not the last line) with ``<|endofchunk|>``."""
    lines = prompt.split("\n")
    out = []
    for k, line in enumerate(lines):
        last = k == len(lines) - 1
        out.append(line + ("" if last else END_OF_CHUNK if IMAGE_PLACEHOLDER in line else "\n"))
    return "".join(out)


def _getattr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def decoder_layers_path(lm) -> str:
    for path in DECODER_LAYER_PATHS:
        try:
            _getattr_path(lm, path)
            return path
        except AttributeError:
            continue
    raise UserError(f"cannot find the decoder layers of {type(lm).__name__} "
                    f"(looked for {', '.join(DECODER_LAYER_PATHS)})")


def _modules():
    """The Flamingo building blocks, defined on first use so that importing stays torch-free."""
    import torch
    from torch import nn

    def feed_forward(dim: int, mult: int = 4) -> nn.Sequential:
        inner = int(dim * mult)
        return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, inner, bias=False), nn.GELU(),
                             nn.Linear(inner, dim, bias=False))

    class PerceiverAttention(nn.Module):
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
            q, k, v = (_heads(t, self.heads) for t in (q, k, v))  # (b, h, T, n, d)
            sim = torch.einsum("...id,...jd->...ij", q * self.scale, k)
            attn = (sim - sim.amax(dim=-1, keepdim=True).detach()).softmax(dim=-1)
            out = torch.einsum("...ij,...jd->...id", attn, v)
            b, h, t, n, d = out.shape
            return self.to_out(out.permute(0, 2, 3, 1, 4).reshape(b, t, n, h * d))

    class PerceiverResampler(nn.Module):
        def __init__(self, *, dim, depth=6, dim_head=64, heads=8, num_latents=64, ff_mult=4):
            super().__init__()
            self.latents = nn.Parameter(torch.randn(num_latents, dim))
            self.layers = nn.ModuleList([nn.ModuleList([PerceiverAttention(dim=dim, dim_head=dim_head, heads=heads),
                                                        feed_forward(dim, ff_mult)]) for _ in range(depth)])
            self.norm = nn.LayerNorm(dim)

        def forward(self, x):  # x: (b, T, F, v, D) -> (b, T, num_latents, D)
            b, T, F, v, d = x.shape
            x = x.reshape(b, T, F * v, d)
            latents = self.latents.expand(b, T, *self.latents.shape)
            for attn, ff in self.layers:
                latents = attn(x, latents) + latents
                latents = ff(latents) + latents
            return self.norm(latents)

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
            q = _heads(self.to_q(self.norm(x)), self.heads)               # (B, h, T_txt, d)
            k, v = self.to_kv(media.flatten(1, 2)).chunk(2, dim=-1)
            k, v = _heads(k, self.heads), _heads(v, self.heads)            # (B, h, T_img*n, d)
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

    def _heads(t, h):
        *lead, n, hd = t.shape
        t = t.reshape(*lead, n, h, hd // h)
        return t.movedim(-2, 1)  # (b, [T,] n, h, d) -> (b, h, [T,] n, d)

    return PerceiverResampler, GatedCrossAttentionBlock


def build_flamingo(vision_encoder, lang_encoder, media_token_id: int, cross_attn_every_n_layers: int,
                   vision_features: str = "ln_post_patches"):
    """A Flamingo module around a ``CLIPVisionModel`` and a causal LM (weights of the new parts random)."""
    import torch
    from torch import nn

    PerceiverResampler, GatedCrossAttentionBlock = _modules()

    class Flamingo(nn.Module):
        def __init__(self):
            super().__init__()
            if vision_features not in VISION_FEATURES:
                raise UserError(f"vision_features={vision_features!r} is not one of {', '.join(VISION_FEATURES)}")
            if cross_attn_every_n_layers < 1:
                raise UserError(f"cross_attn_every_n_layers={cross_attn_every_n_layers} must be at least 1")
            self.vision_encoder = vision_encoder
            self.lang_encoder = lang_encoder
            self.media_token_id = media_token_id
            self.vision_features = vision_features
            self.cross_attn_every_n_layers = cross_attn_every_n_layers
            vis_dim = vision_encoder.config.hidden_size
            lang_dim = lang_encoder.get_input_embeddings().embedding_dim
            self.decoder_path = decoder_layers_path(lang_encoder)
            layers = _getattr_path(lang_encoder, self.decoder_path)
            self.perceiver = PerceiverResampler(dim=vis_dim)
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

        # -- images --------------------------------------------------------

        def encode_images(self, pixel_values, counts: list[int]):
            """Perceiver latents for each row's images: (B, max(counts), n, D); absent images are zeros."""
            param = self.perceiver.latents
            n_lat, dim = param.shape
            media = torch.zeros(len(counts), max(max(counts), 1), n_lat, dim, dtype=param.dtype, device=param.device)
            if sum(counts):
                out = self.vision_encoder(pixel_values=pixel_values.to(self.vision_encoder.dtype))
                feats = out.last_hidden_state
                if self.vision_features == "ln_post_patches":
                    tower = getattr(self.vision_encoder, "vision_model", self.vision_encoder)
                    feats = tower.post_layernorm(feats)
                feats = feats[:, 1:].to(param.dtype)  # patch tokens; the CLS token is dropped
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

        # -- generation ----------------------------------------------------

        def generate(self, pixel_values, counts: list[int], input_ids, attention_mask, **kwargs):
            self._media = self.encode_images(pixel_values, counts)
            self._text_time = None
            try:
                return self.lang_encoder.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            finally:
                self._media = self._text_time = self._last_time = None

    return Flamingo()


# -- checkpoint names ---------------------------------------------------------------------------------------


OPEN_CLIP_KEY = re.compile(r"^vision_encoder\.(conv1|class_embedding|positional_embedding|ln_pre|ln_post|proj"
                           r"|transformer\.resblocks)\b")


def remap_checkpoint(state: dict, decoder_path: str) -> tuple[dict, list[str]]:
    """OpenFlamingo/Otter state-dict names -> this module's names; also returns the keys dropped as duplicates.

    Handled spellings: ``perceiver.*``; ``lang_encoder.gated_cross_attn_layers.i.*`` and
    ``lang_encoder.<layers>.i.gated_cross_attn_layer.*`` (both the i-th block);
    ``lang_encoder.<layers>.i.decoder_layer.*`` (the LM's own layer i);
    ``lang_encoder.old_decoder_blocks.*`` (a duplicate, dropped); other ``lang_encoder.*``
    (the LM's own names, e.g. resized embeddings); ``vision_encoder.vision_model.*`` (HF CLIP).
    """
    layers = re.escape(decoder_path)
    wrapped = re.compile(rf"^lang_encoder\.{layers}\.(\d+)\.decoder_layer\.(.*)$")
    out, dropped = {}, []
    for key, value in state.items():
        key = key.removeprefix("module.").replace("._checkpoint_wrapped_module", "")
        if key.startswith("lang_encoder.old_decoder_blocks."):
            dropped.append(key)
            continue
        m = re.match(rf"^lang_encoder\.{layers}\.(\d+)\.gated_cross_attn_layer\.(.*)$", key) or \
            re.match(r"^lang_encoder\.gated_cross_attn_layers\.(\d+)\.(.*)$", key)
        if m:
            out[f"gated_cross_attn_layers.{m.group(1)}.{m.group(2)}"] = value
            continue
        m = wrapped.match(key)
        if m:
            out[f"lang_encoder.{decoder_path}.{m.group(1)}.{m.group(2)}"] = value
            continue
        if OPEN_CLIP_KEY.match(key):
            raise UserError(f"checkpoint key '{key}' is an open_clip vision weight; only transformers CLIP names "
                            "(vision_encoder.vision_model.*) are supported -- load the vision tower from the Hub")
        out[key] = value
    return out, dropped


def load_flamingo_state(model, state: dict, source: str, require_all: bool) -> dict:
    """Load ``state`` (any supported naming) into ``model``; one-line errors for anything that does not fit."""
    import torch

    mapped, dropped = remap_checkpoint(state, model.decoder_path)
    own = model.state_dict()
    # transformers 5 keeps CLIPVisionModel's layers at the top (no ``vision_model.``); older files have it
    mapped = {(k.replace("vision_encoder.vision_model.", "vision_encoder.", 1)
               if k not in own and k.startswith("vision_encoder.vision_model.") else k): v for k, v in mapped.items()}
    unexpected = [k for k in mapped if k not in own]
    if unexpected:
        raise UserError(f"{source}: {len(unexpected)} weights do not fit this model (first: '{unexpected[0]}'); "
                        "check cross_attn_every_n_layers and the language model")
    for k, v in mapped.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise UserError(f"{source}: weight '{k}' has shape {tuple(v.shape)}, the model {tuple(own[k].shape)}; "
                            "check the language model and tokenizer match the checkpoint")
    flamingo_keys = [k for k in own if k.startswith(("perceiver.", "gated_cross_attn_layers."))]
    missing = [k for k in flamingo_keys if k not in mapped]
    if missing:
        raise UserError(f"{source}: no weights for {len(missing)} Flamingo parameters (first: '{missing[0]}')")
    if require_all:
        rest = [k for k in own if k not in mapped]
        if rest:
            raise UserError(f"{source}: no weights for {len(rest)} parameters (first: '{rest[0]}')")
    with torch.no_grad():
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in mapped.items()}, strict=False)
    return {"loaded": len(mapped), "dropped_duplicates": len(dropped)}


def export_state(model, fmt: str) -> dict:
    """This module's weights under a released format's names (how random test checkpoints are written).

    ``openflamingo``: what OpenFlamingo's training script saves -- perceiver,
    cross-attention under ``lang_encoder.<layers>.i.gated_cross_attn_layer``,
    and the input embeddings. ``otter``: everything, with the LM's layers as
    ``lang_encoder.<layers>.i.decoder_layer``.
    """
    state = model.state_dict()
    path = model.decoder_path
    out = {}
    for k, v in state.items():
        m = re.match(r"^gated_cross_attn_layers\.(\d+)\.(.*)$", k)
        if m:
            out[f"lang_encoder.{path}.{m.group(1)}.gated_cross_attn_layer.{m.group(2)}"] = v
        elif k.startswith("perceiver."):
            out[k] = v
        elif fmt == "openflamingo":
            if k.startswith("lang_encoder.") and "embed" in k:  # its filter keeps the LM's *embed* weights
                out[k] = v
        else:
            m = re.match(rf"^lang_encoder\.{re.escape(path)}\.(\d+)\.(.*)$", k)
            if m:
                k = f"lang_encoder.{path}.{m.group(1)}.decoder_layer.{m.group(2)}"
            elif k.startswith("vision_encoder.") and not k.startswith("vision_encoder.vision_model."):
                k = "vision_encoder.vision_model." + k.removeprefix("vision_encoder.")  # Otter's (transformers 4) names
            out[k] = v
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


# -- the adapter --------------------------------------------------------------------------------------------


@MODELS.register("open_flamingo", aliases=("openflamingo",))
class FlamingoAdapter(VisionLanguageAdapter):
    """OpenFlamingo v2 (``checkpoint_format=openflamingo``) or Otter (``checkpoint_format=otter``)."""

    name = "open_flamingo"
    default_format = "openflamingo"

    def __init__(
        self,
        checkpoint: str,
        lang_encoder: str | None = None,
        tokenizer: str | None = None,
        vision_encoder: str = "openai/clip-vit-large-patch14",
        cross_attn_every_n_layers: int | None = None,
        checkpoint_format: str | None = None,
        vision_features: str | None = None,
        dtype: str = "auto",
        device: str | None = None,
        device_map: str | dict | None = None,
        load_in_4bit: bool = False,
        load_in_8bit: bool = False,
        batch_size: int = 4,
        max_length: int | None = None,
        images: bool = True,
        max_images: int | None = None,
        trust_remote_code: bool = False,
        local_files_only: bool = False,
        offline: bool = False,
    ):
        self._init_common(images, max_images, batch_size)
        fmt = checkpoint_format or self.default_format
        if fmt not in ("openflamingo", "otter"):
            raise UserError(f"model argument checkpoint_format={fmt!r} is not one of openflamingo, otter")
        if load_in_4bit and load_in_8bit:
            raise UserError("model arguments load_in_4bit and load_in_8bit exclude each other")
        self.format = fmt
        self.checkpoint = checkpoint
        self.quantization = "4bit" if load_in_4bit else "8bit" if load_in_8bit else None
        self.local_files_only = local_files_only or offline
        self.trust_remote_code = trust_remote_code
        torch_dt = torch_dtype(dtype)
        quant = _bnb_config(self.quantization, "bfloat16" if dtype == "auto" else dtype) if self.quantization else None
        if quant is not None:
            device_map = device_map or "auto"
        lm_kwargs: dict[str, Any] = {"dtype": torch_dt, "trust_remote_code": trust_remote_code,
                                     "local_files_only": self.local_files_only}
        if quant is not None:
            lm_kwargs["quantization_config"] = quant
        if device_map is not None:
            lm_kwargs["device_map"] = device_map
        if fmt == "openflamingo":
            if not lang_encoder:
                raise UserError("open_flamingo needs --model-args lang_encoder=<causal LM id or folder>")
            self.model, self.tokenizer, self.image_processor, self.load_info = self._load_openflamingo(
                lang_encoder, tokenizer or lang_encoder, vision_encoder, cross_attn_every_n_layers or 1,
                vision_features or "ln_post_patches", lm_kwargs)
        else:
            if quant is not None or device_map is not None:
                raise UserError("otter loads its single folder onto one device: drop device_map/load_in_*bit")
            self.model, self.tokenizer, self.image_processor, self.load_info = self._load_otter(
                cross_attn_every_n_layers, vision_features or "patches", lm_kwargs)
        self.model.eval()
        decoding.ignore_checkpoint_defaults(self.model.lang_encoder)  # Flamingo.generate is the LM's generate
        if device_map is None and quant is None:
            self.model.to(_device(device))
        else:  # the LM is dispatched; keep the vision tower, perceiver and each block beside what uses them
            first = self.model.lang_encoder.get_input_embeddings().weight.device
            self.model.vision_encoder.to(first)
            self.model.perceiver.to(first)
            layers = _getattr_path(self.model.lang_encoder, self.model.decoder_path)
            for block, layer in zip(self.model.gated_cross_attn_layers, layers):
                if block is not None:
                    block.to(next(layer.parameters()).device)
        self.device = self.model.lang_encoder.get_input_embeddings().weight.device
        tok = self.tokenizer
        tok.padding_side = "left"
        self.eoc_id = tok.convert_tokens_to_ids(END_OF_CHUNK)
        self.eos_ids = {i for i in (self.eoc_id, tok.eos_token_id) if i is not None}
        cfg = self.model.lang_encoder.config
        lengths = (getattr(cfg, a, None) for a in ("max_position_embeddings", "max_seq_len", "n_positions"))
        self.max_length = max_length or next((n for n in lengths if n), 2048)

    # -- loading -------------------------------------------------------------------------------------------

    def _load_openflamingo(self, lang_id, tok_id, vision_id, every_n, features, lm_kwargs):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, CLIPImageProcessor, CLIPVisionModel

        common = {"local_files_only": self.local_files_only}
        lang_src, tok_src, vis_src = (_resolve_pretrained(x) for x in (lang_id, tok_id, vision_id))
        tokenizer = _guard(tok_id, lambda: AutoTokenizer.from_pretrained(
            tok_src, trust_remote_code=self.trust_remote_code, **common))
        tokenizer.add_special_tokens({"additional_special_tokens": [END_OF_CHUNK, IMAGE_PLACEHOLDER]})
        if tokenizer.pad_token is None:
            tokenizer.add_special_tokens({"pad_token": "<PAD>"})
        lm = _guard(lang_id, lambda: AutoModelForCausalLM.from_pretrained(lang_src, **lm_kwargs))
        with torch.random.fork_rng(devices=[]):  # rows for the new tokens: deterministic where the checkpoint has none
            torch.manual_seed(0)
            lm.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        vision = _guard(vision_id, lambda: CLIPVisionModel.from_pretrained(vis_src, dtype=lm_kwargs["dtype"], **common))
        processor = _guard(vision_id, lambda: CLIPImageProcessor.from_pretrained(vis_src, **common))
        model = build_flamingo(vision, lm, tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER), every_n, features)
        model.perceiver.to(lm_kwargs["dtype"])
        model.gated_cross_attn_layers.to(lm_kwargs["dtype"])
        ckpt = self._checkpoint_file("checkpoint.pt")
        try:
            state = torch.load(ckpt, map_location="cpu", weights_only=True)
        except Exception as exc:  # unpickling errors come in many classes
            raise UserError(f"cannot read OpenFlamingo checkpoint {ckpt}: {' '.join(str(exc).split())[:160]}") from None
        info = load_flamingo_state(model, state, str(ckpt), require_all=False)
        return model, tokenizer, processor, info

    def _load_otter(self, every_n, features, lm_kwargs):
        from safetensors.torch import load_file
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoTokenizer,
            CLIPImageProcessor,
            CLIPVisionConfig,
            CLIPVisionModel,
        )

        folder = Path(self._checkpoint_file("config.json")).parent
        cfg = json.loads((folder / "config.json").read_text())
        text_cfg = dict(cfg.get("text_config") or {})
        if "model_type" not in text_cfg or "vision_config" not in cfg:
            raise UserError(f"{folder}/config.json is not an Otter config "
                            "(needs text_config.model_type and vision_config)")
        lm_config = AutoConfig.for_model(text_cfg.pop("model_type"), **text_cfg)
        lm = AutoModelForCausalLM.from_config(lm_config, dtype=lm_kwargs["dtype"])
        vision = CLIPVisionModel(CLIPVisionConfig(**cfg["vision_config"])).to(lm_kwargs["dtype"])
        tokenizer = _guard(str(folder), lambda: AutoTokenizer.from_pretrained(folder, local_files_only=True))
        if lm.get_input_embeddings().num_embeddings != len(tokenizer):
            lm.resize_token_embeddings(len(tokenizer))
        processor = CLIPImageProcessor.from_pretrained(folder, local_files_only=True)
        every = every_n or int(cfg.get("cross_attn_every_n_layers", 4))
        model = build_flamingo(vision, lm, tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER), every, features)
        model.to(lm_kwargs["dtype"])
        shards = sorted(folder.glob("*.safetensors"))
        if not shards:
            raise UserError(f"{folder} has no .safetensors weights")
        state = {}
        for shard in shards:
            state.update(load_file(shard))
        info = load_flamingo_state(model, state, str(folder), require_all=True)
        return model, tokenizer, processor, info

    def _checkpoint_file(self, filename: str) -> Path:
        """``checkpoint`` as a file, a folder holding ``filename``, or a Hub repo id."""
        path = Path(self.checkpoint).expanduser()
        if path.is_file():
            return path
        if path.is_dir():
            if not (path / filename).is_file():
                raise UserError(f"checkpoint folder {path} has no {filename}")
            return path / filename
        if self.checkpoint.startswith(("/", ".", "~")) or self.checkpoint.count("/") != 1:
            raise UserError(f"checkpoint {self.checkpoint} does not exist")
        from huggingface_hub import hf_hub_download, snapshot_download

        if self.format == "otter":
            return Path(_guard(self.checkpoint, lambda: snapshot_download(
                self.checkpoint, local_files_only=self.local_files_only))) / filename
        return Path(_guard(self.checkpoint, lambda: hf_hub_download(
            self.checkpoint, filename, local_files_only=self.local_files_only)))

    # -- generation ----------------------------------------------------------------------------------------

    def _render(self, request) -> str:
        text = request.prompt if request.messages is None else self._chat(request.messages)
        text = chunked(text)
        from mmcomp_eval.models.idefics import strip_placeholders

        return text if self.reads_images else strip_placeholders(text)

    def encode(self, prompts: list[str], images) -> dict:
        """Left-padded token ids, and the images in prompt order with each row's image count."""
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding="longest")
        counts = (enc["input_ids"] == self.model.media_token_id).sum(dim=1).tolist()
        flat = []
        if images is not None:
            for row, (n, imgs) in enumerate(zip(counts, images)):
                if n != len(imgs):
                    raise UserError(f"prompt {row} of the batch has {n} {IMAGE_PLACEHOLDER} tokens but {len(imgs)} "
                                    "images")
            flat = [im for row in images for im in row]
        else:
            counts = [0] * len(prompts)
        pixels = self.image_processor(images=flat, return_tensors="pt")["pixel_values"] if flat else None
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "pixel_values": pixels,
                "counts": counts}

    def _generate_batch(self, prompts, images, settings, requests):
        import torch

        tok = self.tokenizer
        enc = self.encode(prompts, images)
        input_ids, attention_mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        counts, pixels = enc["counts"], enc["pixel_values"]
        if pixels is not None:
            pixels = pixels.to(self.device)
        self._check_room(requests, attention_mask.sum(dim=1).tolist(), settings)
        width = input_ids.shape[1]
        with torch.inference_mode():
            out = self.model.generate(pixels, counts, input_ids, attention_mask,
                                      **self._decoding(settings, requests, width, tok, self.eos_ids))
        return decoding.decode_new(tok, out[:, width:], self.eos_ids, settings.stop)

    def fingerprint(self) -> dict[str, Any]:
        import torch
        import transformers

        return {
            "name": self.name, "checkpoint": self.checkpoint, "format": self.format,
            "cross_attn_every_n_layers": self.model.cross_attn_every_n_layers,
            "vision_features": self.model.vision_features, "images": self.reads_images,
            "dtype": str(self.model.perceiver.latents.dtype).removeprefix("torch."),
            "quantization": self.quantization, "language_model": type(self.model.lang_encoder).__name__,
            "device": self.device.type, "max_length": self.max_length, "loaded": self.load_info,
            "transformers": transformers.__version__, "torch": torch.__version__,
        }


@MODELS.register("otter")
class OtterAdapter(FlamingoAdapter):
    """Otter: a Flamingo whose HF-format folder holds every weight (vision, perceiver, LM)."""

    name = "otter"
    default_format = "otter"

    def __init__(self, checkpoint: str, **kwargs: Any):
        super().__init__(checkpoint, **kwargs)


_OF = "openai/clip-vit-large-patch14"
MODELS.add_preset("openflamingo-3b", "open_flamingo",
                  "OpenFlamingo-3B-vitl-mpt1b; its MosaicGPT-1B language model exists only as remote code: "
                  "add trust_remote_code=true if you trust it",
                  checkpoint="openflamingo/OpenFlamingo-3B-vitl-mpt1b",
                  lang_encoder="anas-awadalla/mpt-1b-redpajama-200b",
                  cross_attn_every_n_layers=1, vision_encoder=_OF)
MODELS.add_preset("openflamingo-4b", "open_flamingo", "OpenFlamingo-4B-vitl-rpj3b (RedPajama-INCITE-Base-3B)",
                  checkpoint="openflamingo/OpenFlamingo-4B-vitl-rpj3b",
                  lang_encoder="togethercomputer/RedPajama-INCITE-Base-3B-v1", cross_attn_every_n_layers=2,
                  vision_encoder=_OF)
MODELS.add_preset("openflamingo-4b-instruct", "open_flamingo", "OpenFlamingo-4B-vitl-rpj3b-langinstruct",
                  checkpoint="openflamingo/OpenFlamingo-4B-vitl-rpj3b-langinstruct",
                  lang_encoder="togethercomputer/RedPajama-INCITE-Instruct-3B-v1", cross_attn_every_n_layers=2,
                  vision_encoder=_OF)
MODELS.add_preset("openflamingo-9b", "open_flamingo", "OpenFlamingo-9B-vitl-mpt7b (the paper's Table 14)",
                  checkpoint="openflamingo/OpenFlamingo-9B-vitl-mpt7b", lang_encoder="anas-awadalla/mpt-7b",
                  cross_attn_every_n_layers=4, vision_encoder=_OF)
MODELS.add_preset("otter-image-mpt7b", "otter", "Otter-Image-MPT7B", checkpoint="luodian/OTTER-Image-MPT7B")
MODELS.add_preset("otter-9b-incontext", "otter", "OTTER-9B-LA-InContext (LLaMA-7B)",
                  checkpoint="luodian/OTTER-9B-LA-InContext")


# -- random-weight checkpoints (tests) ----------------------------------------------------------------------

TINY_LMS = {
    "llama": dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False),
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=1024),
    "mpt": dict(model_type="mpt", d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=1024),
}
TINY_CLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=30,
                 patch_size=10, hidden_act="quick_gelu")


def save_random_flamingo(folder: Path, corpus, fmt: str = "openflamingo", lm: str = "llama",
                         cross_attn_every_n_layers: int = 1, seed: int = 0) -> Path:
    """A tiny random Flamingo in a released format, loadable by :class:`FlamingoAdapter`.

    ``openflamingo``: ``lang/`` (LM + tokenizer, before the special tokens are
    added), ``vision/`` (CLIP tower + processor) and ``checkpoint.pt``
    written under OpenFlamingo's names. ``otter``: one folder with Otter's
    ``config.json``, ``model.safetensors``, tokenizer and image processor.
    The gates start at 1 (trained checkpoints learn them from 0) and the
    new layers are initialised as widely as the LM, so that images change
    the output.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    from mmcomp_eval.models.idefics import random_tokenizer

    folder = Path(folder)
    torch.manual_seed(seed)
    tokenizer, _ = random_tokenizer(corpus)
    spec = dict(TINY_LMS[lm])
    lm_config = AutoConfig.for_model(spec.pop("model_type"), vocab_size=len(tokenizer), **spec,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                     pad_token_id=tokenizer.pad_token_id)
    lm_config.initializer_range = 0.5
    language = AutoModelForCausalLM.from_config(lm_config)
    vision = CLIPVisionModel(CLIPVisionConfig(**TINY_CLIP))
    processor = CLIPImageProcessor(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30})
    specials = [END_OF_CHUNK, IMAGE_PLACEHOLDER] + (["<answer>"] if fmt == "otter" else [])
    if fmt == "openflamingo":
        language.save_pretrained(folder / "lang")
        tokenizer.save_pretrained(folder / "lang")
        vision.save_pretrained(folder / "vision")
        processor.save_pretrained(folder / "vision")
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    language.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model = build_flamingo(vision, language, tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER),
                           cross_attn_every_n_layers, "ln_post_patches" if fmt == "openflamingo" else "patches")
    with torch.no_grad():  # the new parts get the LM's spread (0.5), so images visibly change the output
        for block in [*model.gated_cross_attn_layers, model.perceiver]:
            if block is not None:
                for name, param in block.named_parameters():
                    if name.endswith("gate"):
                        param.fill_(1.0)
                    elif param.dim() == 2 and "latents" not in name:
                        param.normal_(0.0, 0.5)
    state = export_state(model, fmt)
    if fmt == "openflamingo":
        torch.save(state, folder / "checkpoint.pt")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({
            "model_type": "otter", "cross_attn_every_n_layers": cross_attn_every_n_layers,
            "vision_config": vision.config.to_dict(), "text_config": language.config.to_dict()}, indent=1))
        save_file(state, folder / "model.safetensors")
        tokenizer.save_pretrained(folder)
        processor.save_pretrained(folder)
    return folder
