"""mmcomp-eval: an evaluation harness for compositional generalisation in
multimodal models (CompAct next-utterance prediction and atom classification,
ICSVR caption perturbations, SAVE-style retrieval scoring).

``mmcomp_eval.evaluate(model, tasks, ...)`` runs an evaluation from Python
(see :func:`mmcomp_eval.evaluation.evaluate.evaluate`).
"""

from __future__ import annotations

from typing import Any

from mmcomp_eval.version import __version__

__all__ = ["__version__", "evaluate"]


def __getattr__(name: str) -> Any:
    # Imported on first use: ``import mmcomp_eval`` (every submodule's parent) stays cheap and cycle-free.
    if name == "evaluate":
        from mmcomp_eval.evaluation.evaluate import evaluate

        return evaluate
    raise AttributeError(f"module 'mmcomp_eval' has no attribute {name!r}")
