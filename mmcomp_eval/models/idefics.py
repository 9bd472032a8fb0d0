"""IDEFICS (``--model idefics`` and presets) plus what every vision-language adapter shares.

CompAct prompts IDEFICS with Fig. 7: three narrations, each followed by the
keyframe of its clip, for every few-shot example and for the query. The
evaluator hands the adapter one list of images per request, in prompt order
(queries *and* shots: lm-evaluation-harness and lmms-eval drop few-shot
images, which changes the task); the adapter splits the prompt at each
``<image>`` and interleaves text and images, so the i-th placeholder always
gets the i-th image.

Batches are padded on the left, and the processor builds, per row, which
image each token may attend to (IDEFICS attends to the most recent image
only); rows with fewer images get zero images that no token attends to. So
a row's answer does not depend on its batch: greedy and sampled outputs
are the same at batch size 1 and N (tested; sampling draws from each
request's own seeded stream, see ``models/decoding.py``).

``images=false`` withholds the images: placeholders are removed from the
prompt and no frames are read (``reads_images`` is false), which gives the
paper's L vs VL comparison with one model.

torch and transformers are imported when a model is built, not on import.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.model import Model, ModelCapabilities, ProgressCallback
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import decoding
from mmcomp_eval.models.hf import _bnb_config, _device, _guard, _resolve_pretrained
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from PIL import Image

#: ``auto``: bfloat16 on CUDA, float32 elsewhere (CPU bf16 matmuls are slow and less exact)
VLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
_PLACEHOLDER_RE = re.compile(r"[ \t]*" + re.escape(IMAGE_PLACEHOLDER))


def strip_placeholders(text: str) -> str:
    """The prompt without its ``<image>`` placeholders (text-only evaluation of a VLM)."""
    return _PLACEHOLDER_RE.sub("", text)


def interleave(text: str, images: Sequence[Any]) -> list[Any]:
    """``"a <image> b <image> c"`` + ``[i0, i1]`` -> ``["a ", i0, " b ", i1, " c"]`` (empty text pieces dropped)."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) - 1 != len(images):
        raise UserError(f"prompt holds {len(pieces) - 1} {IMAGE_PLACEHOLDER} placeholders but {len(images)} images "
                        "were given; the template's image() calls and the media disagree")
    out: list[Any] = []
    for k, piece in enumerate(pieces):
        if piece:
            out.append(piece)
        if k < len(images):
            out.append(images[k])
    return out


def torch_dtype(name: str):
    import torch

    if name not in VLM_DTYPES:
        raise UserError(f"model argument dtype={name!r} is not one of {', '.join(VLM_DTYPES)}")
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, name)


