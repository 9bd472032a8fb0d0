"""The lm-evaluation-harness side of an export: documents, answers and metrics for ``!function`` hooks.

``mmcomp-eval export lm-eval`` inlines this module, after
:mod:`mmcomp_eval.textnorm` and :mod:`mmcomp_eval.data.category_rules`, into
the ``utils.py`` of the folder it writes; the task files there name these
functions (``custom_dataset: !function utils.load_documents``, ...). It runs
inside lm-eval where mmcomp-eval need not be installed, so it reads only
the files the export wrote next to it: ``mmcomp_export.json`` (each task's
metrics with their options), ``<task>.jsonl`` (documents with their rendered
prompts) and ``category_map.json`` (category accuracy's tables). It needs
``datasets`` and ``sacrebleu``, both dependencies of lm-eval itself; spaCy
with ``en_core_web_sm`` is optional, as in mmcomp-eval (category accuracy's
lemma tier; without it the texts that need that tier count as unmapped).
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path

from mmcomp_eval.data.category_rules import TARGET_FIELDS, CategoryRules, SpacyLemmas
from mmcomp_eval.textnorm import answer_text, normalise

EXPORT_DIR = Path(__file__).resolve().parent
MANIFEST_FILE = "mmcomp_export.json"
CATEGORY_MAP_FILE = "category_map.json"

hook_log = logging.getLogger("mmcomp_export")


def load_documents(documents: str, **_metadata) -> dict:
    """``custom_dataset``: the documents of one task, prompts rendered, as its test split.

    lm-eval passes its metadata (the model arguments among them) too; they
    change nothing here.
    """
    import datasets

    path = EXPORT_DIR / documents
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}


def process_results(doc: dict, results: list) -> dict:
    """Per document: exact match and category accuracy (0 or 100), and BLEU's pair for :func:`corpus_bleu`.

    The answer is read as mmcomp-eval reads it: the first line of the
    continuation, stripped.
    """
    prediction = answer_text(results[0])
    out: dict = {}
    for metric in exported_task(doc["task"])["metrics"]:
        name, options = metric["name"], metric["options"]
        if name == "bleu":
            out[name] = (prediction, doc["target"], doc["task"])
        elif name == "exact_match":
            out[name] = 100.0 if normalise(prediction) == normalise(doc["target"]) else 0.0
        elif name == "category_accuracy":
            targets = tuple(int(doc[f]) for f in TARGET_FIELDS[options["atom"]])
            verdict = category_rules().judge(options["atom"], prediction, doc["target"], targets)
            out[name] = 100.0 if verdict.right else 0.0
            if category_rules().lemmas.error:
                _warn_once(category_rules().lemmas.error)
    return out


def corpus_bleu(items: list) -> float:
    """BLEU over the task's documents, counts pooled before dividing, as mmcomp-eval's ``bleu`` (0-100)."""
    from sacrebleu.metrics import BLEU

    options = next(m["options"] for m in exported_task(items[0][2])["metrics"] if m["name"] == "bleu")
    bleu = BLEU(max_ngram_order=options["max_n"], tokenize=options["tokenize"], lowercase=options["lowercase"],
                smooth_method="none", effective_order=False, force=True)
    return bleu.corpus_score([str(p) for p, _, _ in items], [[str(r) for _, r, _ in items]]).score


@lru_cache(maxsize=None)
def manifest() -> dict:
    return json.loads((EXPORT_DIR / MANIFEST_FILE).read_text(encoding="utf-8"))


def exported_task(name: str) -> dict:
    return manifest()["tasks"][name]


@lru_cache(maxsize=None)
def category_rules() -> CategoryRules:
    data = json.loads((EXPORT_DIR / CATEGORY_MAP_FILE).read_text(encoding="utf-8"))
    return CategoryRules.from_json(data, lemmas=SpacyLemmas(tuple(data["lemmatizers"])))


@lru_cache(maxsize=None)
def _warn_once(reason: str) -> None:
    hook_log.warning("category accuracy: no lemma tier (%s); predictions that need it count as unmapped, "
                     "as in mmcomp-eval without spaCy", reason)
