"""transformers' image-text-to-text models (``--model hf_vlm`` and its presets).

One adapter for every checkpoint that ``AutoModelForImageTextToText`` and
``AutoProcessor`` load: Idefics2, Idefics3, SmolVLM, LLaVA, LLaVA-NeXT,
Qwen2-VL and Qwen2.5-VL are the families it is tested or preset for. The
processor's chat template places the images (``models/image_chat.py`` says
how a prompt with ``<image>`` placeholders becomes its conversation), the
processor expands each image into the model's image tokens, and the batching
loop, ``batch_size=auto``, out-of-memory back-off, per-answer callbacks and
seeded sampling are the shared ones (``models/local.py``, ``models/decoding.py``).

Batches are padded on the left (each processor's tokenizer is set so) and
every row carries its own images (rows with fewer images simply have fewer
image tokens; Idefics3 pads the pixel batch with empty images that it drops),
so an answer does not depend on its batch (tested for each tiny family).

How many tokens an image costs is the model's: Idefics2, Idefics3 and SmolVLM
split an image into tiles (``image_splitting``, ``image_longest_edge``),
Qwen2-VL spends one token per 28x28 pixels (``min_pixels``, ``max_pixels``),
LLaVA-1.5 576 per image, LLaVA-NeXT a few tiles of 576 (docs/vlms.md has the
count per EK-100 keyframe). The CompAct keyframe prompt with 5 shots holds 18
images; a prompt longer than the model's context is refused with the number
of tokens it needed (images cannot be cut like text).

torch and transformers are imported when a model is built, not on import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.model import IN_MEMORY
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import decoding, image_chat
from mmcomp_eval.models.loading import context_length, guarded_load, local_weights_stat
from mmcomp_eval.models.local import EncodedPrompt, checkpoint_revision, pad_on_the_left
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.models.vlm import VisionLanguageModel, VisionOptions
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from PIL import Image

PROMPT_FORMATS = ("chat", "raw")
#: end-of-turn tokens of the chat formats: generation stops at them as at end-of-sequence
END_OF_TURN_TOKENS = ("<end_of_utterance>", "<|im_end|>", "<|eot_id|>", "<end_of_turn>")


@dataclass(frozen=True)
class ImageArgument:
    """A model argument that sets how many tokens an image costs, for the model types whose processor reads it."""

    model_types: frozenset[str]
    #: the ``AutoProcessor.from_pretrained`` keywords it becomes
    processor_kwargs: Callable[[Any], dict[str, Any]]
    families: str


IMAGE_ARGUMENTS = {
    "image_splitting": ImageArgument(frozenset({"idefics2", "idefics3", "smolvlm"}),
                                     lambda v: {"do_image_splitting": v}, "Idefics2, Idefics3, SmolVLM"),
    "image_longest_edge": ImageArgument(frozenset({"idefics3", "smolvlm"}),
                                        lambda v: {"size": {"longest_edge": v}}, "Idefics3, SmolVLM"),
    "min_pixels": ImageArgument(frozenset({"qwen2_vl", "qwen2_5_vl"}), lambda v: {"min_pixels": v},
                                "Qwen2-VL, Qwen2.5-VL"),
    "max_pixels": ImageArgument(frozenset({"qwen2_vl", "qwen2_5_vl"}), lambda v: {"max_pixels": v},
                                "Qwen2-VL, Qwen2.5-VL"),
}


@dataclass(frozen=True)
class ImageTextOptions(VisionOptions):
    """:class:`VisionOptions` plus the prompt format and the image token budget."""

    #: ``chat``: the prompt goes through the processor's chat template (one user turn, or the
    #: --apply-chat-template turns); ``raw``: the prompt text as is (base checkpoints without a template)
    prompt_format: str = "chat"
    #: Idefics2/Idefics3/SmolVLM: cut each image into tiles plus a global view (unset: the checkpoint's choice)
    image_splitting: bool | None = None
    #: Idefics3/SmolVLM: resize images to this longest edge before tiling (unset: the checkpoint's)
    image_longest_edge: int | None = None
    #: Qwen2-VL/Qwen2.5-VL: bounds on an image's pixels (28x28 pixels per image token; unset: the checkpoint's)
    min_pixels: int | None = None
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prompt_format not in PROMPT_FORMATS:
            raise UserError(f"model argument prompt_format={self.prompt_format!r} is not one of "
                            f"{', '.join(PROMPT_FORMATS)}")
        for name in ("image_longest_edge", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"model argument {name}={value} must be at least 1")

    def image_arguments(self) -> dict[str, Any]:
        """The image-budget arguments the user set."""
        return {name: getattr(self, name) for name in IMAGE_ARGUMENTS if getattr(self, name) is not None}

    def processor_kwargs(self, model_type: str, what: str) -> dict[str, Any]:
        """The image-budget arguments as processor keywords; one that this model type ignores is an error."""
        out: dict[str, Any] = {}
        for name, value in self.image_arguments().items():
            argument = IMAGE_ARGUMENTS[name]
            if model_type not in argument.model_types:
                raise UserError(f"model argument {name} applies to {argument.families} processors; "
                                f"'{what}' is a {model_type} model: drop it")
            out.update(argument.processor_kwargs(value))
        return out


@MODELS.register("hf_vlm", aliases=("hf-vlm", "image_text_to_text"))
class ImageTextAdapter(VisionLanguageModel):
    """A transformers image-text-to-text model (``AutoModelForImageTextToText`` + ``AutoProcessor``).

    Besides ``pretrained`` and ``revision`` it takes every
    :class:`ImageTextOptions` field.
    """

    name = "hf_vlm"
    options_type = ImageTextOptions
    options: ImageTextOptions

    def __init__(self, pretrained: str, revision: str | None = None, **options: Any):
        super().__init__(options)
        self.pretrained = pretrained
        self.revision = revision
        self._load()

    @classmethod
    def from_loaded(cls, model, processor, pretrained: str = IN_MEMORY,
                    **options: Any) -> ImageTextAdapter:
        """An adapter around a model and processor already in memory (tests, GPU checks without weights)."""
        self = cls.__new__(cls)
        VisionLanguageModel.__init__(self, {"local_files_only": True, **options})
        self.pretrained, self.revision = pretrained, None
        if self.options.processor_kwargs(model.config.model_type, pretrained):  # same checks as a load
            raise UserError("image arguments apply when a processor is loaded; build the processor given to "
                            "from_loaded with them")
        self._adopt(model, processor, self._image_slots(processor))
        return self

    # -- loading -------------------------------------------------------------------------------------------

    def _load(self) -> None:
        from transformers import AutoConfig, AutoModelForImageTextToText
        from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

        # Argument checks, the config and the processor first: a mistake should not cost a weights load.
        weights_kwargs, target, source, common = self._load_arguments()
        self.loaded_from = source
        config = guarded_load(self.pretrained, lambda: AutoConfig.from_pretrained(source, **common))
        if config.model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
            raise UserError(f"'{self.pretrained}' is a {config.model_type} model, which transformers' "
                            "AutoModelForImageTextToText does not load; hf_vlm takes image-text-to-text "
                            "checkpoints (Idefics2/3, SmolVLM, LLaVA, LLaVA-NeXT, Qwen2-VL, ...)")
        processor_kwargs = self.options.processor_kwargs(config.model_type, self.pretrained)
        processor = guarded_load(self.pretrained, lambda: self._load_processor(source, config.model_type,
                                                                               {**common, **processor_kwargs}))
        slots = self._image_slots(processor)
        model = guarded_load(self.pretrained,
                             lambda: AutoModelForImageTextToText.from_pretrained(source, **common, **weights_kwargs))
        if target is not None:
            model.to(target)
        self._adopt(model, processor, slots)

    def _load_processor(self, source: str, model_type: str, kwargs: dict[str, Any]):
        import importlib.util

        from transformers import AutoProcessor

        try:
            return AutoProcessor.from_pretrained(source, **kwargs)
        except ImportError as exc:
            if "torchvision" in str(exc).lower() and importlib.util.find_spec("torchvision") is None:
                raise UserError(f"the processor of '{self.pretrained}' ({model_type}) needs torchvision, which is "
                                "not installed: pip install torchvision (the build that matches your torch)") from None
            raise

    def _image_slots(self, processor) -> image_chat.ImageSlots:
        """Where the processor's chat template puts images; a missing template is an error unless prompts are raw."""
        if image_chat.has_chat_template(processor):
            return image_chat.find_image_slots(processor, self.pretrained)
        if self.options.prompt_format == "chat":
            raise UserError(f"the processor of '{self.pretrained}' has no chat template; add "
                            "--model-args prompt_format=raw to send the prompt text as it is")
        token = getattr(processor, "image_token", None) or IMAGE_PLACEHOLDER
        return image_chat.ImageSlots(False, token, token)

    def _adopt(self, model, processor, slots: image_chat.ImageSlots) -> None:
        """Take a loaded model and processor: end tokens, padding, context length, where images go."""
        self.model = model.eval()
        ids = model.generation_config.eos_token_id if model.generation_config is not None else None
        decoding.ignore_checkpoint_defaults(self.model)
        self.device = self.model.device
        self.processor = processor
        self.slots = slots
        self.tokenizer = tok = processor.tokenizer
        pad_on_the_left(tok, tok.unk_token, tok.eos_token)
        vocab = tok.get_vocab()
        eos = set(ids if isinstance(ids, list) else [ids]) | {tok.eos_token_id}
        eos |= {vocab[t] for t in END_OF_TURN_TOKENS if t in vocab}
        self.eos_ids = {e for e in eos if e is not None}
        self.max_length = self.options.max_length or context_length(self.model.config.get_text_config(), tok)

    # -- prompts -------------------------------------------------------------------------------------------

    def _encode(self, request: GenerationRequest) -> EncodedPrompt:
        """The text the processor will read (its image tokens not yet expanded) and its length in tokens."""
        text = self._model_text(request)
        expected = len(request.images) if self.reads_images else 0
        image_chat.check_image_tokens(text, self.slots, expected, request.request_id)
        return EncodedPrompt(text, len(self.tokenizer(text, add_special_tokens=False).input_ids))

    def _model_text(self, request: GenerationRequest) -> str:
        if self.reads_images and request.prompt.count(IMAGE_PLACEHOLDER) != len(request.images):
            raise UserError(f"request {request.request_id}: the prompt holds {request.prompt.count(IMAGE_PLACEHOLDER)} "
                            f"{IMAGE_PLACEHOLDER} placeholders but {len(request.images)} images; the template's "
                            "image() calls and the media disagree")
        if self.options.prompt_format == "raw":
            if request.messages is not None:
                raise UserError("prompt_format=raw sends the prompt text as it is; drop --apply-chat-template "
                                "or use prompt_format=chat")
            return image_chat.raw_text(request.prompt, self.slots, self.reads_images)
        turns = image_chat.conversation(request.prompt, request.messages, self.slots, self.reads_images)
        return image_chat.render(self.processor, [turns], self.pretrained)[0]

    def encode(self, texts: list[str], images: list[list[Image.Image]] | None) -> dict:
        """The processor's padded batch: each row's image tokens expanded, its images in order."""
        import torch

        kwargs: dict[str, Any] = {"text": texts, "padding": "longest", "return_tensors": "pt",
                                  "add_special_tokens": self._adds_special_tokens(texts)}
        if images is not None and any(images):
            kwargs["images"] = [list(row) for row in images]
        with torch.inference_mode():
            return dict(self.processor(**kwargs))

    def _adds_special_tokens(self, texts: list[str]) -> bool:
        """As ``processor.apply_chat_template(tokenize=True)``: no second BOS when the template wrote one."""
        bos = self.tokenizer.bos_token
        return not (self.options.prompt_format == "chat" and bos and all(t.startswith(bos) for t in texts))

    # -- generation ----------------------------------------------------------------------------------------

    def _generate_batch(self, prompts: list[str], settings: GenerationSettings, requests: list[GenerationRequest],
                        images: list[list[Image.Image]] | None) -> list[str]:
        batch = self.encode(prompts, images)
        self.check_prompts_fit(requests, batch["attention_mask"].sum(dim=1).tolist(), settings)
        batch = {k: self._to_device(v) for k, v in batch.items()}
        return self._generate_text(lambda **kw: self.model.generate(**batch, **kw), batch["input_ids"].shape[1],
                                   settings, requests)

    def _to_device(self, value):
        if value.is_floating_point():  # pixels in the model's dtype; ids, masks and grid sizes stay integers
            return value.to(self.device, self.model.dtype)
        return value.to(self.device)

    def fingerprint(self) -> dict[str, Any]:
        template = getattr(self.processor, "chat_template", None) or getattr(self.tokenizer, "chat_template", None)
        return {
            **super().fingerprint(),
            "pretrained": self.pretrained,
            "revision": checkpoint_revision(self.model, self.revision),
            "weights_stat": local_weights_stat(self.loaded_from),  # a local folder written over is another model
            "architecture": type(self.model).__name__,
            "model_type": self.model.config.model_type,
            "prompt_format": self.options.prompt_format,
            "image_placement": self.slots.placement,
            "image_arguments": self.options.image_arguments(),
            "chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest() if template else None,
        }


