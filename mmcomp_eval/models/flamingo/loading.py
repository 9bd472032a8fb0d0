"""Building a Flamingo from a released checkpoint: OpenFlamingo's parts-plus-``checkpoint.pt``, or Otter's one folder.

* ``openflamingo``: ``lang_encoder`` and ``vision_encoder`` from the Hub (or
  folders) plus the released ``checkpoint.pt`` (perceiver, cross-attention
  and the resized token embeddings).
* ``otter``: one HF-format folder (Otter's ``config.json`` with
  ``vision_config``/``text_config``, safetensors shards with
  ``vision_encoder.``/``perceiver.``/``lang_encoder.`` names); built from
  the configs, never with ``trust_remote_code``.

Kept apart from the adapter so that the adapter reads as what every local
adapter does (options, placement, prompts, batches) and this file as what is
peculiar to the two release formats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmcomp_eval.errors import UserError
from mmcomp_eval.models.flamingo.checkpoint import load_flamingo_state
from mmcomp_eval.models.flamingo.prompt import END_OF_CHUNK
from mmcomp_eval.models.loading import guarded_load, resolve_pretrained
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

FORMATS = ("openflamingo", "otter")


@dataclass
class LoadedFlamingo:
    model: Any  # mmcomp_eval.models.flamingo.model.Flamingo
    tokenizer: Any
    image_processor: Any
    #: weights loaded and duplicates dropped (recorded in the fingerprint)
    info: dict[str, int]


def checkpoint_file(checkpoint: str, filename: str, fmt: str, local_files_only: bool) -> Path:
    """``checkpoint`` as a file, a folder holding ``filename``, or a Hub repo id (Otter: the whole repo)."""
    path = Path(checkpoint).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if not (path / filename).is_file():
            raise UserError(f"checkpoint folder {path} has no {filename}")
        return path / filename
    if checkpoint.startswith(("/", ".", "~")) or checkpoint.count("/") != 1:
        raise UserError(f"checkpoint {checkpoint} does not exist")
    from huggingface_hub import hf_hub_download, snapshot_download

    if fmt == "otter":
        return Path(guarded_load(checkpoint, lambda: snapshot_download(
            checkpoint, local_files_only=local_files_only))) / filename
    return Path(guarded_load(checkpoint, lambda: hf_hub_download(
        checkpoint, filename, local_files_only=local_files_only)))


def load_openflamingo(ckpt: Path, lang_id: str, tok_id: str, vision_id: str, every_n: int, features: str,
                      hub: dict[str, Any], weights: dict[str, Any]) -> LoadedFlamingo:
    """``hub``: trust_remote_code and local_files_only; ``weights``: dtype and placement of the language model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, CLIPImageProcessor, CLIPVisionModel

    from mmcomp_eval.models.flamingo.model import Flamingo

    files_only = {"local_files_only": hub["local_files_only"]}
    lang_src, tok_src, vis_src = (resolve_pretrained(x) for x in (lang_id, tok_id, vision_id))
    tokenizer = guarded_load(tok_id, lambda: AutoTokenizer.from_pretrained(tok_src, **hub))
    tokenizer.add_special_tokens({"additional_special_tokens": [END_OF_CHUNK, IMAGE_PLACEHOLDER]})
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": "<PAD>"})
    lm = guarded_load(lang_id, lambda: AutoModelForCausalLM.from_pretrained(lang_src, **weights, **hub))
    with torch.random.fork_rng(devices=[]):  # rows for the new tokens: deterministic where the checkpoint has none
        torch.manual_seed(0)
        lm.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    dtype = weights["dtype"]
    vision = guarded_load(vision_id, lambda: CLIPVisionModel.from_pretrained(vis_src, dtype=dtype, **files_only))
    processor = guarded_load(vision_id, lambda: CLIPImageProcessor.from_pretrained(vis_src, **files_only))
    model = Flamingo(vision, lm, tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER), every_n, features)
    model.perceiver.to(dtype)
    model.gated_cross_attn_layers.to(dtype)
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors come in many classes
        raise UserError(f"cannot read OpenFlamingo checkpoint {ckpt}: {' '.join(str(exc).split())[:160]}") from None
    info = load_flamingo_state(model, state, str(ckpt), require_all=False)
    return LoadedFlamingo(model, tokenizer, processor, info)


def load_otter(folder: Path, every_n: int | None, features: str, dtype) -> LoadedFlamingo:
    """Otter's folder, built from its configs; ``every_n`` unset: the config's (4 if absent)."""
    from safetensors.torch import load_file
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        CLIPVisionModel,
    )

    from mmcomp_eval.models.flamingo.model import Flamingo

    cfg = json.loads((folder / "config.json").read_text())
    text_cfg = dict(cfg.get("text_config") or {})
    if "model_type" not in text_cfg or "vision_config" not in cfg:
        raise UserError(f"{folder}/config.json is not an Otter config "
                        "(needs text_config.model_type and vision_config)")
    lm_config = AutoConfig.for_model(text_cfg.pop("model_type"), **text_cfg)
    lm = AutoModelForCausalLM.from_config(lm_config, dtype=dtype)
    vision = CLIPVisionModel(CLIPVisionConfig(**cfg["vision_config"])).to(dtype)
    tokenizer = guarded_load(str(folder), lambda: AutoTokenizer.from_pretrained(folder, local_files_only=True))
    if lm.get_input_embeddings().num_embeddings != len(tokenizer):
        lm.resize_token_embeddings(len(tokenizer))
    processor = CLIPImageProcessor.from_pretrained(folder, local_files_only=True)
    every = every_n or int(cfg.get("cross_attn_every_n_layers", 4))
    model = Flamingo(vision, lm, tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER), every, features)
    model.to(dtype)
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise UserError(f"{folder} has no .safetensors weights")
    state = {}
    for shard in shards:
        state.update(load_file(shard))
    info = load_flamingo_state(model, state, str(folder), require_all=True)
    return LoadedFlamingo(model, tokenizer, processor, info)
