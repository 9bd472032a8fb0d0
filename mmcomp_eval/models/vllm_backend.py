"""vLLM backends: ``--model vllm`` (text) and ``--model vllm-vlm`` (images), for fast GPU inference.

Used the way lm-evaluation-harness and lmms-eval use vLLM: one offline
``vllm.LLM`` engine per process (``tensor_parallel_size`` shards it over
GPUs; ``gpu_memory_utilization``, ``max_model_len``, ``enable_prefix_caching``,
``dtype``, ``quantization`` are passed through), prompts given as token ids,
one ``SamplingParams`` per request. Data parallelism is the harness's own
(``--num-processes N`` / ``accelerate launch``): each process takes every N-th
document and the ``tensor_parallel_size`` GPUs of its rank (set through
``CUDA_VISIBLE_DEVICES`` before vLLM starts), and answers meet in the
response store; lm-eval's ``data_parallel_size`` (Ray) is refused with that
hint.

The requests are the ones the ``hf`` adapter gets, answered the same way:

* prompts are tokenised exactly as ``hf`` does (special tokens unless the
  chat template rendered them; ``--apply-chat-template`` through the
  tokenizer's template) and cut from the left to ``max_model_len -
  max_new_tokens`` (:func:`token_prompt`);
* decoding follows the task's settings, not the checkpoint's
  ``generation_config.json`` (every field is given explicitly):
  :func:`sampling_kwargs` has the mapping, and sampling is seeded per request
  with :meth:`GenerationRequest.sampling_seed`, so a sampled answer does not
  depend on its batch (vLLM draws from a per-request generator when a seed is
  given). The draws are vLLM's, not ``hf``'s: the same seed gives other
  samples than ``hf``, and greedy answers can differ where vLLM's kernels
  round differently from transformers'; the fingerprint says ``vllm``, so the
  response store never mixes the two;
* answers are cut at the stop strings and stripped like every adapter's.

Beam search is refused (vLLM's ``beam_search`` takes no stop strings or
repetition penalty, so it would not be the search ``hf`` runs).

vLLM is an optional extra (``pip install 'mmcomp-eval[vllm]'``, Linux with a
CUDA GPU). It is imported only when a model is built; before that, the run
checks that vLLM is installed and a GPU is visible, so a CPU machine gets one
line instead of a traceback, before any task is prepared.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from mmcomp_eval.api.model import Model, ModelCapabilities, ProgressCallback, ResultCallback
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.config.model_args import ArgumentOptions
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.batching import parse_batch_size
from mmcomp_eval.models.decoding import clean, refuse_unsupported
from mmcomp_eval.models.loading import guarded_load, resolve_pretrained
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.models.vlm import strip_placeholders
from mmcomp_eval.models.vllm_requests import unsupported, sampling_kwargs, token_prompt, with_image_tokens, content_parts
from mmcomp_eval.paths import is_offline
from mmcomp_eval.runtime import parallel
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from PIL import Image

DTYPES = ("auto", "float16", "bfloat16", "float32")
INSTALL_HINT = "pip install 'mmcomp-eval[vllm]' (Linux with a CUDA GPU)"


# -- arguments ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VLLMOptions(ArgumentOptions):
    """Model arguments of ``vllm``: the engine's (lm-eval's names) and how many requests go per call."""

    #: ``auto``: the checkpoint's dtype (vLLM's rule: float32 checkpoints run in bfloat16/float16)
    dtype: str = "auto"
    revision: str | None = None
    #: another tokenizer than the checkpoint's (a Hub id or folder)
    tokenizer: str | None = None
    #: off by default: remote code runs with the user's rights
    trust_remote_code: bool = False
    #: vLLM's ``quantization`` (``awq``, ``gptq``, ``fp8``, ``bitsandbytes``...): unset reads the checkpoint's
    quantization: str | None = None
    #: GPUs one engine is sharded over
    tensor_parallel_size: int = 1
    #: lm-eval's Ray data parallelism; here ``--num-processes`` does that (see the module docstring)
    data_parallel_size: int = 1
    #: share of each GPU's memory vLLM may take (weights, activations, KV cache)
    gpu_memory_utilization: float = 0.9
    #: context length (prompt plus answer); unset: the checkpoint's
    max_model_len: int | None = None
    #: lm-eval's other name for ``max_model_len``
    max_length: int | None = None
    #: reuse the KV cache of shared prompt prefixes (few-shot prompts share their shots); unset: vLLM's default
    enable_prefix_caching: bool | None = None
    #: no CUDA graphs: slower, but starts faster and takes less memory
    enforce_eager: bool = False
    #: most sequences the engine runs at once; unset: vLLM's default
    max_num_seqs: int | None = None
    #: requests per ``LLM.generate`` call, i.e. how often answers are stored (vLLM batches continuously inside
    #: a call); ``auto``: all of them in one call
    batch_size: int | str = 256
    #: never download (``--offline`` sets it; vLLM reads HF_HUB_OFFLINE)
    offline: bool = False
    local_files_only: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UserError(f"model argument dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        for name in ("tensor_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 1:
                raise UserError(f"model argument {name}={value!r} must be at least 1")
        if self.data_parallel_size > 1:
            raise UserError(f"data_parallel_size={self.data_parallel_size}: mmcomp-eval runs data parallel itself; "
                            f"use --num-processes {self.data_parallel_size} (each process takes "
                            "tensor_parallel_size GPUs) and drop data_parallel_size")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UserError(f"model argument gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        if self.max_model_len is not None and self.max_length is not None:
            raise UserError("model arguments max_model_len and max_length are the same setting; give one")
        if self.context_length is not None and self.context_length < 2:
            raise UserError(f"model argument max_model_len={self.context_length} must be at least 2")
        object.__setattr__(self, "batch_size", parse_batch_size(self.batch_size))

    @property
    def context_length(self) -> int | None:
        return self.max_model_len if self.max_model_len is not None else self.max_length

    @property
    def files_only(self) -> bool:
        return self.offline or self.local_files_only

    def engine_kwargs(self, model: str) -> dict[str, Any]:
        """``vllm.LLM(**...)`` for checkpoint ``model``: only what is set, so vLLM's defaults stay vLLM's."""
        kwargs: dict[str, Any] = {
            "model": model, "tokenizer": self.tokenizer or model, "revision": self.revision, "dtype": self.dtype,
            "trust_remote_code": self.trust_remote_code, "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization, "enforce_eager": self.enforce_eager,
            "seed": 0,  # every request carries its own seed; this one only seeds what has none
        }
        optional = {"quantization": self.quantization, "max_model_len": self.context_length,
                    "enable_prefix_caching": self.enable_prefix_caching, "max_num_seqs": self.max_num_seqs}
        kwargs.update({k: v for k, v in optional.items() if v is not None})
        return kwargs



@dataclass(frozen=True)
class VLLMVisionOptions(VLLMOptions):
    """:class:`VLLMOptions` plus the images a VLM reads."""

    #: images cost memory per sequence: fewer requests per call
    batch_size: int | str = 64
    #: false: the prompts' placeholders are removed and no frames are read (text-only evaluation)
    images: bool = True
    #: most images one request may carry (vLLM's ``limit_mm_per_prompt``); unset: vLLM's default
    max_images: int | None = None
    #: the text that stands for one image in a prompt without chat template; unset: the model's own, from vLLM
    image_token: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_images is not None and (isinstance(self.max_images, bool) or self.max_images < 1):
            raise UserError(f"model argument max_images={self.max_images!r} must be at least 1")

    def engine_kwargs(self, model: str) -> dict[str, Any]:
        kwargs = super().engine_kwargs(model)
        if self.max_images is not None:
            kwargs["limit_mm_per_prompt"] = {"image": self.max_images}
        return kwargs


# -- the GPUs a process takes, checked before anything is prepared -------------------------------------------


def gpu_slice(visible: Sequence[str], local_rank: int, tensor_parallel_size: int) -> list[str]:
    """The GPUs of data-parallel process ``local_rank``: the ``tensor_parallel_size`` after those of lower ranks."""
    start = local_rank * tensor_parallel_size
    if start + tensor_parallel_size > len(visible):
        raise UserError(f"process {local_rank} needs GPUs {start}..{start + tensor_parallel_size - 1} "
                        f"(tensor_parallel_size={tensor_parallel_size}) but {len(visible)} are visible "
                        f"({', '.join(visible) or 'none'}); use fewer --num-processes or a smaller "
                        "tensor_parallel_size")
    return list(visible[start:start + tensor_parallel_size])


def require_vllm(owner: str, tensor_parallel_size: int) -> None:
    """vLLM installed and enough GPUs visible, checked without importing vLLM or starting CUDA."""
    if importlib.util.find_spec("vllm") is None:
        raise UserError(f"model '{owner}' needs vLLM, which is not installed: {INSTALL_HINT}; "
                        "on a machine without a GPU use --model hf")
    import torch

    count = torch.cuda.device_count()  # NVML: does not initialise CUDA, so CUDA_VISIBLE_DEVICES can still change
    if count == 0:
        raise UserError(f"model '{owner}' runs vLLM, which needs a CUDA GPU, and none is visible "
                        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                        "use --model hf on this machine")
    world = parallel.current().world_size
    if count < tensor_parallel_size * world:
        raise UserError(f"model '{owner}': {world} process(es) x tensor_parallel_size={tensor_parallel_size} "
                        f"need {tensor_parallel_size * world} GPUs but {count} are visible")


# -- the engine ------------------------------------------------------------------------------------------------------


class Engine(Protocol):
    """What the adapters need of an inference engine: :class:`VLLMEngine` wraps ``vllm.LLM`` into it."""

    tokenizer: Any
    max_model_len: int

    def generate(self, prompts: list[dict[str, Any]], params: list[dict[str, Any]]) -> list[str]:
        """One text per prompt (``{"prompt_token_ids": [...], "multi_modal_data": {...}}``), in order."""

    def describe(self) -> dict[str, Any]:
        """Fingerprint fields: what the engine runs (library version, dtype...)."""

    def placeholder(self, index: int) -> str | None:
        """Vision engines: the model's text for its ``index``-th image (1-based), None when unknown."""


