"""From a model's raw output to the prediction that metrics score.

Generation stops at the task's stop strings inside the model; what is left
here is presentation: surrounding whitespace (models emit a space after
``=>``) and, for safety with models that ignore stop strings, anything after
the first line break.
"""

from __future__ import annotations


def parse_generation(raw: str) -> str:
    text = raw.strip()
    return text.splitlines()[0].strip() if text else ""


def parse_ranking(choices: tuple[str, ...], scores: list[float]) -> str:
    """The highest-scoring choice; the earliest wins a tie, so results are stable."""
    best = max(range(len(choices)), key=lambda i: (scores[i], -i))
    return choices[best]
