"""The compositional gap: a task's in-domain score minus its compositional score.

CompAct's point (Yagcioglu et al. 2024, Sec. 6.3: Table 3 against Table 1,
Tables 4-5 against Table 2) is that models score higher on a random split of
the same instances than on the compositional (MCD) split. A run that holds a
compositional task and its random-split twin reports that difference per
metric, so nobody has to subtract two rounded means by hand, and with an
interval, because two test sets of a few thousand documents differ by chance.

Twins are declared, not guessed from names: the in-domain task names its
compositional task in ``in_domain_of`` (``tasks/compact_nup_random.yaml``:
``in_domain_of: compact_nup``). The sign is fixed: gap = in-domain minus
compositional, so a positive gap is what the paper reports (worse on novel
compositions). The two test sets hold different documents, so the interval
is an unpaired bootstrap (:func:`mmcomp_eval.evaluation.bootstrap.unpaired`): each
side's documents resampled on their own, each side's value the mean over the
run's seeds on the resampled documents (the same indices for every seed of
that side). The interval is therefore about document sampling for these
seeds; seed-to-seed spread is in ``per_seed`` and in each task's ``std``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from mmcomp_eval.evaluation import bootstrap
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.config.task_config import TaskConfig

DEFINITION = "in_domain - compositional"
LEVEL = 0.95


@dataclass(frozen=True)
class TwinPair:
    compositional: str
    in_domain: str


@dataclass(frozen=True)
class TaskScores:
    """What the gap needs from one finished task."""

    n_documents: int
    #: metric -> the task's value for each seed, in seed order
    per_seed: dict[str, list[float]]
    #: metric -> the task's value on resampled document indices (``bootstrap.task_statistics``)
    statistics: dict[str, bootstrap.Statistic]


def twin_pairs(tasks: Sequence[TaskConfig], shots: dict[str, int], known: Sequence[str]) -> list[TwinPair]:
    """The (compositional, in-domain) pairs among ``tasks``, checked before any inference.

    ``shots`` holds each task's effective number of shots: a gap between a
    0-shot and a 5-shot task would measure the shots, not compositionality.
    """
    names = {t.task: t for t in tasks}
    pairs = []
    for t in tasks:
        if t.in_domain_of is None:
            continue
        if t.in_domain_of not in known:
            raise UserError(f"{t.source} (task {t.task}): in_domain_of '{t.in_domain_of}' is not a known task"
                            f"{did_you_mean(t.in_domain_of, known)}; name the compositional task this one is the "
                            "random-split twin of")
        comp = names.get(t.in_domain_of)
        if comp is None:
            continue  # its twin is not part of this run: no gap to report
        shared = [m.name for m in comp.metrics if m.name in {n.name for n in t.metrics}]
        if not shared:
            raise UserError(f"{t.source} (task {t.task}): in_domain_of '{comp.task}', but the two tasks share no "
                            "metric; give them the same metrics (include: the compositional task's file)")
        if shots[t.task] != shots[comp.task]:
            raise UserError(f"tasks {comp.task} and {t.task} are twins (in_domain_of) but run with "
                            f"{shots[comp.task]} and {shots[t.task]} shots; give them the same fewshot.k or pass --shots")
        pairs.append(TwinPair(comp.task, t.task))
    return pairs


@dataclass
class GapTracker:
    """Collects finished tasks and yields each pair's gap record once both twins are done."""

    pairs: list[TwinPair]
    resamples: int = bootstrap.N_RESAMPLES
    seed: int = bootstrap.SEED
    _done: dict[str, TaskScores] = field(default_factory=dict, init=False)

    def add(self, task: str, scores: TaskScores) -> list[dict]:
        if not any(task in (p.compositional, p.in_domain) for p in self.pairs):
            return []
        self._done[task] = scores
        return [gap_record(p, self._done[p.compositional], self._done[p.in_domain], self.resamples, self.seed)
                for p in self.pairs if task in (p.compositional, p.in_domain)
                and p.compositional in self._done and p.in_domain in self._done]


def gap_record(pair: TwinPair, comp: TaskScores, dom: TaskScores, resamples: int = bootstrap.N_RESAMPLES,
               seed: int = bootstrap.SEED) -> dict:
    """The ``gaps`` entry of results.json for one pair (docs/results.md)."""
    metrics = {}
    for name, comp_values in comp.per_seed.items():
        dom_values = dom.per_seed.get(name)
        if dom_values is None:
            continue
        per_seed = [d - c for d, c in zip(dom_values, comp_values)]
        c, d = statistics.fmean(comp_values), statistics.fmean(dom_values)
        entry = {"compositional": c, "in_domain": d, "gap": d - c, "per_seed": per_seed,
                 "ci_low": None, "ci_high": None, "p_value": None}
        if name in comp.statistics and name in dom.statistics:
            res = bootstrap.unpaired(dom.statistics[name], dom.n_documents, comp.statistics[name],
                                     comp.n_documents, resamples, seed, LEVEL)
            entry.update(ci_low=res["ci_low"], ci_high=res["ci_high"], p_value=res["p_value"])
        metrics[name] = {k: _round(v) for k, v in entry.items()}
    return {
        "compositional_task": pair.compositional,
        "in_domain_task": pair.in_domain,
        "definition": DEFINITION,
        "n_documents": {"compositional": comp.n_documents, "in_domain": dom.n_documents},
        "bootstrap": {"method": "unpaired percentile", "resamples": resamples, "seed": seed, "level": LEVEL},
        "metrics": metrics,
    }


def _round(v):
    if isinstance(v, list):
        return [round(x, 4) for x in v]
    return None if v is None else round(v, 4)
