"""Batch sizes for local models: a fixed number, or ``auto``.

``auto`` finds the largest batch that fits by trying and backing off on
out-of-memory, like lm-evaluation-harness's ``auto``, but keeps probing as
the run goes: what it learns is a token budget (rows x padded width that
fitted), so when prompts grow the next batch shrinks to stay inside it and,
if it still does not fit, backs off again; when prompts shrink the batch
grows back up to ``max_batch_size``. Requests arrive longest first, so the
first probe is the hardest one.

A batch that ran out of memory is simply run again smaller: answers do not
depend on how requests are batched (left padding with an attention mask;
sampling draws from each request's own seeded stream, ``models/decoding.py``),
so the back-off never changes a result.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mmcomp_eval.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 64


def parse_batch_size(value: Any) -> int | str:
    """``8``, ``"8"`` or ``"auto"``; anything else is a one-line error."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1 or str(n) != str(value).strip():
        raise UserError(f"batch size {value!r}: expected a positive integer or 'auto'")
    return n


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA/MPS/CPU allocator failures, whatever class the backend raises."""
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in text or "can't allocate memory" in text or isinstance(exc, MemoryError))


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


class BatchSizer:
    """How many rows of a given padded width to run at once."""

    def __init__(self, batch_size: int | str, max_batch_size: int = DEFAULT_MAX_BATCH):
        self.auto = batch_size == "auto"
        self.fixed = 0 if self.auto else int(batch_size)
        self.max_batch = max(1, max_batch_size)
        self.budget: int | None = None  # rows x width to aim for; None until the first OOM
        self.history: list[tuple[int, int]] = []  # (rows, width) of every successful auto batch

    def size_for(self, width: int) -> int:
        if not self.auto:
            return self.fixed
        if self.budget is None:
            return self.max_batch
        return max(1, min(self.max_batch, self.budget // max(width, 1)))

    def succeeded(self, rows: int, width: int) -> None:
        # Until the first OOM every batch is tried at max_batch_size; after
        # one, a batch that fitted beyond the budget raises it.
        if self.auto:
            self.history.append((rows, width))
            if self.budget is not None and rows * width > self.budget:
                self.budget = rows * width

    def out_of_memory(self, rows: int, width: int, reason: str) -> None:
        """Shrink after an OOM at ``rows`` x ``width``, or give up at one row."""
        if not self.auto or rows <= 1:
            hint = "lower batch_size or use batch_size=auto" if not self.auto else "shorten the prompts"
            raise UserError(f"out of memory with {rows} row(s) of {width} tokens; {hint} ({reason})")
        smaller = max(1, rows // 2)
        self.budget = smaller * width
        log.info("batch of %d x %d tokens ran out of memory; trying %d", rows, width, smaller)
        _free_memory()


def run_batches(
    order: Sequence[int],
    width: Callable[[list[int]], int],
    sizer: BatchSizer,
    run: Callable[[list[int]], Any],
) -> Iterator[tuple[list[int], Any]]:
    """Run ``order`` (longest first) in consecutive batches; yield (batch, output).

    ``width`` gives a batch's padded token width (prompt plus new tokens);
    a batch that runs out of memory is retried with fewer rows.
    """
    start = 0
    while start < len(order):
        first = list(order[start : start + 1])
        rows = sizer.size_for(width(first))
        batch = list(order[start : start + rows])
        w = width(batch)
        failure = None
        try:
            out = run(batch)
        except Exception as exc:  # noqa: BLE001 - only OOM is handled, the rest re-raised
            if not is_out_of_memory(exc):
                raise
            failure = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        if failure is not None:
            # outside the except block: the traceback no longer pins the batch's tensors
            sizer.out_of_memory(len(batch), w, failure)
            continue
        sizer.succeeded(len(batch), w)
        yield batch, out
        start += len(batch)
