"""Released OpenFlamingo/Otter weight names <-> this package's module names, and loading them with one-line errors.

OpenFlamingo wraps each decoder layer in a ``FlamingoLayer``, so its
checkpoints spell the same weights several ways
(``lang_encoder.<layers>.i.gated_cross_attn_layer.*``,
``lang_encoder.gated_cross_attn_layers.i.*``, ``...decoder_layer.*``, FSDP's
``_checkpoint_wrapped_module``); here the language model is left unwrapped
and the blocks hang beside it, so every spelling is mapped onto one set of
names. :func:`export_state` writes the released formats back (how the test
checkpoints are made), so the mapping is tested in both directions.
"""

from __future__ import annotations

import re

from mmcomp_eval.errors import UserError

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
