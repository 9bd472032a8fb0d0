"""``batch_size=auto``: back-off on out-of-memory, re-probing, and answers independent of batch size."""

from __future__ import annotations

import pytest
import torch

from mmcomp_eval.api.request import GenerationRequest, GenerationSettings, LoglikelihoodRequest
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import create_model
from mmcomp_eval.models.batching import BatchSizer, parse_batch_size, run_batches
from mmcomp_eval.models.hf import HFCausalLM

WORDS = "take plate put down open drawer wash hands dry fridge milk close cut onion knife board pan spoon".split()
# 16 prompts of 1 to 40 words: batches mix very different lengths, so padding is exercised
PROMPTS = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + (i * 13) % 40)) + " =>" for i in range(16)]


def _oom(rows: int, width: int, limit: int):
    if rows * width > limit:
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory: {rows} x {width}")


def test_parse_batch_size():
    assert parse_batch_size("auto") == "auto" and parse_batch_size("16") == 16 and parse_batch_size(4) == 4
    for bad in ("0", "-2", "auto:x", "1.5", True):
        with pytest.raises(UserError):
            parse_batch_size(bad)


def test_auto_backs_off_and_reprobes_when_prompts_grow():
    """Three calls (say three tasks): prompts of 10 tokens, then 40 (grown), then 5 (shrunk)."""
    sizer = BatchSizer("auto", max_batch_size=64)

    def call(width: int, n: int) -> list[int]:
        def run(batch):
            _oom(len(batch), width, limit=200)
            return batch

        return [i for batch, _ in run_batches(list(range(n)), lambda b: width, sizer, run) for i in batch]

    for width, n in ((10, 40), (40, 20), (5, 60)):
        assert call(width, n) == list(range(n))  # every row exactly once, in order
    seen = sizer.history
    assert all(rows * w <= 200 for rows, w in seen)
    assert seen[0] == (20, 10)  # all 40 rows at once ran out of memory; half of them fit
    assert {rows for rows, w in seen if w == 40} == {5}  # re-probed smaller when prompts grew
    assert max(rows for rows, w in seen if w == 5) == 40  # and larger again when they shrank


def test_fixed_batch_out_of_memory_is_one_line():
    sizer = BatchSizer(8)
    with pytest.raises(UserError, match="out of memory with 8 row"):
        list(run_batches(list(range(10)), lambda b: 100, sizer, lambda b: _oom(len(b), 100, 10)))


def _memory_limited(method, rows: int):
    """``method`` behind a simulated memory limit of ``rows`` rows per batch."""
    def limited(batch, *args):
        _oom(len(batch), 1, limit=rows)
        return method(batch, *args)

    return limited


def test_greedy_answers_do_not_depend_on_batch_size(tiny_llama_dir):
    settings = GenerationSettings(max_new_tokens=5, stop=("\n",))
    reqs = [GenerationRequest(f"r{i}", p, settings) for i, p in enumerate(PROMPTS)]
    ll_reqs = [LoglikelihoodRequest(f"r{i}", p, (" take", " put down")) for i, p in enumerate(PROMPTS)]
    model = create_model("hf", {"pretrained": str(tiny_llama_dir), "batch_size": "auto", "max_batch_size": 16})
    assert isinstance(model, HFCausalLM) and model.batch_size == "auto"
    answers, scores = {}, {}
    for bs in (1, 4, 16, "auto", "limited"):
        model._sizer = BatchSizer("auto" if bs == "limited" else bs, max_batch_size=16)
        if bs == "limited":  # the real model, but only 5 rows fit: auto must back off
            model._generate_batch = _memory_limited(model._generate_batch, 5)
            model._score_batch = _memory_limited(model._score_batch, 5)
        answers[bs] = model.generate(reqs)
        scores[bs] = model.loglikelihood(ll_reqs)
    assert max(rows for rows, _ in model._sizer.history) == 5
    assert any(a for a in answers[1])  # the tiny model says something
    for bs in (4, 16, "auto", "limited"):
        assert answers[bs] == answers[1], bs
        for row, ref in zip(scores[bs], scores[1]):
            assert row == pytest.approx(ref, abs=1e-4), bs
