"""IDEFICS (``--model idefics`` and presets), through transformers' ``IdeficsForVisionText2Text``.

The processor splits the prompt at each ``<image>`` and interleaves text and
images (``models/vlm.py``). Batches are padded on the left, and the
processor builds, per row, which image each token may attend to (IDEFICS
attends to the most recent image only); rows with fewer images get zero
images that no token attends to. So a row's answer does not depend on its
batch: greedy and sampled outputs are the same at batch size 1 and N
(tested; sampling draws from each request's own seeded stream, see
``models/decoding.py``).

As the model card's example does, generation may never produce ``<image>``
or ``<fake_token_around_image>`` (``bad_words_ids``), and the instruct
models end their turn with ``<end_of_utterance>``.

torch and transformers are imported when a model is built, not on import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.model import IN_MEMORY
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.models import decoding
from mmcomp_eval.models.loading import context_length, guarded_load, local_weights_stat
from mmcomp_eval.models.local import checkpoint_revision, pad_on_the_left
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.models.vlm import VisionLanguageModel, interleave

if TYPE_CHECKING:
    from PIL import Image

#: tokens generation may not produce (the model card passes them as ``bad_words_ids``)
BANNED_TOKENS = ("<image>", "<fake_token_around_image>")


@MODELS.register("idefics")
class IdeficsAdapter(VisionLanguageModel):
    """IDEFICS through ``transformers`` (``IdeficsForVisionText2Text`` + ``IdeficsProcessor``).

    Besides ``pretrained`` and ``revision`` it takes every
    :class:`~mmcomp_eval.models.vlm.VisionOptions` field.
    """

    name = "idefics"

    def __init__(self, pretrained: str, revision: str | None = None, **options: Any):
        super().__init__(options)
        self.pretrained = pretrained
        self.revision = revision
        self._load()

    @classmethod
    def from_loaded(cls, model, processor, pretrained: str = IN_MEMORY, batch_size: int = 4,
                    images: bool = True, max_images: int | None = None) -> IdeficsAdapter:
        """An adapter around a model already in memory (GPU checks build a random 9B without saving it)."""
        self = cls.__new__(cls)
        VisionLanguageModel.__init__(self, {"batch_size": batch_size, "images": images, "max_images": max_images,
                                            "local_files_only": True})
        self.pretrained, self.revision = pretrained, None
        self._adopt(model, processor)
        return self

    def _load(self) -> None:
        from transformers import AutoProcessor, IdeficsForVisionText2Text

        weights_kwargs, target, source, common = self._load_arguments()
        self.loaded_from = source
        model = guarded_load(self.pretrained,
                             lambda: IdeficsForVisionText2Text.from_pretrained(source, **common, **weights_kwargs))
        if target is not None:
            model.to(target)
        processor = guarded_load(self.pretrained, lambda: AutoProcessor.from_pretrained(source, **common))
        self._adopt(model, processor)

    def _adopt(self, model, processor) -> None:
        """Take a loaded model and processor: decoding defaults, padding, end tokens, context length."""
        self.model = model.eval()
        decoding.ignore_checkpoint_defaults(self.model)
        self.device = self.model.device
        self.processor = processor
        self.tokenizer = tok = processor.tokenizer
        pad_on_the_left(tok, tok.unk_token, tok.eos_token)
        eos = {tok.eos_token_id}
        eou = tok.convert_tokens_to_ids("<end_of_utterance>")
        if isinstance(eou, int) and eou != tok.unk_token_id:
            eos.add(eou)  # the instruct models end their turn with it
        self.eos_ids = {e for e in eos if e is not None}
        self.max_length = self.options.max_length or context_length(self.model.config)
        # the model card: tokenizer(["<image>", "<fake_token_around_image>"], add_special_tokens=False).input_ids
        self.bad_words_ids = tok(list(BANNED_TOKENS), add_special_tokens=False).input_ids

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

    def _generate_batch(self, prompts: list[str], settings: GenerationSettings, requests: list[GenerationRequest],
                        images: list[list[Image.Image]] | None) -> list[str]:
        batch = self.encode(prompts, images)
        self.check_prompts_fit(requests, batch["attention_mask"].sum(dim=1).tolist(), settings)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        if "pixel_values" in batch:
            batch["pixel_values"] = batch["pixel_values"].to(self.model.dtype)

        def generate(generation_config, **kw):
            generation_config.bad_words_ids = self.bad_words_ids
            return self.model.generate(**batch, generation_config=generation_config, **kw)

        return self._generate_text(generate, batch["input_ids"].shape[1], settings, requests)

    def fingerprint(self) -> dict[str, Any]:
        return {
            **super().fingerprint(),
            "pretrained": self.pretrained,
            "revision": checkpoint_revision(self.model, self.revision),
            "weights_stat": local_weights_stat(self.loaded_from),  # a local folder written over is another model
            "architecture": type(self.model).__name__,
            "bad_words": list(BANNED_TOKENS),
        }


MODELS.add_preset("idefics-9b", "idefics",
                  "IDEFICS 9B base (not the paper's model: CompAct used the instruction-tuned one)",
                  pretrained="HuggingFaceM4/idefics-9b")
MODELS.add_preset("idefics-9b-instruct", "idefics",
                  "IDEFICS 9B instruct, CompAct's VLM ('the LLM of IDEFICS (instruct-tuned LLaMA1)', App. E.3.1), "
                  "prompted as in the paper with the plain Fig. 7 text (no --apply-chat-template)",
                  pretrained="HuggingFaceM4/idefics-9b-instruct")
MODELS.add_preset("idefics-80b", "idefics", "IDEFICS 80B base (sharded over GPUs)",
                  pretrained="HuggingFaceM4/idefics-80b", device_map="auto")
MODELS.add_preset("idefics-80b-instruct", "idefics", "IDEFICS 80B instruct (sharded over GPUs)",
                  pretrained="HuggingFaceM4/idefics-80b-instruct", device_map="auto")