def _preset(name: str, pretrained: str, description: str, **defaults: Any) -> None:
    MODELS.add_preset(name, "hf_vlm", description, pretrained=pretrained, **defaults)


# Tokens per EK-100 keyframe (456x256; docs/vlms.md): the CompAct prompt with 5 shots has 18 of them. Idefics3
# and SmolVLM tile a frame into up to 13 views, which would not fit their context 18 times over, so their
# presets send each keyframe as one view (image_splitting=false; image_splitting=true restores the checkpoint's).
_preset("smolvlm-instruct", "HuggingFaceTB/SmolVLM-Instruct",
        "SmolVLM 2B instruct (Idefics3 architecture; 81 tokens per keyframe with image_splitting=false)",
        image_splitting=False)
_preset("smolvlm2-2.2b-instruct", "HuggingFaceTB/SmolVLM2-2.2B-Instruct",
        "SmolVLM2 2.2B instruct (needs torchvision; 81 tokens per keyframe with image_splitting=false)",
        image_splitting=False)
_preset("idefics2-8b", "HuggingFaceM4/idefics2-8b",
        "Idefics2 8B instruct (64 tokens per view; 5 views per keyframe with image_splitting=true)")
_preset("idefics3-8b", "HuggingFaceM4/Idefics3-8B-Llama3",
        "Idefics3 8B on Llama 3 (169 tokens per keyframe with image_splitting=false)", image_splitting=False)
_preset("llava-1.5-7b", "llava-hf/llava-1.5-7b-hf",
        "LLaVA-1.5 7B (576 tokens per keyframe in a 4,096 context: 6 keyframes, i.e. --shots 1)")
_preset("llava-1.6-mistral-7b", "llava-hf/llava-v1.6-mistral-7b-hf",
        "LLaVA-NeXT 7B on Mistral (any-resolution tiles: about 1,600 tokens per keyframe)")
_preset("qwen2-vl-2b-instruct", "Qwen/Qwen2-VL-2B-Instruct",
        "Qwen2-VL 2B instruct (needs torchvision; 144 tokens per keyframe)")
_preset("qwen2-vl-7b-instruct", "Qwen/Qwen2-VL-7B-Instruct",
        "Qwen2-VL 7B instruct (needs torchvision; 144 tokens per keyframe)")
_preset("qwen2.5-vl-7b-instruct", "Qwen/Qwen2.5-VL-7B-Instruct",
        "Qwen2.5-VL 7B instruct (needs torchvision; 144 tokens per keyframe)")
