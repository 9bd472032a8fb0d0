"""The base of the adapters that run a transformers model in this process (``hf``, ``idefics``, ``open_flamingo``, ``otter``).

What differs between them is how a checkpoint becomes a model, how one
request becomes model input and how one padded batch is generated. What does
not differ lives here, so that a fix or a feature (``batch_size=auto``, an
answer stored the moment it exists) reaches every local adapter at once:

* :class:`LocalOptions`, the model arguments they all accept (dtype, device,
  quantisation, offline loading, batch size, context length), checked before
  anything loads. Adapters take them as ``**options`` beside their own
  arguments and name the dataclass in ``options_type``;
  :func:`~mmcomp_eval.config.model_args.coerce_kwargs` reads its fields, so a
  ``--model-args`` typo still gets a did-you-mean before any download.
* :class:`LocalModel`, one generation loop: requests grouped by their
  settings, longest first, batched by :mod:`~mmcomp_eval.models.batching`
  (a fixed size, or ``auto`` with out-of-memory back-off), each answer
  reported through ``on_result`` as soon as its batch is done so the
  response store keeps it even if the run dies on the next batch.
* the prompt-length checks and the fingerprint fields all adapters share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mmcomp_eval.api.model import Model, ProgressCallback, ResultCallback
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.config.model_args import ArgumentOptions
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import decoding
from mmcomp_eval.models.batching import DEFAULT_MAX_BATCH, BatchSizer, parse_batch_size, run_batches
from mmcomp_eval.models.loading import resolve_device, resolve_pretrained

if TYPE_CHECKING:
    import torch

#: ``auto`` is the adapter's choice (see :meth:`LocalOptions.torch_dtype`)
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LocalOptions(ArgumentOptions):
    """Model arguments every local adapter accepts: how to load the weights and how to batch requests."""

    #: ``auto``: the checkpoint's own dtype (see :meth:`torch_dtype`)
    dtype: str = "auto"
    #: ``cpu``, ``cuda``, ``cuda:1``; unset: this process's GPU, else the CPU
    device: str | None = None
    #: accelerate's placement (``auto`` shards over the GPUs); set, ``device`` is not used
    device_map: str | dict | None = None
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    #: off by default: remote code runs with the user's rights
    trust_remote_code: bool = False
    #: never download (``offline`` is the same, spelled like the CLI flag)
    local_files_only: bool = False
    offline: bool = False
    #: rows per batch, or ``auto`` (largest that fits, see models/batching.py)
    batch_size: int | str = 8
    #: the most rows ``auto`` tries
    max_batch_size: int = DEFAULT_MAX_BATCH
    #: the model's context length (prompt plus answer); unset: read from its config
    max_length: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UserError(f"model argument dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.load_in_4bit and self.load_in_8bit:
            raise UserError("model arguments load_in_4bit and load_in_8bit exclude each other")
        object.__setattr__(self, "batch_size", parse_batch_size(self.batch_size))

    @property
    def quantization(self) -> str | None:
        return "4bit" if self.load_in_4bit else "8bit" if self.load_in_8bit else None

    @property
    def files_only(self) -> bool:
        return self.local_files_only or self.offline

    def torch_dtype(self) -> Any:
        """The ``dtype`` for ``from_pretrained``: ``"auto"`` keeps the checkpoint's."""
        import torch

        return "auto" if self.dtype == "auto" else getattr(torch, self.dtype)

    def hub_kwargs(self) -> dict[str, Any]:
        """What every ``from_pretrained`` call of the adapter gets (models, tokenizers, processors)."""
        return {"trust_remote_code": self.trust_remote_code, "local_files_only": self.files_only}

    def weights_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` arguments that decide the weights' dtype and placement.

        Quantised weights are placed by accelerate (``device_map=auto`` unless
        given). Called before anything loads, so that a quantisation request
        this machine cannot serve fails first.
        """
        kwargs: dict[str, Any] = {"dtype": self.torch_dtype()}
        device_map = self.device_map
        if self.quantization:
            kwargs["quantization_config"] = self._bitsandbytes_config()
            device_map = device_map or "auto"
        if device_map is not None:
            kwargs["device_map"] = device_map
        return kwargs

    def target_device(self) -> torch.device | None:
        """Where to move the loaded model; None when accelerate places it (``device_map``, quantisation)."""
        if self.device_map is not None or self.quantization:
            return None
        return resolve_device(self.device)

    def _bitsandbytes_config(self):
        import importlib.util

        import torch

        if not torch.cuda.is_available():
            raise UserError(
                f"load_in_{self.quantization} quantisation (bitsandbytes) needs CUDA, which this machine lacks; "
                "drop it or use dtype=bfloat16"
            )
        if importlib.util.find_spec("bitsandbytes") is None:
            raise UserError(f"load_in_{self.quantization} needs bitsandbytes: pip install bitsandbytes")
        from transformers import BitsAndBytesConfig

        if self.quantization == "4bit":
            compute = torch.bfloat16 if self.dtype == "auto" else getattr(torch, self.dtype)
            return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=compute)
        return BitsAndBytesConfig(load_in_8bit=True)



@dataclass(frozen=True)
class EncodedPrompt:
    """One request as its adapter's batch function takes it, and its length in tokens (to sort and size batches)."""

    value: Any  # token ids (hf), the rendered prompt text (vision-language adapters)
    length: int


def pad_on_the_left(tokenizer, *pad_candidates: str | None) -> None:
    """Pad batches on the left, so every row's next token is in the last column.

    Tokenizers without a pad token get the first of ``pad_candidates`` that
    exists; the attention mask hides padding, so which token it is does not
    change an answer.
    """
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        candidate = next((t for t in pad_candidates if t is not None), None)
        if candidate is not None:
            tokenizer.pad_token = candidate


class LocalModel(Model):
    """Shared loading options, generation loop, prompt-length checks and fingerprint fields.

    A subclass calls ``super().__init__(options)`` first (options are checked
    before anything loads), then loads and sets ``model``, ``tokenizer``,
    ``device``, ``eos_ids`` and ``max_length``, and implements:

    * :meth:`_encode`: one request as an :class:`EncodedPrompt`;
    * :meth:`_generate_batch`: answers for one batch of encoded prompts
      (usually through :meth:`_generate_text`).
    """

    #: the dataclass of the ``**options`` this adapter accepts (read by ``coerce_kwargs``)
    options_type: ClassVar[type[LocalOptions]] = LocalOptions

    #: the checkpoint (Hub id, folder or ``pkg:`` reference) and revision a subclass sets before loading
    pretrained: str
    revision: str | None = None
    #: the folder the weights were read from (``pkg:`` resolved); None for a model handed over in memory
    loaded_from: str | None = None
    model: Any
    tokenizer: Any
    device: torch.device
    eos_ids: set[int]
    max_length: int

    def __init__(self, options: Mapping[str, Any]):
        self.options = self.options_type.from_arguments(self.name, options)
        self.batch_size = self.options.batch_size

    @property
    def batch_size(self) -> int | str:
        """Rows per batch, or ``"auto"``; setting it starts a new :class:`BatchSizer`."""
        return "auto" if self._sizer.auto else self._sizer.fixed

    @batch_size.setter
    def batch_size(self, value: int | str) -> None:
        self._sizer = BatchSizer(parse_batch_size(value), self.options.max_batch_size)

    # -- generation ----------------------------------------------------------------------------------------

    def _load_arguments(self) -> tuple[dict[str, Any], torch.device | None, str, dict[str, Any]]:
        """What ``_load`` passes to ``from_pretrained``: (weights kwargs, target device, source, hub kwargs).

        Computed before anything is read, so a mistake in the arguments costs
        no load. The weights kwargs (dtype, device map, quantisation) go to the
        model's call only; the hub kwargs (revision, offline, trust_remote_code)
        to every call (model, tokenizer, processor); the target device is
        where to move the model, None when a device map placed it.
        """
        weights_kwargs = self.options.weights_kwargs()
        target = self.options.target_device()
        source = resolve_pretrained(self.pretrained)
        return weights_kwargs, target, source, {"revision": self.revision, **self.options.hub_kwargs()}

    def _generate_requests(self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None,
                           on_result: ResultCallback | None, images: Sequence | None = None) -> list[str]:
        """Answers in request order; ``images[i]`` (read one batch at a time) are request ``i``'s images.

        Requests with the same settings are batched together, longest first
        (ties keep request order), so a batch wastes little on padding.
        """
        encoded = [self._encode(r) for r in requests]
        results = [""] * len(requests)
        groups: dict[GenerationSettings, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            groups[request.settings].append(i)
        for settings, indices in groups.items():
            if settings.max_new_tokens < 1:
                if progress:
                    progress(len(indices))
                continue
            budget = self.prompt_budget(settings)
            indices.sort(key=lambda i: -encoded[i].length)
            width = lambda b: min(encoded[b[0]].length, budget) + settings.max_new_tokens  # noqa: E731

            run = lambda b: self._generate_batch([encoded[i].value for i in b], settings,  # noqa: E731
                                                 [requests[i] for i in b], self._batch_images(requests, images, b))

            for batch, texts in run_batches(indices, width, self._sizer, run):
                for i, text in zip(batch, texts):
                    results[i] = text
                    if on_result:
                        on_result(i, text)
                if progress:
                    progress(len(batch))
        return results

    def _batch_images(self, requests: Sequence[GenerationRequest], images: Sequence | None,
                      batch: list[int]) -> list[list[Any]] | None:
        if images is None:
            return None
        rows = [list(images[i]) for i in batch]
        limit = self.capabilities.max_images
        for i, row in zip(batch, rows):
            if limit is not None and len(row) > limit:
                raise UserError(f"request {requests[i].request_id} has {len(row)} images; model "
                                f"'{self.name}' takes at most {limit}")
        return rows

    def _encode(self, request: GenerationRequest) -> EncodedPrompt:
        raise NotImplementedError

    def _generate_batch(self, prompts: list[Any], settings: GenerationSettings, requests: list[GenerationRequest],
                        images: list[list[Any]] | None) -> list[str]:
        """Answers for one batch: ``prompts`` are the encoded values, ``images`` each row's images or None."""
        raise NotImplementedError

    def _generate_text(self, generate: Callable[..., Any], width: int, settings: GenerationSettings,
                       requests: Sequence[GenerationRequest]) -> list[str]:
        """Run ``generate(**decoding arguments)`` on a left-padded batch of ``width`` columns; decode the new text.

        Each row samples from its own seeded stream (``models/decoding.py``).
        """
        import torch

        seeds = [r.sampling_seed() if settings.do_sample else 0 for r in requests]
        kwargs = decoding.generate_kwargs(settings, seeds, width, self.tokenizer, self.tokenizer.pad_token_id,
                                          self.eos_ids)
        with torch.inference_mode():
            out = generate(**kwargs)
        return decoding.decode_new(self.tokenizer, out[:, width:], self.eos_ids, settings.stop)

    # -- prompt length -------------------------------------------------------------------------------------

    def prompt_budget(self, settings: GenerationSettings) -> int:
        """How many prompt tokens fit beside ``max_new_tokens`` new ones."""
        budget = self.max_length - settings.max_new_tokens
        if budget < 1:
            raise UserError(f"max_new_tokens={settings.max_new_tokens} leaves no room for a prompt "
                            f"in the model's {self.max_length} tokens")
        return budget

    def check_prompts_fit(self, requests: Sequence[GenerationRequest], lengths: Sequence[int],
                          settings: GenerationSettings) -> None:
        """Refuse prompts that cannot be cut (images would be lost): ``lengths`` are their exact token counts."""
        for request, n in zip(requests, lengths):
            if n + settings.max_new_tokens > self.max_length:
                raise UserError(f"request {request.request_id}: the prompt has {n} tokens and max_new_tokens is "
                                f"{settings.max_new_tokens}, more than the model's {self.max_length}; use fewer shots")

    # -- identity ------------------------------------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        """The fields every local adapter's answers depend on; adapters add their checkpoint's identity."""
        import torch
        import transformers

        return {
            "name": self.name,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "quantization": self.options.quantization,
            "device": self.device.type,
            "max_length": self.max_length,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }


def checkpoint_revision(model, revision: str | None) -> str | None:
    """The Hub commit a model was loaded from, else the revision asked for (None for local folders)."""
    return getattr(model.config, "_commit_hash", None) or revision