class VLLMEngine:
    """A ``vllm.LLM`` behind the :class:`Engine` protocol."""

    def __init__(self, llm):
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.model_config = getattr(llm, "model_config", None) or llm.llm_engine.model_config
        self.max_model_len = int(self.model_config.max_model_len)

    def generate(self, prompts: list[dict[str, Any]], params: list[dict[str, Any]]) -> list[str]:
        from vllm import SamplingParams

        try:
            outputs = self.llm.generate(prompts, [SamplingParams(**p) for p in params], use_tqdm=False)
        except ValueError as exc:  # vLLM validates every prompt (length, image count) before running any
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            hint = ("use fewer shots or a larger max_model_len" if "length" in first else
                    "set max_images to the most images a prompt carries" if "image" in first else
                    "check the model arguments")
            raise UserError(f"vLLM refused a prompt: {first}; {hint}") from None
        return [o.outputs[0].text for o in outputs]

    def placeholder(self, index: int) -> str | None:
        """The model's text for its ``index``-th image (vLLM's own table), or None when vLLM does not say."""
        try:
            from vllm.model_executor.model_loader.utils import get_model_architecture

            model_cls = get_model_architecture(self.model_config)[0]
            return model_cls.get_placeholder_str("image", index)
        except (ImportError, AttributeError, ValueError, NotImplementedError):
            return None

    def describe(self) -> dict[str, Any]:
        import vllm

        return {"vllm": vllm.__version__, "dtype": str(self.model_config.dtype).removeprefix("torch."),
                "architecture": (getattr(self.model_config.hf_config, "architectures", None) or [None])[0]}