class VisionLanguageAdapter(Model):
    """Shared request handling: ordering, batching, sampling seeds, image checks, stop strings.

    Subclasses implement :meth:`_generate_batch` (one padded batch) and
    :meth:`_render` (the model's prompt text for one request).
    """


    @classmethod
    def capabilities_for(cls, args) -> ModelCapabilities:
        # text-only runs (images=false) keep the image tasks' prompts but read no frames
        images, max_images = bool(args.get("images", True)), args.get("max_images")
        if max_images is not None and max_images < 1:
            raise UserError(f"model argument max_images={max_images} must be at least 1")
        return ModelCapabilities(generate=True, images=True, reads_images=images,
                                 max_images=max_images if images else None)

    def _init_common(self, images: bool, max_images: int | None, batch_size: int) -> None:
        if batch_size < 1:
            raise UserError(f"model argument batch_size={batch_size} must be at least 1")
        self.capabilities = self.capabilities_for({"images": images, "max_images": max_images})
        self.reads_images = self.capabilities.reads_images
        self.max_images = self.capabilities.max_images
        self.batch_size = batch_size

    def generate(self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None,
                 images: Sequence[Sequence[Image.Image]] | None = None) -> list[str]:
        """One answer per request; ``images[i]`` are request ``i``'s images in prompt order."""
        if self.reads_images:
            if images is None and any(r.images for r in requests):
                raise UserError(f"model '{self.name}' got prompts with images but no image data; give the task "
                                "a media section, or run the model with images=false")
            if images is not None and len(images) != len(requests):
                raise ValueError(f"{len(images)} image lists for {len(requests)} requests")
        results = [""] * len(requests)
        groups: dict[GenerationSettings, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            groups[r.settings].append(i)
        for settings, indices in groups.items():
            prompts = {i: self._render(requests[i]) for i in indices}
            indices.sort(key=lambda i: -len(prompts[i]))  # stable: ties keep request order
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start:start + self.batch_size]
                batch_images = None
                if self.reads_images and images is not None:
                    batch_images = [list(images[i]) for i in batch]
                    for i, imgs in zip(batch, batch_images):
                        if self.max_images is not None and len(imgs) > self.max_images:
                            raise UserError(f"request {requests[i].request_id} has {len(imgs)} images; model "
                                            f"'{self.name}' takes at most {self.max_images}")
                texts = self._generate_batch([prompts[i] for i in batch], batch_images, settings,
                                             [requests[i] for i in batch])
                for i, text in zip(batch, texts):
                    results[i] = text
                if progress:
                    progress(len(batch))
        return results

    def _render(self, request: GenerationRequest) -> str:
        text = request.prompt if request.messages is None else self._chat(request.messages)
        return text if self.reads_images else strip_placeholders(text)

    def _chat(self, messages) -> str:
        raise UserError(f"model '{self.name}' has no chat format; drop --apply-chat-template")

    def _generate_batch(self, prompts: list[str], images: list[list[Image.Image]] | None,
                        settings: GenerationSettings, requests: list[GenerationRequest]) -> list[str]:
        raise NotImplementedError

    def _check_room(self, requests: list[GenerationRequest], lengths: list[int], settings: GenerationSettings) -> None:
        for request, n in zip(requests, lengths):
            if n + settings.max_new_tokens > self.max_length:
                raise UserError(f"request {request.request_id}: the prompt has {n} tokens and max_new_tokens is "
                                f"{settings.max_new_tokens}, more than the model's {self.max_length}; use fewer shots")

    @staticmethod
    def _decoding(settings: GenerationSettings, requests: list[GenerationRequest], width: int, tokenizer,
                  eos_ids: set[int]) -> dict[str, Any]:
        seeds = [r.sampling_seed() if settings.do_sample else 0 for r in requests]
        return decoding.generate_kwargs(settings, seeds, width, tokenizer, tokenizer.pad_token_id, eos_ids)


