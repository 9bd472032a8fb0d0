"""Decoding shared by the local adapters (``hf``, ``idefics``, ``open_flamingo``/``otter``).

Sampling that does not depend on the batch
------------------------------------------
``transformers`` samples with ``torch.multinomial`` from one global random
stream: a row's draws depend on which rows share its batch, on the batch
size, on a resumed run re-asking only some requests and on the number of
processes. Here every request has its own stream instead:

* its seed is :meth:`GenerationRequest.sampling_seed` (the run seed and the
  request's content);
* at generation step ``t`` the request's draw is ``u = uniform(seed, t)``, a
  counter-based number (BLAKE2b of seed and step): no generator state, the
  same on CPU and GPU and in any process;
* :class:`RowSeededSampler`, a logits processor, applies HF's own
  temperature, top-k and top-p warpers (HF's order), then picks the token
  where the cumulative probability (vocabulary order, float64) first exceeds
  ``u`` -- inverse-CDF sampling, an exact draw from the warped distribution --
  and hands ``generate`` a distribution with all its mass on that token, so
  ``generate`` runs in its greedy mode and takes it.

One uniform per row and step (instead of a vocabulary-sized noise vector as
in the Gumbel-max trick) keeps the cost to a softmax and a cumulative sum
(see ``bench/bench_generate.py --sample``). A row's answer then depends only
on its own logits, exactly like greedy decoding.

Checkpoint defaults
-------------------
``generate`` fills every setting it is not given from the checkpoint's
``generation_config.json`` (Llama-2-chat's turns sampling on with
temperature 0.6, top_p 0.9; others set repetition penalties or beams). The
adapters replace that config with one holding only the special-token ids
(:func:`ignore_checkpoint_defaults`), so decoding is exactly what the task
and ``--gen-kwargs`` say, and say what they dropped.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError

log = logging.getLogger(__name__)

#: what ``ignore_checkpoint_defaults`` keeps of a checkpoint's generation config
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
#: checkpoint settings that cannot change an answer (``max_length``: ``max_new_tokens`` always wins):
#: dropped without a warning
NO_EFFECT_FIELDS = frozenset({"transformers_version", "use_cache", "cache_implementation", "max_length",
                              "output_attentions", "output_hidden_states", "output_scores", "output_logits",
                              "return_dict_in_generate"})
_TWO_53 = float(1 << 53)


def refuse_unsupported(model: str, requests: Sequence[GenerationRequest],
                       unsupported: Callable[[GenerationSettings], str | None]) -> None:
    """One line before anything is sent when a backend cannot decode as a task asks (it would silently differ)."""
    for settings in {r.settings for r in requests}:
        problem = unsupported(settings)
        if problem:
            raise UserError(f"model '{model}' cannot decode with {problem}; use --model hf for it")


def uniform(seed: int, step: int) -> float:
    """A number in [0, 1) that depends only on ``seed`` and ``step`` (53 random bits)."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / _TWO_53


def ignore_checkpoint_defaults(model) -> None:
    """Replace ``model.generation_config`` by one that only knows the special tokens."""
    from transformers import GenerationConfig

    old = getattr(model, "generation_config", None)
    if old is None:
        return
    ids = {k: getattr(old, k, None) for k in TOKEN_ID_FIELDS if getattr(old, k, None) is not None}
    neutral = GenerationConfig(**ids)
    baseline = GenerationConfig(**ids).to_diff_dict()
    dropped = {k: v for k, v in old.to_diff_dict().items()
               if k not in baseline and k not in TOKEN_ID_FIELDS and k not in NO_EFFECT_FIELDS and not k.startswith("_")}
    if dropped:
        log.warning("the checkpoint's generation_config sets %s: ignored; decoding follows the task's "
                    "generation settings and --gen-kwargs", ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())))
    model.generation_config = neutral


