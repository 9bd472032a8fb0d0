"""Bootstrap over documents: standard errors in results.json, paired tests in ``compare``, gaps between test sets.

Every statistic here is "the task's reported value on a resample of its
documents" (for a retrieval task: of its queries, with the gallery fixed): the mean over seeds of the metric's corpus value, the same
document indices used for every seed (and, in a paired comparison, for both
runs). For metrics whose corpus value is the mean of per-sample scores that
is a mean of resampled scores; for corpus statistics such as BLEU the metric
is recomputed on each resample (from summed sufficient statistics when the
metric provides them, else by calling ``compute``), which is what makes the
BLEU interval honest: per-pair BLEU scores do not average to corpus BLEU.

Two runs on the same documents are compared paired (:func:`paired`); two
tasks on different documents (a compositional test set and its random-split
twin) unpaired (:func:`unpaired`): each side's documents are resampled from a
stream of its own.

Resamples come from ``numpy.random.default_rng(seed)`` in fixed-size
chunks, so the numbers are reproducible for a given seed and resample count.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from mmcomp_eval.api.document import Document

N_RESAMPLES = 1000
SEED = 0
Statistic = Callable[[np.ndarray], np.ndarray]  # (B, n) resampled indices -> (B,) values


def resamples(n: int, b: int, seed: int | np.random.SeedSequence):
    """``b`` rows of ``n`` indices drawn with replacement, in chunks that depend on ``n`` only."""
    rng = np.random.default_rng(seed)
    chunk = max(1, min(b, 2_000_000 // max(n, 1)))
    done = 0
    while done < b:
        rows = min(chunk, b - done)
        yield rng.integers(0, n, size=(rows, n))
        done += rows


def bootstrap(stat: Statistic, n: int, b: int = N_RESAMPLES, seed: int | np.random.SeedSequence = SEED) -> np.ndarray:
    return np.concatenate([stat(idx) for idx in resamples(n, b, seed)]) if n else np.zeros(0)


def statistic(metric_name: str, options: dict, per_sample: Sequence[Sequence[float]], values: Sequence[float],
              predictions: Sequence[Sequence[str]], references: Sequence[str], docs: Sequence[Document],
              resources=None) -> Statistic:
    """The task's value (mean over seeds) as a function of resampled document indices.

    ``per_sample``/``values``/``predictions`` have one entry per seed.
    """
    from mmcomp_eval.errors import UserError
    from mmcomp_eval.metrics import METRICS, build_metric
    from mmcomp_eval.metrics.registry import NO_RESOURCES

    try:
        cls = METRICS.get(metric_name)
    except UserError:  # a plugin metric not installed here: the numbers alone must tell
        cls = None
    scores = np.asarray(per_sample, dtype=float).reshape(len(per_sample), -1)
    if _decomposable(cls, scores, values):
        if _aggregation(cls) == "median":  # a median of per-seed means is not the mean of medians: per seed
            return lambda idx: np.mean([_scored_summary(s[idx], median=True) for s in scores], axis=0)
        by_doc = scores.mean(axis=0)
        return lambda idx: _scored_summary(by_doc[idx], median=False)
    metric = build_metric(metric_name, options, resources or NO_RESOURCES)
    stats = [metric.corpus_stats(p, references, docs) for p in predictions]
    if all(s is not None for s in stats):
        arrays = [np.asarray(s, dtype=float) for s in stats]

        def from_sums(idx: np.ndarray) -> np.ndarray:
            out = np.zeros(len(idx))
            for a in arrays:
                sums = a[idx].sum(axis=1)  # (B, k)
                out += np.array([metric.from_stats(row) for row in sums.tolist()])
            return out / len(arrays)

        return from_sums
    refs, docs = list(references), list(docs)

    def recompute(idx: np.ndarray) -> np.ndarray:
        out = []
        for row in idx.tolist():
            seeds = [metric.compute([p[i] for i in row], [refs[i] for i in row], [docs[i] for i in row]).value
                     for p in predictions]
            out.append(sum(seeds) / len(seeds))
        return np.array(out)

    return recompute


def _scored_summary(values: np.ndarray, median: bool) -> np.ndarray:
    """Row-wise mean (or median) of the scored (non-NaN) entries; NaN for a resample that drew none of them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "mean of empty slice": that resample is left out
        return np.nanmedian(values, axis=1) if median else np.nanmean(values, axis=1)


def _aggregation(cls) -> str:
    return getattr(cls, "aggregation", "mean")


