"""The ``open_flamingo`` and ``otter`` adapters and their presets.

Everything a local VLM adapter shares (options, batching, image checks,
callbacks) comes from :class:`~mmcomp_eval.models.vlm.VisionLanguageModel`;
this file adds what is Flamingo's: the two checkpoint formats, placing the
new parts beside a dispatched language model, the ``<|endofchunk|>`` prompt
layout and one batch's encoding. Importing it does not import torch.

Each adapter behaves as its original code does (``docs/flamingo.md``):

* decoding defaults (:class:`~mmcomp_eval.api.model.ModelDefaults`, used
  where the task and ``--gen-kwargs`` are silent): OpenFlamingo's
  evaluation decodes with ``num_beams=3, length_penalty=0.0``; Otter's demos
  with ``num_beams=3, no_repeat_ngram_size=3``;
* generation ends at ``<|endofchunk|>`` only, never at the language
  model's own end-of-text token (both pass ``eos_token_id=<|endofchunk|>``);
* Otter renders a task's ``otter`` prompt variant when it has one
  (``User: ... GPT:<answer> ...``, ``prompts/compact_otter.jinja``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.model import ModelDefaults
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import decoding
from mmcomp_eval.models.flamingo.images import IMAGE_TRANSFORMS
from mmcomp_eval.models.flamingo.loading import (
    DEFAULT_IMAGE_TRANSFORM,
    FORMATS,
    checkpoint_file,
    load_openflamingo,
    load_otter,
)
from mmcomp_eval.models.flamingo.prompt import END_OF_CHUNK, chunked
from mmcomp_eval.models.flamingo.vision import VISION_FEATURES
from mmcomp_eval.models.loading import context_length, local_weights_stat
from mmcomp_eval.models.local import pad_on_the_left
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.models.vlm import VisionLanguageModel
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    import torch
    from PIL import Image


#: each original code's decoding and prompt format, by checkpoint format
FORMAT_DEFAULTS = {
    # OpenFlamingo's evaluation (``open_flamingo/eval/evaluate.py``): 3 beams, no length normalisation
    "openflamingo": ModelDefaults(generation={"num_beams": 3, "length_penalty": 0.0}),
    # Otter's demos (``pipeline/demos/interactive/otter_image*.py``): 3 beams, no repeated 3-grams;
    # its in-context format ``<image>User: ... GPT:<answer> ...<|endofchunk|>``
    "otter": ModelDefaults(generation={"num_beams": 3, "no_repeat_ngram_size": 3}, prompt_variant="otter"),
}


@MODELS.register("open_flamingo", aliases=("openflamingo",))
class FlamingoAdapter(VisionLanguageModel):
    """OpenFlamingo v2 (``checkpoint_format=openflamingo``) or Otter (``checkpoint_format=otter``).

    Besides its own arguments it takes every :class:`~mmcomp_eval.models.vlm.VisionOptions` field.
    """

    name = "open_flamingo"
    default_format = "openflamingo"
    defaults = FORMAT_DEFAULTS["openflamingo"]

    @classmethod
    def defaults_for(cls, args: Mapping[str, Any]) -> ModelDefaults:
        """The weights' format decides whose original decoding and prompt apply, not the adapter's name."""
        return FORMAT_DEFAULTS.get(args.get("checkpoint_format") or cls.default_format, cls.defaults)

    def __init__(
        self,
        checkpoint: str,
        lang_encoder: str | None = None,
        tokenizer: str | None = None,
        vision_encoder: str = "openai/clip-vit-large-patch14",
        cross_attn_every_n_layers: int | None = None,
        checkpoint_format: str | None = None,
        vision_features: str = "patches",
        image_transform: str | None = None,
        use_cache: bool | None = None,
        **options: Any,
    ):
        super().__init__(options)
        fmt = checkpoint_format or self.default_format
        if fmt not in FORMATS:
            raise UserError(f"model argument checkpoint_format={fmt!r} is not one of {', '.join(FORMATS)}")
        self.format = fmt
        self.defaults = FORMAT_DEFAULTS[fmt]
        self.checkpoint = checkpoint
        # what else the answers depend on: the frozen LM, vision tower and tokenizer that OpenFlamingo's
        # checkpoint.pt does not hold (Otter's folder holds them all), each with its local folder's identity
        parts = {"lang_encoder": lang_encoder, "vision_encoder": vision_encoder, "tokenizer": tokenizer} \
            if fmt == "openflamingo" else {"tokenizer": tokenizer}
        self.sources = {k: {"given": v, "weights_stat": local_weights_stat(v)} for k, v in
                        {**parts, "checkpoint": checkpoint}.items()}
        weights = self.options.weights_kwargs()
        target = self.options.target_device()
        files_only = self.options.files_only
        transform = image_transform or DEFAULT_IMAGE_TRANSFORM[fmt]
        for arg, value, allowed in (("vision_features", vision_features, VISION_FEATURES),
                                    ("image_transform", transform, IMAGE_TRANSFORMS)):
            if value not in allowed:  # checked before anything loads
                raise UserError(f"model argument {arg}={value!r} is not one of {', '.join(allowed)}")
        if fmt == "openflamingo":
            if not lang_encoder:
                raise UserError("open_flamingo needs --model-args lang_encoder=<causal LM id or folder>")
            if use_cache is not None:
                raise UserError("model argument use_cache applies to Otter checkpoints (what their generated "
                                "tokens attend to); OpenFlamingo's generated tokens always attend to the last image")
            loaded = load_openflamingo(checkpoint_file(checkpoint, "checkpoint.pt", fmt, files_only), lang_encoder,
                                       tokenizer or lang_encoder, vision_encoder, cross_attn_every_n_layers or 1,
                                       vision_features, transform, self.options.hub_kwargs(), weights)
        else:
            if target is None:
                raise UserError("otter loads its single folder onto one device: drop device_map/load_in_*bit")
            folder = checkpoint_file(checkpoint, "config.json", fmt, files_only).parent
            loaded = load_otter(folder, cross_attn_every_n_layers, vision_features, transform, tokenizer, use_cache,
                                weights["dtype"], self.options.hub_kwargs())
        self.model, self.tokenizer, self.image_transform = loaded.model, loaded.tokenizer, loaded.image_transform
        self.load_info = loaded.info
        self.model.eval()
        decoding.ignore_checkpoint_defaults(self.model.lang_encoder)  # Flamingo.generate is the LM's generate
        self._place(target)
        self.device = self.model.lang_encoder.get_input_embeddings().weight.device
        pad_on_the_left(self.tokenizer)  # the loaders gave it a pad token
        self.eoc_id = self.tokenizer.convert_tokens_to_ids(END_OF_CHUNK)
        self.eos_ids = {self.eoc_id}  # as both originals' generate: not the language model's own end of text
        self.max_length = self.options.max_length or context_length(self.model.lang_encoder.config)

    def _place(self, target: torch.device | None) -> None:
        """Move the model to ``target``; a dispatched LM keeps each new part beside what uses it."""
        if target is not None:
            self.model.to(target)
            return
        first = self.model.lang_encoder.get_input_embeddings().weight.device
        self.model.vision_encoder.to(first)
        self.model.perceiver.to(first)
        for block, layer in zip(self.model.gated_cross_attn_layers, self.model.decoder_layers()):
            if block is not None:
                block.to(next(layer.parameters()).device)

    def _prompt_text(self, request: GenerationRequest) -> str:
        return chunked(super()._prompt_text(request))

    def encode(self, prompts: list[str], images: list[list[Image.Image]] | None) -> dict:
        """Left-padded token ids, and the images in prompt order with each row's image count."""
        enc = self.tokenizer(prompts, return_tensors="pt", padding="longest")
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
        pixels = self.image_transform(flat) if flat else None
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "pixel_values": pixels,
                "counts": counts}

    def _generate_batch(self, prompts: list[str], settings: GenerationSettings, requests: list[GenerationRequest],
                        images: list[list[Image.Image]] | None) -> list[str]:
        enc = self.encode(prompts, images)
        input_ids, attention_mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        counts, pixels = enc["counts"], enc["pixel_values"]
        if pixels is not None:
            pixels = pixels.to(self.device)
        self.check_prompts_fit(requests, attention_mask.sum(dim=1).tolist(), settings)
        return self._generate_text(lambda **kw: self.model.generate(pixels, counts, input_ids, attention_mask, **kw),
                                   input_ids.shape[1], settings, requests)

    def fingerprint(self) -> dict[str, Any]:
        return {
            **super().fingerprint(),
            "checkpoint": self.checkpoint, "format": self.format, "sources": self.sources,
            "cross_attn_every_n_layers": self.model.cross_attn_every_n_layers,
            "vision_features": self.model.vision_features,
            "image_transform": self.image_transform.describe(),
            "generated_tokens_attend": self.model.generated_tokens_attend,
            "language_model": type(self.model.lang_encoder).__name__, "loaded": self.load_info,
            "lang_commit": getattr(self.model.lang_encoder.config, "_commit_hash", None),
        }


@MODELS.register("otter")
class OtterAdapter(FlamingoAdapter):
    """Otter: a Flamingo whose HF-format folder holds every weight (vision, perceiver, LM)."""

    name = "otter"
    default_format = "otter"
    defaults = FORMAT_DEFAULTS["otter"]


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
MODELS.add_preset("otter-image-mpt7b", "otter",
                  "Otter-Image-MPT7B; its text config's use_cache (false in Otter's MPT-7B config: new tokens "
                  "see the last image)",
                  checkpoint="luodian/OTTER-Image-MPT7B")
MODELS.add_preset("otter-9b-incontext", "otter",
                  "OTTER-9B-LA-InContext (LLaMA-7B); its text config's use_cache (LLaMA's default: on, so as in "
                  "Otter's code tokens after the first see no image; use_cache=false: the last image)",
                  checkpoint="luodian/OTTER-9B-LA-InContext")