def build_engine(options: VLLMOptions, source: str) -> VLLMEngine:
    """Start vLLM for ``source`` on this process's GPUs."""
    proc = parallel.current()
    if proc.world_size > 1:  # harness data parallelism: this process's share of the GPUs
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else [
            str(i) for i in range(torch.cuda.device_count())]
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_slice(ids, proc.local_rank, options.tensor_parallel_size))
    if options.files_only:
        os.environ["HF_HUB_OFFLINE"] = "1"  # vLLM and the Hub client read it
    from vllm import LLM

    return VLLMEngine(LLM(**options.engine_kwargs(source)))


# -- the adapters ----------------------------------------------------------------------------------------------------


@MODELS.register("vllm")
class VLLMCausalLM(Model):
    """A causal LM served by vLLM in this process; takes ``pretrained`` and every :class:`VLLMOptions` field."""

    name = "vllm"
    capabilities = ModelCapabilities(generate=True, reports_each_result=True)
    options_type: ClassVar[type[VLLMOptions]] = VLLMOptions
    options: VLLMOptions

    def __init__(self, pretrained: str, **options: Any):
        self.options = self.options_type.from_arguments(self.name, options)
        self.capabilities = self._capabilities(self.options)
        require_vllm(self.name, self.options.tensor_parallel_size)
        self.pretrained = pretrained
        self.engine: Engine = build_engine(self.options, resolve_pretrained(pretrained))

    @classmethod
    def with_engine(cls, engine: Engine, pretrained: str, **options: Any) -> VLLMCausalLM:
        """The adapter around an engine already running (a ``VLLMEngine(vllm.LLM(...))`` built by the caller)."""
        self = cls.__new__(cls)
        self.options = cls.options_type.from_arguments(cls.name, options)
        self.capabilities = cls._capabilities(self.options)
        self.pretrained = pretrained
        self.engine = engine
        return self

    @classmethod
    def capabilities_for(cls, args: Mapping[str, Any]) -> ModelCapabilities:
        """Also checks that vLLM and the GPUs are there: a CPU machine learns it before any task is prepared."""
        options = cls.options_type.from_arguments(cls.name, {k: v for k, v in args.items() if k != "pretrained"})
        require_vllm(cls.name, options.tensor_parallel_size)
        return cls._capabilities(options)

    @classmethod
    def _capabilities(cls, options: VLLMOptions) -> ModelCapabilities:
        return cls.capabilities

    # -- generation ----------------------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None,
                 on_result: ResultCallback | None = None, images: Sequence | None = None) -> list[str]:
        """Answers in request order, stored call by call (``batch_size`` requests per ``LLM.generate``)."""
        refuse_unsupported(self.name, requests, unsupported)
        images = self._checked_images(requests, images)
        results = [""] * len(requests)
        size = len(requests) if self.options.batch_size == "auto" else self.options.batch_size
        for start in range(0, len(requests), max(size, 1)):
            rows = range(start, min(start + size, len(requests)))
            prompts = [self._prompt(requests[i], None if images is None else images[i]) for i in rows]
            texts = self.engine.generate(prompts, [sampling_kwargs(requests[i]) for i in rows])
            for i, text in zip(rows, texts):
                results[i] = clean(text, requests[i].settings.stop)
                if on_result:
                    on_result(i, results[i])
            if progress:
                progress(len(rows))
        return results

    def _checked_images(self, requests: Sequence[GenerationRequest], images: Sequence | None) -> Sequence | None:
        for request in requests:
            if request.images:
                raise UserError(f"model '{self.name}' is text-only but request {request.request_id} has images; "
                                "use vllm-vlm")
        return None

    def _budget(self, settings: GenerationSettings) -> int:
        budget = self.engine.max_model_len - settings.max_new_tokens
        if budget < 1:
            raise UserError(f"max_new_tokens={settings.max_new_tokens} leaves no room for a prompt in the model's "
                            f"{self.engine.max_model_len} tokens")
        return budget

    def _prompt(self, request: GenerationRequest, images: list[Image.Image] | None) -> dict[str, Any]:
        return {"prompt_token_ids": token_prompt(self.engine.tokenizer, request, self._budget(request.settings),
                                                 self.pretrained)}

    # -- identity ------------------------------------------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        template = getattr(self.engine.tokenizer, "chat_template", None)
        return {
            "name": self.name, "backend": "vllm", **self.engine.describe(), "pretrained": self.pretrained,
            "revision": self.options.revision, "tokenizer": self.options.tokenizer,
            "quantization": self.options.quantization, "max_model_len": self.engine.max_model_len,
            # shards reduce in another order: the last bits of the logits can differ
            "tensor_parallel_size": self.options.tensor_parallel_size,
            "chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest() if template else None,
        }


