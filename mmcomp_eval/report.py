"""The Markdown table printed at the end of a run."""

from __future__ import annotations


def markdown_table(record: dict) -> str:
    model = record["model"]["name"]
    lines = [f"model: {model}  args: {record['model'].get('args') or {}}", "",
             "| task | split | n | shots | metric | mean | std | seeds |", "|---|---|---|---|---|---|---|---|"]
    for task, t in record["tasks"].items():
        for metric, m in t["metrics"].items():
            lines.append(f"| {task} | {t['split']} | {t['n_documents']} | {t['shots']} | {metric} | "
                         f"{m['mean']:.2f} | {m['std']:.2f} | {len(m['per_seed'])} |")
    notes = [f"{task}: {metric} scored by {d['model']}" for task, t in record["tasks"].items()
             for metric, d in t.get("metric_details", {}).items() if isinstance(d, dict) and d.get("model")]
    if notes:
        lines += [""] + notes
    return "\n".join(lines)
