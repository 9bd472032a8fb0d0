"""A Flamingo's weights written under the originals' names, as their own code saves them (for test checkpoints).

The inverse of :mod:`mmcomp_eval.models.flamingo.checkpoint`, written from
what the originals' code does rather than from that module, so that loading
a checkpoint made here tests the mapping against the originals' naming:

* :func:`openflamingo_checkpoint`: what OpenFlamingo's training script keeps
  (``filter_state_dict_to_trainable``): the perceiver
  (``perceiver.layers.i.0.*`` attention, ``.1.{0,1,3}`` feed-forward), the
  cross-attention under ``lang_encoder.<layers>.i.gated_cross_attn_layer.*``
  (feed-forward ``ff.*``), and every language-model weight whose name holds
  ``embed`` plus the (trained) input embeddings -- under the names
  transformers 4 gave them (GPT-NeoX's output layer is ``embed_out``; a
  LLaMA's untied ``lm_head`` is *not* saved);
* :func:`otter_state`: Otter's ``save_pretrained``: everything, the decoder
  layers wrapped (``...<layers>.i.decoder_layer.*``), the perceiver's layers
  flat (``perceiver.layers.i.to_q``, ``.feed_forward.{0,1,3}``), the blocks'
  feed-forward ``feed_forward.*``, tied weights once (Otter's MPT has no
  ``lm_head``), the vision tower under ``vision_model.`` and the buffers
  transformers 4.30 persisted (CLIP's ``position_ids``, LLaMA's
  ``rotary_emb.inv_freq``).

torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import re


def _lm_state_v4(lm) -> dict:
    """The language model's weights under transformers 4's names (what ``save_pretrained`` writes back)."""
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(lm, dict(lm.state_dict()))


def openflamingo_checkpoint(model) -> dict:
    """``model``'s ``checkpoint.pt`` as OpenFlamingo writes it (see the module docstring)."""
    path = model.decoder_path
    out = {k: v for k, v in model.state_dict().items() if k.startswith("perceiver.")}
    for k, v in model.gated_cross_attn_layers.state_dict().items():
        i, rest = k.split(".", 1)
        out[f"lang_encoder.{path}.{i}.gated_cross_attn_layer.{rest}"] = v
    lm = model.lang_encoder
    inputs = lm.get_input_embeddings().weight
    input_names = {n for n, p in lm.named_parameters() if p is inputs}
    v4 = _lm_state_v4(lm)
    for k, v in v4.items():
        if "embed" in k or k in input_names:
            out[f"lang_encoder.{k}"] = v
    return _detached(out)


def otter_state(model) -> dict:
    """``model`` as Otter's ``save_pretrained`` writes its weights (see the module docstring)."""
    import torch

    path = re.escape(model.decoder_path)
    out = {}
    for k, v in model.perceiver.state_dict().items():
        k = re.sub(r"^layers\.(\d+)\.0\.", r"layers.\1.", k)
        out["perceiver." + re.sub(r"^layers\.(\d+)\.1\.", r"layers.\1.feed_forward.", k)] = v
    for k, v in model.gated_cross_attn_layers.state_dict().items():
        i, rest = k.split(".", 1)
        rest = re.sub(r"^ff\.", "feed_forward.", rest)
        out[f"lang_encoder.{model.decoder_path}.{i}.gated_cross_attn_layer.{rest}"] = v
    seen: set[tuple] = set()
    for k, v in _lm_state_v4(model.lang_encoder).items():
        where = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if where in seen:  # a tied weight: saved once (Otter's MPT has no lm_head)
            continue
        seen.add(where)
        out["lang_encoder." + re.sub(rf"^({path}\.\d+)\.", r"\1.decoder_layer.", k)] = v
    config = model.lang_encoder.config
    if config.model_type == "llama":  # persistent in transformers 4.28-4.30
        dim = config.hidden_size // config.num_attention_heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        for i in range(config.num_hidden_layers):
            out[f"lang_encoder.model.layers.{i}.decoder_layer.self_attn.rotary_emb.inv_freq"] = inv_freq
    for k, v in model.vision_encoder.state_dict().items():
        out["vision_encoder." + (k if k.startswith("vision_model.") else "vision_model." + k)] = v
    positions = model.vision_encoder.config.image_size // model.vision_encoder.config.patch_size
    out["vision_encoder.vision_model.embeddings.position_ids"] = torch.arange(positions ** 2 + 1)[None]
    return _detached(out)


def _detached(state: dict) -> dict:
    return {k: v.detach().clone().contiguous() for k, v in state.items()}
