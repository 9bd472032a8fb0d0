"""The Markdown tables printed at the end of a run: scores per task, then compositional gaps."""

from __future__ import annotations


def markdown_table(record: dict) -> str:
    model = record["model"]["name"]
    lines = [f"model: {model}  args: {record['model'].get('args') or {}}", "",
             "| task | split | n | shots | metric | mean | stderr | std | seeds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for task, t in record["tasks"].items():
        if not t.get("scored", True):  # --predict-only: answers made, nothing scored
            stored = (record.get("cache") or {}).get("enabled", True)
            then = "rerun without it to score the stored answers" if stored else \
                "answers in samples.jsonl only: no response store to score them from"
            lines.append(f"| {task} | {t['split']} | {t['n_documents']} | {t['shots']} | (not scored: "
                         f"--predict-only; {then}) | | | | |")
        for metric, m in t["metrics"].items():
            lines.append(f"| {task} | {t['split']} | {t['n_documents']} | {t['shots']} | {metric} | "
                         f"{m['mean']:.2f} | {format_stderr(m)} | {m['std']:.2f} | {len(m['per_seed'])} |")
    if any(m.get("stderr") is not None for t in record["tasks"].values() for m in t["metrics"].values()):
        lines += ["", "stderr: bootstrap standard error over the documents (as lm-eval's); std: across seeds"]
    notes = [f"{task}: {metric} scored by {d['model']}" for task, t in record["tasks"].items()
             for metric, d in t.get("metric_details", {}).items() if isinstance(d, dict) and d.get("model")]
    if notes:
        lines += [""] + notes
    if record.get("gaps"):
        lines += ["", gap_table(record["gaps"])]
    return "\n".join(lines)


def gap_table(gaps: list[dict]) -> str:
    """One row per twin pair and metric: both scores, the gap and its interval."""
    b = gaps[0]["bootstrap"]
    lines = [f"Compositional gap = in-domain (random split) minus compositional; positive: worse on novel "
             f"compositions. {b['level']:.0%} CI: unpaired bootstrap over the documents of each test set "
             f"({b['resamples']} resamples, seed {b['seed']}).", "",
             "| compositional | in-domain | metric | compositional | in-domain | gap | CI | p |",
             "|---|---|---|---|---|---|---|---|"]
    for g in gaps:
        for metric, m in g["metrics"].items():
            lines.append(f"| {g['compositional_task']} | {g['in_domain_task']} | {metric} | {m['compositional']:.2f} | "
                         f"{m['in_domain']:.2f} | {m['gap']:+.2f} | {format_interval(m)} | {format_p(m)} |")
    return "\n".join(lines)


def format_stderr(m: dict) -> str:
    """``-`` where no bootstrap ran (a --predict-only run, a metric with no per-document statistic)."""
    return "-" if m.get("stderr") is None else f"{m['stderr']:.2f}"


def format_interval(m: dict) -> str:
    return "-" if m.get("ci_low") is None else f"[{m['ci_low']:+.2f}, {m['ci_high']:+.2f}]"


def format_p(m: dict) -> str:
    return "-" if m.get("p_value") is None else f"{m['p_value']:.4f}"
