"""Building a Flamingo from a released checkpoint: OpenFlamingo's parts-plus-``checkpoint.pt``, or Otter's one folder.

* ``openflamingo``: ``lang_encoder`` and ``vision_encoder`` from the Hub (or
  folders) plus the released ``checkpoint.pt`` (perceiver, cross-attention
  and the embeddings). As OpenFlamingo's ``create_model_and_transforms``
  does, the tokenizer gets ``<|endofchunk|>``, ``<image>`` (and ``<PAD>``
  when it has no pad token) and the language model is resized to it --
  *down* from MPT-7B's and RedPajama's padded 50,432 rows to 50,280.
* ``otter``: one HF-format folder (Otter's ``config.json`` with
  ``vision_config``/``text_config``, safetensors or ``.bin`` shards), built
  from the configs, never with ``trust_remote_code``. Otter never resizes
  its language model: the embeddings keep the checkpoint's rows
  (Otter-MPT7B: 50,432 for a 50,281-token tokenizer). Its tokenizer gets
  ``<|endofchunk|>``, ``<image>``, ``<answer>`` (and ``<PAD>``), as
  ``OtterForConditionalGeneration`` adds them.

Pixels come from :mod:`~mmcomp_eval.models.flamingo.images`, the transform
each original uses; no ``preprocessor_config.json`` is read.

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
from mmcomp_eval.models.flamingo.images import ImageTransform
from mmcomp_eval.models.flamingo.prompt import ANSWER, END_OF_CHUNK
from mmcomp_eval.models.loading import guarded_load, resolve_pretrained
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

FORMATS = ("openflamingo", "otter")
#: the transform each format's own code preprocesses images with (see images.py)
DEFAULT_IMAGE_TRANSFORM = {"openflamingo": "open_clip", "otter": "clip_processor"}
#: the tokenizer ``OtterForConditionalGeneration`` loads for an MPT language model
OTTER_MPT_TOKENIZER = "mosaicml/mpt-7b-instruct"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass
class LoadedFlamingo:
    model: Any  # mmcomp_eval.models.flamingo.model.Flamingo
    tokenizer: Any
    image_transform: ImageTransform
    #: weights loaded, dropped and tied (recorded in the fingerprint)
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


def add_special_tokens(tokenizer, tokens: list[str]) -> None:
    """What both originals do to their tokenizer: the Flamingo tokens, and ``<PAD>`` when there is no pad token."""
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": "<PAD>"})


def load_openflamingo(ckpt: Path, lang_id: str, tok_id: str, vision_id: str, every_n: int, features: str,
                      transform: str, hub: dict[str, Any], weights: dict[str, Any]) -> LoadedFlamingo:
    """``hub``: trust_remote_code and local_files_only; ``weights``: dtype and placement of the language model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, CLIPVisionModel

    from mmcomp_eval.models.flamingo.model import Flamingo

    files_only = {"local_files_only": hub["local_files_only"]}
    lang_src, tok_src, vis_src = (resolve_pretrained(x) for x in (lang_id, tok_id, vision_id))
    tokenizer = guarded_load(tok_id, lambda: AutoTokenizer.from_pretrained(tok_src, **hub))
    add_special_tokens(tokenizer, [END_OF_CHUNK, IMAGE_PLACEHOLDER])
    lm = guarded_load(lang_id, lambda: AutoModelForCausalLM.from_pretrained(lang_src, **weights, **hub))
    with torch.random.fork_rng(devices=[]):  # rows for the new tokens: deterministic where the checkpoint has none
        torch.manual_seed(0)
        lm.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    dtype = weights["dtype"]
    vision, report = guarded_load(vision_id, lambda: CLIPVisionModel.from_pretrained(
        vis_src, dtype=dtype, output_loading_info=True, **files_only), arg="vision_encoder")
    missing = [k for k in report.get("missing_keys", ()) if "position_ids" not in k]
    if missing:  # another architecture's folder loads "successfully" as a random tower
        raise UserError(f"vision_encoder '{vision_id}' is not a CLIP vision checkpoint: {len(missing)} of its "
                        f"weights are missing (e.g. {missing[0]}); give a CLIP model such as "
                        "openai/clip-vit-large-patch14")
    model = Flamingo(vision, lm, tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER), every_n, features)
    model.perceiver.to(dtype)
    model.gated_cross_attn_layers.to(dtype)
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors come in many classes
        raise UserError(f"cannot read OpenFlamingo checkpoint {ckpt}: {' '.join(str(exc).split())[:160]}") from None
    if "model_state_dict" in state:  # a training checkpoint (epoch, optimizer, ...), as OpenFlamingo's eval accepts
        state = state["model_state_dict"]
    info = load_flamingo_state(model, state, str(ckpt), require_all=False)
    return LoadedFlamingo(model, tokenizer, ImageTransform(transform, vision.config.image_size), info)


