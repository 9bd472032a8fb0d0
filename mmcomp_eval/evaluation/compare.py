"""Comparing runs: side-by-side tables, paired bootstrap tests, plots.

A difference between two runs means something only if they answered the
same questions, so runs are compared task by task only after checking that
their documents (``documents_sha256``) and, for the seeds both have, their
prompts (``prompts_sha256``) are identical; otherwise the comparison is
refused with the task, the runs and the first concrete difference named
(documents only one run has, or the first document whose prompt differs).

Significance is a paired bootstrap over documents (see
:mod:`mmcomp_eval.evaluation.bootstrap`): both runs are rescored on the same
resampled documents, corpus metrics such as BLEU recomputed on each, and the
difference's percentile interval and two-sided p-value reported.

The compositional gap of each run (in-domain minus compositional score, see
:mod:`mmcomp_eval.evaluation.gap`) is read from its results.json and shown per model.

Retrieval tasks are compared like any other, paired over their queries (the
gallery fixed); their perturbation drops and SAVE's mR1 across datasets come
from :mod:`mmcomp_eval.retrieval.report`.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from mmcomp_eval.runtime import atomic_files

from mmcomp_eval.evaluation import bootstrap

from mmcomp_eval.evaluation import run_files
from mmcomp_eval.api.document import Document
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.report import format_interval

FORMATS = ("md", "latex", "csv")


@dataclass
class Run:
    label: str
    folder: Path
    results: dict
    _samples: dict | None = field(default=None, repr=False)
    #: the results file read: results.json, or results.partial.json of an unfinished run
    results_file: Path | None = None

    def __post_init__(self) -> None:
        self.results_file = self.results_file or self.folder / "results.json"

    @property
    def tasks(self) -> dict:
        return self.results.get("tasks", {})

    @property
    def samples_file(self) -> Path:
        return run_files.samples_path(self.results_file)

    def samples(self) -> dict[tuple[str, int], dict[str, dict]]:
        """(task, seed) -> doc id -> samples row, read (and checked against results.json) on first use."""
        if self._samples is None:
            self._samples = run_files.read_samples(self.samples_file, self.results.get("samples_sha256"),
                                                   self.results_file)
        return self._samples


def load_run(path: Path, label: str | None = None) -> Run:
    results = run_files.results_path(path)
    return Run(label or results.parent.name, results.parent, run_files.read_results(results), results_file=results)


def load_runs(paths: list[Path], labels: list[str] | None = None) -> list[Run]:
    if len(paths) < 1:
        raise UserError("compare needs at least one results folder")
    if labels and len(labels) != len(paths):
        raise UserError(f"--labels has {len(labels)} names for {len(paths)} runs")
    runs = [load_run(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    seen: dict[str, int] = {}
    for r in runs:  # two folders called "out": label them out, out#2
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            r.label = f"{r.label}#{seen[r.label]}"
    return runs


# -- comparability -----------------------------------------------------------------


def check_comparable(a: Run, b: Run, task: str, allow_different_prompts: bool = False) -> None:
    """Refuse, with the first concrete difference, when a and b did not answer the same questions."""
    ta, tb = a.tasks[task], b.tasks[task]
    if ta.get("documents_sha256") != tb.get("documents_sha256"):
        raise UserError(f"task {task}: runs '{a.label}' and '{b.label}' were evaluated on different documents "
                        f"({_document_difference(a, b, task)}); compare runs of the same split and --limit")
    if allow_different_prompts:
        return
    pa, pb = ta.get("prompts_sha256") or {}, tb.get("prompts_sha256") or {}
    for seed in sorted(set(pa) & set(pb), key=int):
        if pa[seed] != pb[seed]:
            raise UserError(f"task {task}: runs '{a.label}' and '{b.label}' used different prompts for seed {seed} "
                            f"({_prompt_difference(a, b, task, int(seed))}); compare runs with the same template, "
                            "shots and sampler, or pass --allow-different-prompts")


def _document_difference(a: Run, b: Run, task: str) -> str:
    na, nb = a.tasks[task].get("n_documents"), b.tasks[task].get("n_documents")
    try:
        ids_a = set(next(rows for (t, _), rows in a.samples().items() if t == task))
        ids_b = set(next(rows for (t, _), rows in b.samples().items() if t == task))
    except (UserError, StopIteration):
        return f"{na} vs {nb} documents, documents_sha256 differs"
    only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
    parts = [f"{na} vs {nb} documents"]
    if only_a:
        parts.append(f"only in '{a.label}': {', '.join(only_a[:3])}{' ...' if len(only_a) > 3 else ''}")
    if only_b:
        parts.append(f"only in '{b.label}': {', '.join(only_b[:3])}{' ...' if len(only_b) > 3 else ''}")
    if not only_a and not only_b:
        parts.append("same ids, different document contents")
    return "; ".join(parts)


def _prompt_difference(a: Run, b: Run, task: str, seed: int) -> str:
    try:
        ra, rb = a.samples().get((task, seed), {}), b.samples().get((task, seed), {})
    except UserError:
        return "prompts_sha256 differs"
    for doc_id, row in ra.items():
        other = rb.get(doc_id)
        if other is not None and (row.get("prompt"), row.get("images")) != (other.get("prompt"), other.get("images")):
            la, lb = (row.get("prompt") or "").splitlines(), (other.get("prompt") or "").splitlines()
            line = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
            show = lambda lines: repr(lines[line][:60]) if line < len(lines) else "(nothing)"  # noqa: E731
            return f"first at document {doc_id}, prompt line {line + 1}: {show(la)} vs {show(lb)}"
    return "prompts_sha256 differs"


# -- tables ------------------------------------------------------------------------


def _rows(runs: list[Run]) -> list[tuple[str, str]]:
    """(task, metric) pairs in first-seen order."""
    keys: dict[tuple[str, str], None] = {}
    for r in runs:
        for task, t in r.tasks.items():
            for metric in t.get("metrics", {}):
                keys[(task, metric)] = None
    return list(keys)


def _cell(run: Run, task: str, metric: str) -> dict | None:
    return run.tasks.get(task, {}).get("metrics", {}).get(metric)


def _fmt(m: dict | None) -> str:
    if m is None:
        return "-"
    err = m.get("stderr")
    return f"{m['mean']:.2f} ± {err:.2f}" if err is not None else f"{m['mean']:.2f}"


def side_by_side(runs: list[Run], fmt: str = "md") -> str:
    rows = _rows(runs)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["task", "metric", *itertools.chain.from_iterable((r.label, f"{r.label} stderr") for r in runs)])
        for task, metric in rows:
            cells = [_cell(r, task, metric) for r in runs]
            w.writerow([task, metric, *itertools.chain.from_iterable(
                ("" if c is None else c["mean"], "" if c is None or c.get("stderr") is None else c["stderr"])
                for c in cells)])
        return buf.getvalue()
    if fmt == "latex":
        lines = [r"\begin{tabular}{ll" + "r" * len(runs) + "}", r"\toprule",
                 " & ".join(["Task", "Metric", *(_tex(r.label) for r in runs)]) + r" \\", r"\midrule"]
        for task, metric in rows:
            cells = [_fmt(_cell(r, task, metric)).replace("±", r"$\pm$") for r in runs]
            lines.append(" & ".join([_tex(task), _tex(metric), *cells]) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(lines) + "\n"
    if fmt != "md":
        raise UserError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    lines = ["| task | metric | " + " | ".join(r.label for r in runs) + " |",
             "|---|---|" + "---|" * len(runs)]
    for task, metric in rows:
        lines.append(f"| {task} | {metric} | " + " | ".join(_fmt(_cell(r, task, metric)) for r in runs) + " |")
    return "\n".join(lines) + "\n"


def _tex(s: str) -> str:
    for ch in "\\&%$#_{}":
        s = s.replace(ch, "\\" + ch if ch != "\\" else r"\textbackslash{}")
    return s


# -- compositional gaps ------------------------------------------------------------


def _gap_rows(runs: list[Run]) -> list[tuple[str, str, str]]:
    """(compositional task, in-domain task, metric) in first-seen order."""
    keys: dict[tuple[str, str, str], None] = {}
    for r in runs:
        for g in r.results.get("gaps") or []:
            for metric in g.get("metrics", {}):
                keys[(g["compositional_task"], g["in_domain_task"], metric)] = None
    return list(keys)


def _gap_cell(run: Run, row: tuple[str, str, str]) -> dict | None:
    comp, dom, metric = row
    for g in run.results.get("gaps") or []:
        if (g["compositional_task"], g["in_domain_task"]) == (comp, dom):
            return g["metrics"].get(metric)
    return None


def _gap_fmt(m: dict | None) -> str:
    if m is None:
        return "-"
    return f"{m['gap']:+.2f} {format_interval(m)}" if m.get("ci_low") is not None else f"{m['gap']:+.2f}"


def gap_table(runs: list[Run], fmt: str = "md") -> str:
    """Each run's compositional gaps (in-domain minus compositional) with their intervals; "" when none has any."""
    rows = _gap_rows(runs)
    if not rows:
        return ""
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["compositional", "in_domain", "metric", *itertools.chain.from_iterable(
            (f"{r.label} gap", f"{r.label} ci_low", f"{r.label} ci_high") for r in runs)])
        for row in rows:
            cells = [_gap_cell(r, row) or {} for r in runs]
            w.writerow([*row, *itertools.chain.from_iterable(
                (c.get("gap", ""), "" if c.get("ci_low") is None else c["ci_low"],
                 "" if c.get("ci_high") is None else c["ci_high"]) for c in cells)])
        return buf.getvalue()
    if fmt == "latex":
        lines = [r"\begin{tabular}{lll" + "r" * len(runs) + "}", r"\toprule",
                 " & ".join(["Compositional", "In-domain", "Metric", *(_tex(r.label) for r in runs)]) + r" \\",
                 r"\midrule"]
        for row in rows:
            lines.append(" & ".join([*(_tex(x) for x in row), *(_gap_fmt(_gap_cell(r, row)) for r in runs)]) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(lines) + "\n"
    lines = ["Compositional gap (in-domain minus compositional; positive: worse on novel compositions), "
             "with each run's bootstrap interval:", "",
             "| compositional | in-domain | metric | " + " | ".join(r.label for r in runs) + " |",
             "|---|---|---|" + "---|" * len(runs)]
    for row in rows:
        lines.append("| " + " | ".join(row) + " | " + " | ".join(_gap_fmt(_gap_cell(r, row)) for r in runs) + " |")
    return "\n".join(lines) + "\n"


# -- retrieval ---------------------------------------------------------------------


def retrieval_report(runs: list[Run]) -> str:
    """Perturbation drops per dataset and SumR / mR1 across datasets (Markdown); "" when no run has retrieval tasks."""
    from mmcomp_eval.retrieval import report

    text = report.report([(r.label, r.results) for r in runs])
    return text + "\n" if text else ""


# -- significance ------------------------------------------------------------------


def _task_arrays(run: Run, task: str, metric: str, doc_ids: list[str]):
    """Per seed: per-sample scores, predictions and the corpus value, in ``doc_ids`` order."""
    t = run.tasks[task]
    samples = run.samples()
    per_sample, preds, values, refs = [], [], [], None
    for seed, value in zip(t["seeds"], t["metrics"][metric]["per_seed"]):
        rows = samples.get((task, seed))
        if rows is None or any(d not in rows for d in doc_ids):
            raise UserError(f"{run.samples_file}: task {task} seed {seed} lacks some documents; "
                            "was the run interrupted?")
        if not any(metric in rows[d]["scores"] for d in doc_ids):
            raise UserError(f"{run.samples_file}: task {task} seed {seed}: no row has a '{metric}' score")
        # a row without the score is a document the metric does not score (another retrieval direction's)
        per_sample.append([rows[d]["scores"].get(metric, math.nan) for d in doc_ids])
        preds.append([rows[d]["prediction"] for d in doc_ids])
        refs = refs or [rows[d]["target"] for d in doc_ids]
        values.append(value)
    return per_sample, preds, values, refs


def _metric_config(run: Run, task: str, metric: str) -> tuple[str, dict]:
    from mmcomp_eval.metrics import METRICS

    for mc in run.tasks[task].get("config", {}).get("metrics", []):
        name, options = (mc, {}) if isinstance(mc, str) else (mc["name"], mc.get("options") or {})
        if name == metric or (name in METRICS and METRICS.get(name).name == metric):
            return name, options
    return metric, {}


def paired_tests(runs: list[Run], resamples: int = 10_000, seed: int = 0,
                 allow_different_prompts: bool = False) -> list[dict]:
    """Every pair of runs, on every task both ran (after checking they are comparable)."""
    out = []
    for a, b in itertools.combinations(runs, 2):
        for task in [t for t in a.tasks if t in b.tasks]:
            check_comparable(a, b, task, allow_different_prompts)
            doc_ids = list(a.samples().get((task, a.tasks[task]["seeds"][0]), {}))
            pairs = {}
            for metric in [m for m in a.tasks[task]["metrics"] if m in b.tasks[task]["metrics"]]:
                stats = []
                for run in (a, b):
                    per_sample, preds, values, refs = _task_arrays(run, task, metric, doc_ids)
                    name, options = _metric_config(run, task, metric)
                    docs = [Document(d, {}) for d in doc_ids]
                    stats.append(bootstrap.statistic(name, options, per_sample, values, preds, refs, docs))
                pairs[metric] = (stats[0], stats[1])
            for metric, res in bootstrap.paired_many(pairs, len(doc_ids), resamples, seed).items():
                out.append({"task": task, "metric": metric, "a": a.label, "b": b.label, **res})
    return out


def significance_table(tests: list[dict], fmt: str = "md") -> str:
    head = ["task", "metric", "A", "B", "A - B", "95% CI", "p"]
    rows = [[t["task"], t["metric"], t["a"], t["b"], f"{t['delta']:+.2f}",
             f"[{t['ci_low']:+.2f}, {t['ci_high']:+.2f}]", f"{t['p_value']:.4f}"] for t in tests]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["task", "metric", "a", "b", "delta", "ci_low", "ci_high", "p_value", "resamples"])
        for t in tests:
            w.writerow([t["task"], t["metric"], t["a"], t["b"], round(t["delta"], 4), round(t["ci_low"], 4),
                        round(t["ci_high"], 4), round(t["p_value"], 4), t["resamples"]])
        return buf.getvalue()
    if fmt == "latex":
        lines = [r"\begin{tabular}{llllrrr}", r"\toprule", " & ".join(head).replace("%", r"\%") + r" \\", r"\midrule"]
        lines += [" & ".join(_tex(c) for c in r) + r" \\" for r in rows]
        return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n"
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# -- plots -------------------------------------------------------------------------


