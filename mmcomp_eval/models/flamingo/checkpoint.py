"""Released OpenFlamingo/Otter weight names -> this package's module names, and loading them with one-line errors.

Three naming schemes meet in a released checkpoint:

* **OpenFlamingo** (v2 ``checkpoint.pt``) wraps each decoder layer in a
  ``FlamingoLayer``, so the same weights appear as
  ``lang_encoder.<layers>.i.gated_cross_attn_layer.*``,
  ``lang_encoder.gated_cross_attn_layers.i.*``, ``...decoder_layer.*`` (and
  FSDP's ``_checkpoint_wrapped_module``, DDP's ``module.``). Its perceiver
  layers are pairs, ``perceiver.layers.i.0.*`` (attention) and
  ``perceiver.layers.i.1.{0,1,3}.*`` (feed-forward); a block's feed-forward is ``ff.*``.
* **Otter** (an HF folder) wraps the layers the same way (``OtterLayer``) but
  names its perceiver layers flat (``perceiver.layers.i.to_q``,
  ``perceiver.layers.i.feed_forward.{0,1,3}``) and a block's feed-forward
  ``feed_forward.*``; it also keeps buffers older transformers saved
  (CLIP's ``position_ids``, LLaMA's ``rotary_emb.inv_freq``).
* **transformers**: the language model's and vision tower's own keys, as the
  checkpoint's transformers version wrote them. They are renamed exactly as
  ``from_pretrained`` renames them (transformers 5 calls GPT-NeoX's
  ``embed_out`` ``lm_head`` and drops ``CLIPVisionModel``'s
  ``vision_model.``), using transformers' own conversion tables, and the
  buffers ``from_pretrained`` ignores are ignored here too.

This package names everything as OpenFlamingo does, with the language model
unwrapped and the blocks beside it; every spelling above is mapped onto it.
Tied weights (MPT's output layer is its input embedding; Otter's MPT has no
``lm_head`` at all) count as present when either name is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from mmcomp_eval.errors import UserError

OPEN_CLIP_KEY = re.compile(r"^vision_encoder\.(conv1|class_embedding|positional_embedding|ln_pre|ln_post|proj"
                           r"|transformer\.resblocks)\b")
#: Otter's flat perceiver layer -> OpenFlamingo's (attention, feed-forward) pair
_OTTER_PERCEIVER_ATTN = re.compile(r"^perceiver\.layers\.(\d+)\.(norm_media|norm_latents|to_q|to_kv|to_out)\.")
_OTTER_PERCEIVER_FF = re.compile(r"^perceiver\.layers\.(\d+)\.feed_forward\.")
_OTTER_BLOCK_FF = re.compile(r"^(gated_cross_attn_layers\.\d+)\.feed_forward\.")
#: buffers that older transformers saved and ``from_pretrained`` now skips for every model
_STALE_BUFFERS = (r"rotary_emb\.inv_freq$", r"(^|\.)position_ids$")


@dataclass(frozen=True)
class SubmodelNames:
    """How ``from_pretrained`` would read one part's keys: renames, and keys it ignores."""

    rename: Callable[[str], str]
    ignored: re.Pattern | None = None

    @classmethod
    def identity(cls) -> SubmodelNames:
        return cls(lambda key: key)

    @classmethod
    def of(cls, module) -> SubmodelNames:
        """The names ``type(module).from_pretrained`` accepts (transformers' conversion mapping)."""
        from transformers import PreTrainedModel

        if not isinstance(module, PreTrainedModel):
            return cls.identity()
        patterns = [*(module._keys_to_ignore_on_load_unexpected or ()), *_STALE_BUFFERS]
        ignored = re.compile("|".join(f"({p})" for p in patterns))
        try:  # transformers 5; transformers 4 loads checkpoints under their own names
            from transformers.conversion_mapping import get_model_conversion_mapping
            from transformers.core_model_loading import WeightConverter, rename_source_key
        except ImportError:
            return cls(lambda key: key, ignored)
        transforms = get_model_conversion_mapping(module)
        renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        own = module.state_dict()
        prefix = module.base_model_prefix

        def rename(key: str) -> str:
            new, merged_by = rename_source_key(key, renamings, converters, prefix, own)
            if merged_by is not None:
                raise UserError(f"checkpoint key '{key}' of {type(module).__name__} must be merged with others "
                                f"({merged_by}); this loader maps names one by one -- convert the checkpoint "
                                "with transformers' save_pretrained first")
            return new

        return cls(rename, ignored)