@MODELS.register("idefics")
class IdeficsAdapter(VisionLanguageAdapter):
    """IDEFICS through ``transformers`` (``IdeficsForVisionText2Text`` + ``IdeficsProcessor``)."""

    name = "idefics"

    def __init__(
        self,
        pretrained: str,
        revision: str | None = None,
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
        if load_in_4bit and load_in_8bit:
            raise UserError("model arguments load_in_4bit and load_in_8bit exclude each other")
        self.pretrained = pretrained
        self.revision = revision
        self.quantization = "4bit" if load_in_4bit else "8bit" if load_in_8bit else None
        self.trust_remote_code = trust_remote_code
        self.local_files_only = local_files_only or offline
        self._load(dtype, device, device_map, max_length)

    @classmethod
    def from_loaded(cls, model, processor, pretrained: str = "<in memory>", batch_size: int = 4,
                    images: bool = True, max_images: int | None = None) -> IdeficsAdapter:
        """An adapter around a model already in memory (GPU checks build a random 9B without saving it)."""
        self = cls.__new__(cls)
        self._init_common(images, max_images, batch_size)
        self.pretrained, self.revision, self.quantization = pretrained, None, None
        self.trust_remote_code, self.local_files_only = False, True
        self.model = model.eval()
        decoding.ignore_checkpoint_defaults(self.model)
        self.device = model.device
        self.processor = processor
        self._setup_tokenizer(None)
        return self

    def _load(self, dtype: str, device: str | None, device_map, max_length: int | None) -> None:
        from transformers import AutoProcessor, IdeficsForVisionText2Text

        torch_dt = torch_dtype(dtype)
        quant = _bnb_config(self.quantization, "bfloat16" if dtype == "auto" else dtype) if self.quantization else None
        source = _resolve_pretrained(self.pretrained)
        common = {"revision": self.revision, "trust_remote_code": self.trust_remote_code,
                  "local_files_only": self.local_files_only}
        kwargs: dict[str, Any] = {**common, "dtype": torch_dt}
        if quant is not None:
            kwargs["quantization_config"] = quant
            device_map = device_map or "auto"
        if device_map is not None:
            kwargs["device_map"] = device_map
        self.model = _guard(self.pretrained, lambda: IdeficsForVisionText2Text.from_pretrained(source, **kwargs))
        self.model.eval()
        decoding.ignore_checkpoint_defaults(self.model)
        if device_map is None:
            self.model.to(_device(device))
        self.device = self.model.device
        self.processor = _guard(self.pretrained, lambda: AutoProcessor.from_pretrained(source, **common))
        self._setup_tokenizer(max_length)

    def _setup_tokenizer(self, max_length: int | None) -> None:
        tok = self.processor.tokenizer
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.unk_token or tok.eos_token
        eos = {tok.eos_token_id}
        eou = tok.convert_tokens_to_ids("<end_of_utterance>")
        if isinstance(eou, int) and eou != tok.unk_token_id:
            eos.add(eou)  # the instruct models end their turn with it
        self.eos_ids = {e for e in eos if e is not None}
        self.max_length = max_length or self.model.config.max_position_embeddings

    def _chat(self, messages) -> str:
        """IDEFICS-instruct's dialogue format: ``User:``/``Assistant:`` turns ended by ``<end_of_utterance>``."""
        lines = []
        for m in messages:
            if m.role == "system":
                lines.append(m.content.strip() + "\n")
            else:
                who = "User" if m.role == "user" else "Assistant"
                lines.append(f"{who}: {m.content.strip()}<end_of_utterance>\n")
        return "".join(lines) + "Assistant:"

    def encode(self, prompts: list[str], images: list[list[Image.Image]] | None) -> dict:
        """The processor's padded batch: text split at each ``<image>``, the i-th image in the i-th slot."""
        import torch

        if images is not None:
            items = [interleave(p, imgs) for p, imgs in zip(prompts, images)]
        else:
            items = [[p] for p in prompts]
        with torch.inference_mode():
            return dict(self.processor(text=items, return_tensors="pt", padding="longest"))

    def _generate_batch(self, prompts, images, settings, requests):
        import torch

        batch = self.encode(prompts, images)
        self._check_room(requests, batch["attention_mask"].sum(dim=1).tolist(), settings)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        if "pixel_values" in batch:
            batch["pixel_values"] = batch["pixel_values"].to(self.model.dtype)
        width = batch["input_ids"].shape[1]
        tok = self.processor.tokenizer
        with torch.inference_mode():
            out = self.model.generate(**batch, **self._decoding(settings, requests, width, tok, self.eos_ids))
        return decoding.decode_new(tok, out[:, width:], self.eos_ids, settings.stop)

    def fingerprint(self) -> dict[str, Any]:
        import torch
        import transformers

        return {
            "name": self.name,
            "pretrained": self.pretrained,
            "revision": getattr(self.model.config, "_commit_hash", None) or self.revision,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "quantization": self.quantization,
            "images": self.reads_images,
            "architecture": type(self.model).__name__,
            "device": self.device.type,
            "max_length": self.max_length,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }


MODELS.add_preset("idefics-9b", "idefics", "IDEFICS 9B base (CompAct's VLM)", pretrained="HuggingFaceM4/idefics-9b")
MODELS.add_preset("idefics-9b-instruct", "idefics", "IDEFICS 9B instruct",
                  pretrained="HuggingFaceM4/idefics-9b-instruct")
MODELS.add_preset("idefics-80b", "idefics", "IDEFICS 80B base (sharded over GPUs)",
                  pretrained="HuggingFaceM4/idefics-80b", device_map="auto")
MODELS.add_preset("idefics-80b-instruct", "idefics", "IDEFICS 80B instruct (sharded over GPUs)",
                  pretrained="HuggingFaceM4/idefics-80b-instruct", device_map="auto")


# -- random-weight checkpoints (tests, GPU checks without weights) --------------------------------------------


def random_tokenizer(corpus: Sequence[str], vocab_size: int = 400, pad_to: int | None = None,
                     extra_special: Sequence[str] = ()):
    """A byte-level BPE tokenizer trained on ``corpus`` (offline, deterministic, any text encodes).

    ``pad_to`` adds filler tokens until the vocabulary has that many entries
    (so that ``extra_special`` get ids at or above it, like a real
    checkpoint's added tokens). Returns the tokenizer and the id of the first
    ``extra_special`` token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<unk>")
    if pad_to is not None and pad_to > len(fast):
        fast.add_tokens([f"<filler_{i}>" for i in range(pad_to - len(fast))])
    first_special = len(fast)
    if extra_special:
        fast.add_special_tokens({"additional_special_tokens": list(extra_special)})
    return fast, first_special


IDEFICS_9B = dict(  # HuggingFaceM4/idefics-9b config.json (LLaMA-7B + CLIP ViT-H/14 + perceiver)
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, cross_layer_interval=4, max_position_embeddings=2048, rms_norm_eps=1e-6,
    use_resampler=True, qk_layer_norms=False, tie_word_embeddings=False,
    vision_config=dict(embed_dim=1280, image_size=224, patch_size=14, num_hidden_layers=32, num_attention_heads=16,
                       intermediate_size=5120, hidden_act="gelu"),
    perceiver_config=dict(use_resampler=True, resampler_n_latents=64, resampler_depth=6, resampler_n_heads=16,
                          resampler_head_dim=96, qk_layer_norms_perceiver=False),
)
IDEFICS_TINY = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, cross_layer_interval=1,
    max_position_embeddings=2048, use_resampler=True,
    vision_config=dict(embed_dim=32, image_size=30, patch_size=10, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64),
    perceiver_config=dict(use_resampler=True, resampler_n_latents=4, resampler_depth=1, resampler_n_heads=2,
                          resampler_head_dim=8),
)
IDEFICS_SPECIAL = ("<fake_token_around_image>", "<image>", "<end_of_utterance>")


def random_idefics(corpus: Sequence[str], size: str = "tiny", seed: int = 0, dtype: str = "float32",
                   device: str = "cpu"):
    """A random-weight IDEFICS and its processor, built in memory on ``device``.

    ``size="9b"`` has idefics-9b's shapes (about 9 billion parameters, a
    32,000-token vocabulary padded with filler tokens): for throughput and
    memory checks where the real weights are absent. The special tokens get
    ids past ``vocab_size``, i.e. IDEFICS's "additional" embeddings, as in
    the real checkpoints. The gates start at 1 (IDEFICS trains them from 0)
    so that images change the output, which is what the tests check.
    """
    import torch
    from transformers import IdeficsConfig, IdeficsForVisionText2Text, IdeficsImageProcessor, IdeficsProcessor

    spec = {"tiny": IDEFICS_TINY, "9b": IDEFICS_9B}[size]
    tokenizer, vocab = random_tokenizer(corpus, vocab_size=400 if size == "tiny" else 2000,
                                        pad_to=spec.get("vocab_size"), extra_special=IDEFICS_SPECIAL)
    config = IdeficsConfig(**{**spec, "vocab_size": vocab, "additional_vocab_size": len(IDEFICS_SPECIAL)},
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, alpha_initializer="ones",
                           initializer_range=0.5 if size == "tiny" else 0.02)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # parameters are created in ``dtype``: no float32 copy of 9B
    try:
        with torch.device(device):
            model = IdeficsForVisionText2Text(config).eval()
    finally:
        torch.set_default_dtype(previous)
    image_size = spec["vision_config"]["image_size"]
    processor = IdeficsProcessor(IdeficsImageProcessor(image_size=image_size), tokenizer, image_size=image_size)
    return model, processor


def save_random_idefics(folder: Path, corpus: Sequence[str], size: str = "tiny", seed: int = 0,
                        dtype: str = "float32") -> Path:
    """:func:`random_idefics` saved as a folder loadable with ``pretrained=folder``."""
    model, processor = random_idefics(corpus, size, seed, dtype)
    folder = Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