def load_otter(folder: Path, every_n: int | None, features: str, transform: str, tok_id: str | None,
               use_cache: bool | None, dtype, hub: dict[str, Any]) -> LoadedFlamingo:
    """Otter's folder, built from its configs; ``every_n`` unset: the config's (4 if absent).

    ``use_cache`` unset: the text config's, as Otter's ``generate`` uses it
    (MPT's default is off, LLaMA's on); it decides what generated tokens
    attend to (:mod:`~mmcomp_eval.models.flamingo.model`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, CLIPVisionConfig, CLIPVisionModel

    from mmcomp_eval.models.flamingo.model import Flamingo

    cfg = json.loads((folder / "config.json").read_text())
    text_cfg = dict(cfg.get("text_config") or {})
    if "model_type" not in text_cfg or "vision_config" not in cfg:
        raise UserError(f"{folder}/config.json is not an Otter config "
                        "(needs text_config.model_type and vision_config)")
    model_type = text_cfg.pop("model_type")
    if model_type == "mpt":
        check_mosaic_mpt(text_cfg, folder)
        text_cfg = without_attention_dropout(text_cfg)
    if use_cache is None:
        use_cache = bool(text_cfg.get("use_cache", model_type != "mpt"))
    lm = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **text_cfg), dtype=dtype)
    vision = CLIPVisionModel(CLIPVisionConfig(**cfg["vision_config"])).to(dtype)
    tok_src = tok_id or otter_tokenizer_source(folder, model_type, text_cfg)
    tokenizer = guarded_load(tok_src, lambda: AutoTokenizer.from_pretrained(resolve_pretrained(tok_src), **hub))
    add_special_tokens(tokenizer, [END_OF_CHUNK, IMAGE_PLACEHOLDER, ANSWER])
    every = every_n or int(cfg.get("cross_attn_every_n_layers", 4))
    model = Flamingo(vision, lm, tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER), every, features,
                     "no_image" if use_cache else "last_image", cfg.get("max_num_frames"))
    model.to(dtype)
    info = load_flamingo_state(model, read_shards(folder), str(folder), require_all=True, resize_embeddings=True)
    rows = model.lang_encoder.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise UserError(f"{folder}: the tokenizer ({tok_src}) has {len(tokenizer)} tokens but the checkpoint's "
                        f"embeddings {rows} rows; give the checkpoint's own tokenizer with --model-args tokenizer=")
    return LoadedFlamingo(model, tokenizer, ImageTransform(transform, vision.config.image_size),
                          {**info, "use_cache": use_cache})


def otter_tokenizer_source(folder: Path, model_type: str, text_cfg: dict) -> str:
    """The folder's tokenizer if it has one, else the one Otter's code loads for this language model."""
    if any((folder / name).is_file() for name in _TOKENIZER_FILES):
        return str(folder)
    if model_type == "mpt":
        return OTTER_MPT_TOKENIZER
    name = str(text_cfg.get("_name_or_path") or "")
    if name.count("/") == 1 and not name.startswith(("/", ".", "~")):
        return name
    raise UserError(f"{folder} holds no tokenizer and its text config names none on the Hub "
                    f"(_name_or_path={name!r}); give one with --model-args tokenizer=<Hub id or folder>")


def check_mosaic_mpt(text_cfg: dict, folder: Path) -> None:
    """Refuse MosaicML MPT settings that transformers' ``MptForCausalLM`` ignores (the answers would silently differ)."""
    attn = text_cfg.get("attn_config") or {}
    unsupported = {
        "attn_config.alibi=false (learned positions)": attn.get("alibi", True) is False,
        "attn_config.prefix_lm": bool(attn.get("prefix_lm")),
        "attn_config.qk_ln": bool(attn.get("qk_ln")),
        "attn_config.attn_uses_sequence_id": bool(attn.get("attn_uses_sequence_id")),
        "logit_scale": text_cfg.get("logit_scale") is not None,
        f"expansion_ratio={text_cfg.get('expansion_ratio')}": text_cfg.get("expansion_ratio", 4) != 4,
    }
    found = [name for name, present in unsupported.items() if present]
    if found:
        raise UserError(f"{folder}/config.json: the MPT text config sets {', '.join(found)}, which transformers' "
                        "MptForCausalLM does not implement; this checkpoint cannot be rebuilt faithfully")


def without_attention_dropout(text_cfg: dict) -> dict:
    """MosaicML's MPT config without ``attn_config.attn_pdrop``, a float that transformers 5's MPT config refuses
    (it types it int); dropout does nothing in evaluation, so leaving it out changes no output."""
    attn = {k: v for k, v in (text_cfg.get("attn_config") or {}).items() if k != "attn_pdrop"}
    return {**text_cfg, "attn_config": attn} if "attn_config" in text_cfg else text_cfg


def read_shards(folder: Path) -> dict:
    """Every weight of an HF folder: ``*.safetensors``, else ``pytorch_model*.bin``."""
    import torch
    from safetensors.torch import load_file

    shards = sorted(folder.glob("*.safetensors"))
    state: dict = {}
    for shard in shards:
        state.update(load_file(shard))
    if not shards:
        bins = sorted(folder.glob("pytorch_model*.bin"))
        if not bins:
            raise UserError(f"{folder} has no .safetensors or pytorch_model*.bin weights")
        for shard in bins:
            state.update(torch.load(shard, map_location="cpu", weights_only=True))
    return state
