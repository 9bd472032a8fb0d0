"""The ``open_flamingo`` and ``otter`` adapters and their presets.

Everything a local VLM adapter shares (options, batching, image checks,
callbacks) comes from :class:`~mmcomp_eval.models.vlm.VisionLanguageModel`;
this file adds what is Flamingo's: the two checkpoint formats, placing the
new parts beside a dispatched language model, the ``<|endofchunk|>`` prompt
layout and one batch's encoding. Importing it does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import decoding
from mmcomp_eval.models.flamingo.loading import FORMATS, checkpoint_file, load_openflamingo, load_otter
from mmcomp_eval.models.flamingo.prompt import END_OF_CHUNK, chunked
from mmcomp_eval.models.loading import context_length
from mmcomp_eval.models.local import pad_on_the_left
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.models.vlm import VisionLanguageModel
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    import torch
    from PIL import Image


@MODELS.register("open_flamingo", aliases=("openflamingo",))
class FlamingoAdapter(VisionLanguageModel):
    """OpenFlamingo v2 (``checkpoint_format=openflamingo``) or Otter (``checkpoint_format=otter``).

    Besides its own arguments it takes every :class:`~mmcomp_eval.models.vlm.VisionOptions` field.
    """

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
        **options: Any,
    ):
        super().__init__(options)
        fmt = checkpoint_format or self.default_format
        if fmt not in FORMATS:
            raise UserError(f"model argument checkpoint_format={fmt!r} is not one of {', '.join(FORMATS)}")
        self.format = fmt
        self.checkpoint = checkpoint
        weights = self.options.weights_kwargs()
        target = self.options.target_device()
        files_only = self.options.files_only
        if fmt == "openflamingo":
            if not lang_encoder:
                raise UserError("open_flamingo needs --model-args lang_encoder=<causal LM id or folder>")
            loaded = load_openflamingo(checkpoint_file(checkpoint, "checkpoint.pt", fmt, files_only), lang_encoder,
                                       tokenizer or lang_encoder, vision_encoder, cross_attn_every_n_layers or 1,
                                       vision_features or "ln_post_patches", self.options.hub_kwargs(), weights)
        else:
            if target is None:
                raise UserError("otter loads its single folder onto one device: drop device_map/load_in_*bit")
            folder = checkpoint_file(checkpoint, "config.json", fmt, files_only).parent
            loaded = load_otter(folder, cross_attn_every_n_layers, vision_features or "patches", weights["dtype"])
        self.model, self.tokenizer, self.image_processor = loaded.model, loaded.tokenizer, loaded.image_processor
        self.load_info = loaded.info
        self.model.eval()
        decoding.ignore_checkpoint_defaults(self.model.lang_encoder)  # Flamingo.generate is the LM's generate
        self._place(target)
        self.device = self.model.lang_encoder.get_input_embeddings().weight.device
        pad_on_the_left(self.tokenizer)  # the loaders gave it a pad token
        self.eoc_id = self.tokenizer.convert_tokens_to_ids(END_OF_CHUNK)
        self.eos_ids = {i for i in (self.eoc_id, self.tokenizer.eos_token_id) if i is not None}
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
        pixels = self.image_processor(images=flat, return_tensors="pt")["pixel_values"] if flat else None
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
            "checkpoint": self.checkpoint, "format": self.format,
            "cross_attn_every_n_layers": self.model.cross_attn_every_n_layers,
            "vision_features": self.model.vision_features,
            "language_model": type(self.model.lang_encoder).__name__, "loaded": self.load_info,
        }


@MODELS.register("otter")
class OtterAdapter(FlamingoAdapter):
    """Otter: a Flamingo whose HF-format folder holds every weight (vision, perceiver, LM)."""

    name = "otter"
    default_format = "otter"


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