@MODELS.register("vllm-vlm")
class VLLMVisionLM(VLLMCausalLM):
    """A vision-language model served by vLLM; takes ``pretrained`` and every :class:`VLLMVisionOptions` field.

    Each request's images go to vLLM's multi-modal input in prompt order. A
    plain prompt gets, at its i-th ``<image>``, the model's own image text
    (vLLM's ``get_placeholder_str``, or ``image_token``); with
    ``--apply-chat-template`` the checkpoint's processor renders the turns
    with image parts (lmms-eval's way), placing its own image tokens. The
    prompt cannot be cut without losing images: one too long for
    ``max_model_len`` is an error naming the request.
    """

    name = "vllm-vlm"
    #: with the default arguments; :meth:`_capabilities` says what an instance with others has
    capabilities = ModelCapabilities(generate=True, images=True, reads_images=True, reports_each_result=True)
    options_type = VLLMVisionOptions
    options: VLLMVisionOptions

    @classmethod
    def _capabilities(cls, options: VLLMVisionOptions) -> ModelCapabilities:
        return ModelCapabilities(generate=True, images=True, reads_images=options.images,
                                 max_images=options.max_images if options.images else None, reports_each_result=True)

    def _checked_images(self, requests: Sequence[GenerationRequest], images: Sequence | None) -> Sequence | None:
        if not self.capabilities.reads_images:
            return None
        if images is None and any(r.images for r in requests):
            raise UserError(f"model '{self.name}' got prompts with images but no image data; give the task "
                            "a media section, or run the model with images=false")
        limit = self.capabilities.max_images
        for request in requests:
            if limit is not None and len(request.images) > limit:
                raise UserError(f"request {request.request_id} has {len(request.images)} images; model "
                                f"'{self.name}' takes at most {limit} (max_images)")
        return images

    def _prompt(self, request: GenerationRequest, images: list[Image.Image] | None) -> dict[str, Any]:
        images = list(images or [])
        wanted = sum(t.count(IMAGE_PLACEHOLDER) for t in _texts(request))
        if self.capabilities.reads_images and wanted != len(images):
            raise UserError(f"request {request.request_id}: the prompt holds {wanted} {IMAGE_PLACEHOLDER} "
                            f"placeholders but {len(images)} images were given")
        tokenizer = self.engine.tokenizer
        if request.messages is None:
            text = with_image_tokens(request.prompt, self._placeholder) if self.capabilities.reads_images else \
                strip_placeholders(request.prompt)
            ids = list(tokenizer(text, add_special_tokens=True).input_ids)
        else:
            chat = [{"role": m.role, "content": content_parts(m.content, self.capabilities.reads_images)}
                    for m in request.messages]
            text = self.processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            ids = list(tokenizer(text, add_special_tokens=False).input_ids)
        if len(ids) + request.settings.max_new_tokens > self.engine.max_model_len:
            raise UserError(f"request {request.request_id}: the prompt has {len(ids)} tokens before its images are "
                            f"expanded and max_new_tokens is {request.settings.max_new_tokens}, more than "
                            f"max_model_len {self.engine.max_model_len}; use fewer shots or a larger max_model_len")
        prompt: dict[str, Any] = {"prompt_token_ids": ids}
        if self.capabilities.reads_images and images:
            prompt["multi_modal_data"] = {"image": images}
        return prompt

    def _placeholder(self, index: int) -> str:
        text = self.options.image_token or self.engine.placeholder(index)
        if not text:
            raise UserError(f"vLLM does not say how '{self.pretrained}' marks an image in a prompt; give it with "
                            "--model-args image_token=... (e.g. <image>), or use --apply-chat-template")
        return text

    @cached_property
    def processor(self):
        """The checkpoint's processor: its chat template places the model's image tokens."""
        from transformers import AutoProcessor

        source = resolve_pretrained(self.pretrained)
        return guarded_load(self.pretrained, lambda: AutoProcessor.from_pretrained(
            source, revision=self.options.revision, trust_remote_code=self.options.trust_remote_code,
            local_files_only=self.options.files_only or is_offline()))

    def fingerprint(self) -> dict[str, Any]:
        template = getattr(self.processor, "chat_template", None)  # renders --apply-chat-template turns
        fp = {**super().fingerprint(), "images": self.capabilities.reads_images,
              "processor_chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest() if template
              else None}
        if self.capabilities.reads_images:
            fp["image_token"] = self.options.image_token or self.engine.placeholder(1)
        return fp


def _texts(request: GenerationRequest) -> list[str]:
    return [request.prompt] if request.messages is None else [m.content for m in request.messages]