def plot(runs: list[Run], folder: Path) -> list[Path]:
    """One PNG per metric: tasks on the x axis, one bar per run, bootstrap standard errors as error bars.

    Runs with retrieval tasks also get ICSVR's Figures 1-3 per dataset (R@1
    of the original captions next to each perturbation).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = atomic_files.make_folder(Path(folder), "--plot-dir")
    by_metric: dict[str, list[str]] = {}
    for task, metric in _rows(runs):
        by_metric.setdefault(metric, []).append(task)
    written = []
    for metric, tasks in by_metric.items():
        fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(tasks) * max(1, len(runs)) / 2 + 2), 3.5))
        width = 0.8 / len(runs)
        for i, run in enumerate(runs):
            cells = [_cell(run, t, metric) for t in tasks]
            xs = [k + (i - (len(runs) - 1) / 2) * width for k in range(len(tasks))]
            means = [c["mean"] if c else 0.0 for c in cells]
            errs = [(c.get("stderr") if c.get("stderr") is not None else c.get("std", 0.0)) if c else 0.0 for c in cells]
            ax.bar(xs, means, width, yerr=errs, capsize=3, label=run.label)
        ax.set_xticks(range(len(tasks)))
        ax.set_xticklabels(tasks, rotation=20, ha="right")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} (error bars: bootstrap standard error)")
        ax.legend(fontsize="small")
        fig.tight_layout()
        path = folder / f"{_file_name(metric)}.png"
        with atomic_files.replacing(path, "wb") as f:
            fig.savefig(f, format="png", dpi=120, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    from mmcomp_eval.retrieval import report

    return written + report.figures([(r.label, r.results) for r in runs], folder)


def _file_name(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s) or "metric"