def remap_checkpoint(state: dict, decoder_path: str, lm: SubmodelNames | None = None,
                     vision: SubmodelNames | None = None) -> tuple[dict, list[str]]:
    """OpenFlamingo/Otter state-dict names -> this module's names; also returns the keys dropped.

    Dropped: ``lang_encoder.old_decoder_blocks.*`` (a duplicate of the
    wrapped layers) and the keys ``from_pretrained`` ignores (stale buffers).
    """
    lm, vision = lm or SubmodelNames.identity(), vision or SubmodelNames.identity()
    layers = re.escape(decoder_path)
    block = re.compile(rf"^lang_encoder\.(?:{layers}\.(\d+)\.gated_cross_attn_layer|gated_cross_attn_layers\.(\d+))\.")
    wrapped = re.compile(rf"^({layers}\.\d+)\.decoder_layer\.")
    out, dropped = {}, []
    for key, value in state.items():
        key = key.removeprefix("module.").replace("._checkpoint_wrapped_module", "")
        if key.startswith("lang_encoder.old_decoder_blocks."):
            dropped.append(key)
            continue
        if m := block.match(key):
            key = _OTTER_BLOCK_FF.sub(r"\1.ff.", f"gated_cross_attn_layers.{m.group(1) or m.group(2)}.{key[m.end():]}")
        elif key.startswith("perceiver."):
            key = _OTTER_PERCEIVER_ATTN.sub(r"perceiver.layers.\1.0.\2.", key)
            key = _OTTER_PERCEIVER_FF.sub(r"perceiver.layers.\1.1.", key)
        elif key.startswith("lang_encoder."):
            inner = wrapped.sub(r"\1.", key.removeprefix("lang_encoder."))
            if lm.ignored is not None and lm.ignored.search(inner):
                dropped.append(key)
                continue
            key = "lang_encoder." + lm.rename(inner)
        elif key.startswith("vision_encoder."):
            if OPEN_CLIP_KEY.match(key):
                raise UserError(f"checkpoint key '{key}' is an open_clip vision weight; only transformers CLIP names "
                                "(vision_encoder.vision_model.*) are supported -- load the vision tower from the Hub")
            inner = key.removeprefix("vision_encoder.")
            if vision.ignored is not None and vision.ignored.search(inner):
                dropped.append(key)
                continue
            key = "vision_encoder." + vision.rename(inner)
        out[key] = value
    return out, dropped


def tied_names(state: dict) -> dict[str, frozenset[str]]:
    """Each key -> every key of ``state`` that is the same tensor (itself included)."""
    groups: dict[tuple, set[str]] = {}
    for key, tensor in state.items():
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        groups.setdefault(where, set()).add(key)
    return {key: frozenset(names) for names in groups.values() for key in names}


def load_flamingo_state(model, state: dict, source: str, require_all: bool, resize_embeddings: bool = False) -> dict:
    """Load ``state`` (any supported naming) into ``model``; one-line errors for anything that does not fit.

    ``require_all``: every parameter must be in ``state`` (Otter's folder holds
    the whole model); otherwise only the Flamingo parts must (OpenFlamingo's
    checkpoint holds them and the embeddings; the rest comes from the Hub).
    ``resize_embeddings``: give the language model as many token rows as the
    checkpoint's input embeddings have (Otter builds its LM from a config
    and never resizes it, so the weights decide).
    """
    import torch

    mapped, dropped = remap_checkpoint(state, model.decoder_path, SubmodelNames.of(model.lang_encoder),
                                       SubmodelNames.of(model.vision_encoder))
    if resize_embeddings:
        _resize_to_checkpoint(model.lang_encoder, mapped)
    own = model.state_dict()
    unexpected = [k for k in mapped if k not in own]
    if unexpected:
        raise UserError(f"{source}: {len(unexpected)} weights do not fit this model (first: '{unexpected[0]}'); "
                        "check cross_attn_every_n_layers and the language model")
    for k, v in mapped.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise UserError(f"{source}: weight '{k}' has shape {tuple(v.shape)}, the model {tuple(own[k].shape)}; "
                            "check the language model and tokenizer match the checkpoint")
    aliases = tied_names(own)
    absent = [k for k in own if not aliases[k] & mapped.keys()]
    missing = [k for k in absent if k.startswith(("perceiver.", "gated_cross_attn_layers."))]
    if missing:
        raise UserError(f"{source}: no weights for {len(missing)} Flamingo parameters (first: '{missing[0]}')")
    if require_all and absent:
        raise UserError(f"{source}: no weights for {len(absent)} parameters (first: '{absent[0]}')")
    with torch.no_grad():
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in mapped.items()}, strict=False)
    tied = sum(1 for k in own if k not in mapped and aliases[k] & mapped.keys())
    return {"loaded": len(mapped), "dropped": len(dropped), "tied": tied}


def _resize_to_checkpoint(lm, mapped: dict) -> None:
    embeddings = lm.get_input_embeddings()
    name = next(n for n, p in lm.named_parameters() if p is embeddings.weight)
    weight = mapped.get(f"lang_encoder.{name}")
    if weight is not None and weight.shape[0] != embeddings.num_embeddings:
        lm.resize_token_embeddings(weight.shape[0], mean_resizing=False)  # every row is loaded next
