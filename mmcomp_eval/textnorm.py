"""The one text normalisation that exact match and category accuracy share, and how an answer is read.

Category accuracy promises never to score below exact match on a sample (a
prediction equal to its reference always names the reference's classes), so
both must agree on what "equal" means. They live here, outside
``mmcomp_eval.metrics``, so that the data layer (the category map) can use
them without importing the metrics package. This module imports only the
standard library: the lm-eval export inlines it into the ``utils.py`` it
writes (see :mod:`mmcomp_eval.export`).
"""

from __future__ import annotations

import re

#: punctuation a model may put around or inside a narration that never changes
#: which verb or noun it names ("Take the knife.", "knife, then plate")
_SENTENCE_PUNCTUATION = re.compile(r"[.,;:!?\"()\[\]{}]")


def normalise(text: str) -> str:
    """Exact-match form: lower-case, ``_`` as space, one space between words, no trailing periods.

    CompAct writes multiword atoms as ``pick_up`` while generative models
    write "pick up", and LLMs often end with a period and a capital letter
    that the references never have. Anything else (other punctuation,
    articles, word order) still counts as a difference.
    """
    text = " ".join(text.replace("_", " ").lower().split())
    return text.rstrip(".").rstrip()


def category_key(text: str) -> str:
    """The lookup form of a prediction for the category map.

    A function of :func:`normalise` (so texts that exact match calls equal
    always get the same key), further dropping hyphens, which EK-100 uses in
    verb spellings (``pick-up``), and sentence punctuation.
    """
    text = _SENTENCE_PUNCTUATION.sub(" ", normalise(text).replace("-", " "))
    return " ".join(text.split())


def answer_text(generated: str) -> str:
    """The answer in a generated continuation: its first line, without surrounding whitespace.

    Generation stops at the task's stop strings inside the model; what is
    left is presentation: models emit a space after ``=>``, and a model
    that ignores stop strings may go on past the first line break.
    """
    text = str(generated).strip()
    return text.splitlines()[0].strip() if text else ""