def generate_kwargs(settings: GenerationSettings, seeds: Sequence[int], prompt_width: int, tokenizer,
                    pad_id: int | None, eos_ids: set[int]) -> dict[str, Any]:
    """Keyword arguments for ``generate`` on one left-padded batch.

    ``seeds`` are the rows' sampling seeds (used only when sampling);
    ``prompt_width`` is the padded prompt length, so that the step index of
    the draws and the stop-string window count new tokens only.
    """
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens, do_sample=False, num_beams=settings.num_beams,
        length_penalty=settings.length_penalty, repetition_penalty=settings.repetition_penalty,
        no_repeat_ngram_size=settings.no_repeat_ngram_size,
        pad_token_id=pad_id, eos_token_id=sorted(eos_ids) or None,
    )
    processors = LogitsProcessorList()
    if settings.do_sample:
        processors.append(_row_seeded_sampler()(settings, seeds, prompt_width))
    stopping = StoppingCriteriaList()
    if settings.stop:
        stopping.append(_stop_on_strings()(tokenizer, settings.stop, prompt_width))
    return {"generation_config": config, "logits_processor": processors, "stopping_criteria": stopping}


def decode_new(tokenizer, new_tokens, eos_ids: set[int], stops: Sequence[str]) -> list[str]:
    """Each row's new tokens as text: cut at the first end-of-sequence token and the first stop string."""
    texts = []
    for row in new_tokens.tolist():
        cut = next((k for k, t in enumerate(row) if t in eos_ids), len(row))
        texts.append(clean(tokenizer.decode(row[:cut], skip_special_tokens=True), stops))
    return texts


def clean(text: str, stops: Sequence[str]) -> str:
    """Cut at the first stop string, then drop the whitespace models put after ``=>``."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:cut].lstrip()


@functools.cache
def _row_seeded_sampler():
    """The LogitsProcessor class, built on first use to keep imports lazy."""
    import torch
    from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    class RowSeededSampler(LogitsProcessor):
        """Sample each row from its own counter-based stream (see the module docstring)."""

        def __init__(self, settings: GenerationSettings, seeds: Sequence[int], prompt_width: int):
            self.seeds = list(seeds)
            self.prompt_width = prompt_width
            self.warpers = []  # HF's order: temperature, top-k, top-p
            if settings.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(settings.temperature))
            if settings.top_k:
                self.warpers.append(TopKLogitsWarper(settings.top_k))
            if settings.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(settings.top_p))

        def __call__(self, input_ids, scores):
            if input_ids.shape[0] != len(self.seeds):
                raise RuntimeError(f"{input_ids.shape[0]} rows but {len(self.seeds)} sampling seeds")
            for warp in self.warpers:
                scores = warp(input_ids, scores)
            step = input_ids.shape[1] - self.prompt_width
            cdf = scores.to(torch.float64).softmax(dim=-1).cumsum(dim=-1)
            draws = torch.tensor([uniform(s, step) for s in self.seeds], dtype=torch.float64, device=cdf.device)
            # the first token whose cumulative mass exceeds u * total (tokens of zero mass are never picked)
            picked = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True).clamp_(max=cdf.shape[1] - 1)
            out = torch.full_like(scores, -float("inf"))
            return out.scatter_(1, picked, 0.0)

    return RowSeededSampler


@functools.cache
def _stop_on_strings():
    """The StoppingCriteria class, built on first use to keep imports lazy."""
    import torch
    from transformers import StoppingCriteria

    class StopOnStrings(StoppingCriteria):
        """A row is finished once its newest token completes a stop string.

        Only the last few new tokens are decoded each step: a stop string
        that completes now ends in the newest token and spans at most as many
        tokens as it has characters (plus slack for byte-level pieces). No
        state is kept between steps: ``generate`` remembers finished rows
        itself, and beam search reorders and regroups rows every step.
        """

        def __init__(self, tokenizer, stops: Sequence[str], prompt_len: int):
            self.tokenizer = tokenizer
            self.stops = [s for s in stops if s]
            self.prompt_len = prompt_len
            self.window = max((len(s) for s in self.stops), default=1) + 4

        def __call__(self, input_ids, scores, **kwargs):
            new = input_ids[:, self.prompt_len :]
            start = max(0, new.shape[1] - self.window)
            tails = self.tokenizer.batch_decode(new[:, start:], skip_special_tokens=True)
            return torch.tensor([any(s in tail for s in self.stops) for tail in tails], dtype=torch.bool,
                                device=input_ids.device)

    return StopOnStrings
