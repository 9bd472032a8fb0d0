"""Checks and arithmetic every metric repeats."""

from __future__ import annotations

from collections.abc import Sequence


def check_lengths(metric: str, predictions: Sequence, references: Sequence) -> None:
    # A length mismatch is a bug in the caller, never in the user's input,
    # so it is a ValueError with a traceback rather than a UserError.
    if len(predictions) != len(references):
        raise ValueError(
            f"{metric}: {len(predictions)} predictions but {len(references)} references"
        )


def mean(values: Sequence[float]) -> float:
    """The mean, or 0.0 for nothing scored (torchtext's BLEU does the same)."""
    return sum(values) / len(values) if values else 0.0