def _decomposable(cls, scores: np.ndarray, values: Sequence[float]) -> bool:
    """The class says so and the numbers agree (a plugin may forget the flag).

    NaN marks a document the metric does not score (a retrieval metric of
    one direction); the value is the mean (or median) of the others, and a
    resample of the documents is summarised over the scored ones it holds.
    """
    if not getattr(cls, "decomposable", True) or scores.shape[1] == 0 or np.isnan(scores).all(axis=1).any():
        return False
    summary = np.nanmedian(scores, axis=1) if _aggregation(cls) == "median" else np.nanmean(scores, axis=1)
    # per-sample scores in samples.jsonl are rounded to 4 decimals
    return all(math.isclose(m, v, abs_tol=1e-3) for m, v in zip(summary.tolist(), values))


def task_statistics(config, docs: Sequence[Document], seed_runs: Sequence[tuple[list[str], dict]],
                    resources=None) -> dict[str, Statistic]:
    """``{metric: statistic}`` for one task; ``seed_runs`` is (predictions, {metric: MetricResult}) per seed.

    Metrics without a per-document score, and tasks of fewer than 2
    documents, have nothing to resample and are left out.
    """
    from mmcomp_eval.metrics import METRICS

    refs = [str(d[config.target_field]) for d in docs]
    out: dict[str, Statistic] = {}
    for mc in config.metrics:
        name = METRICS.get(mc.name).name
        results = [r[name] for _, r in seed_runs if name in r]
        if len(results) != len(seed_runs) or len(docs) < 2 or any(len(r.per_sample) != len(docs) for r in results):
            continue
        out[name] = statistic(mc.name, mc.options, [r.per_sample for r in results], [r.value for r in results],
                              [p for p, _ in seed_runs], refs, docs, resources)
    return out


def task_stderr(statistics: dict[str, Statistic], n: int) -> dict[str, dict]:
    """``{metric: {"stderr": se}}``: the sample std (ddof=1) of the bootstrap values, as lm-eval's ``bootstrap_stderr``."""
    return {name: {"stderr": round(float(np.nanstd(bootstrap(stat, n), ddof=1)), 4)} for name, stat in statistics.items()}


def paired(stat_a: Statistic, stat_b: Statistic, n: int, b: int, seed: int, level: float = 0.95) -> dict:
    """Paired bootstrap of ``a - b`` on the same resampled documents."""
    return paired_many({"": (stat_a, stat_b)}, n, b, seed, level)[""]


def paired_many(pairs: dict[str, tuple[Statistic, Statistic]], n: int, b: int, seed: int,
                level: float = 0.95) -> dict[str, dict]:
    """:func:`paired` for several metrics of one task at once.

    Every metric sees the same resamples as it would alone (same seed, same
    chunks), so the numbers are those of separate calls; drawing them once
    instead of once per metric is what makes comparing retrieval runs (12
    metrics per task, thousands of queries) affordable.
    """
    everything = np.arange(n)[None, :]
    observed = {k: float(a(everything)[0] - b_(everything)[0]) for k, (a, b_) in pairs.items()}
    deltas: dict[str, list[np.ndarray]] = {k: [] for k in pairs}
    for idx in resamples(n, b, seed):
        for k, (a, b_) in pairs.items():
            deltas[k].append(a(idx) - b_(idx))
    return {k: {"delta": observed[k], **_interval(np.concatenate(deltas[k]), observed[k], level)} for k in pairs}


def unpaired(stat_a: Statistic, n_a: int, stat_b: Statistic, n_b: int, b: int = N_RESAMPLES, seed: int = SEED,
             level: float = 0.95) -> dict:
    """Bootstrap of ``a - b`` measured on different documents: each side resampled on its own.

    The two sides draw from independent streams (``SeedSequence(seed).spawn(2)``,
    the first for ``a``): one shared stream would resample document ``i`` of
    both sets together, a pairing that means nothing across test sets.
    """
    stream_a, stream_b = np.random.SeedSequence(seed).spawn(2)
    observed = float(stat_a(np.arange(n_a)[None, :])[0] - stat_b(np.arange(n_b)[None, :])[0])
    deltas = bootstrap(stat_a, n_a, b, stream_a) - bootstrap(stat_b, n_b, b, stream_b)
    return {"delta": observed, **_interval(deltas, observed, level)}


def _interval(deltas: np.ndarray, observed: float, level: float) -> dict:
    """Percentile interval and two-sided p-value for "no difference".

    The resampled differences, centred on the observed one, stand in for the
    null distribution (Efron & Tibshirani 16.4; Berg-Kirkpatrick et al. 2012),
    with the usual +1 so the p-value is never exactly 0.
    """
    deltas = deltas[~np.isnan(deltas)]  # resamples that drew no document a metric scores
    lo, hi = np.quantile(deltas, [(1 - level) / 2, (1 + level) / 2])
    extreme = int(np.sum(np.abs(deltas - observed) >= abs(observed) - 1e-12))
    return {"ci_low": float(lo), "ci_high": float(hi), "p_value": (extreme + 1) / (len(deltas) + 1),
            "resamples": len(deltas)}
