"""Reports from any set of retrieval result files: ICSVR Table 2 and Figures 1-3, SAVE SumR / mR1.

Inputs are the ``retrieval_<dataset>_<split>.json`` files written by
``mmcomp-eval retrieval`` (or folders holding them). Each file is one model on
one dataset; rows are named by the model's ``label``. The outputs are
``report.md`` and, per dataset, up to three PNG bar charts (R@1 of the
original captions next to the ablations of that figure), drawn with
matplotlib's Agg backend so no display is needed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.errors import UserError
from mmcomp_eval.retrieval.metrics import mean_r1
from mmcomp_eval.retrieval.runner import ORIGINAL, RECORD_KIND, RETRIEVAL_SCHEMA_VERSION

#: result schemas this report reads; version 1 files ranked v2t over all captions with uniform frames,
#: 77 text tokens and float32 weights, and are read as such
READABLE_SCHEMAS = (1, RETRIEVAL_SCHEMA_VERSION)
V1_SETTINGS = {"v2t": "all_captions", "frame_sampling": "uniform", "max_text_tokens": 77, "dtype": "float32"}

#: ICSVR Table 2 columns (per direction)
TABLE2_SETS = (ORIGINAL, "actrem", "objattrrem", "synrem")
#: ICSVR Figures 1-3: file stem, title, caption sets
FIGURES = (
    ("fig1_objects", "object ablations", (ORIGINAL, "objshift", "objrep", "objpartial")),
    ("fig2_actions", "action ablations", (ORIGINAL, "actneg", "actrep")),
    ("fig3_word_order", "word order", (ORIGINAL, "shuf", "rev")),
)
DIRECTION_NAMES = {"t2v": "text-to-video", "v2t": "video-to-text"}
#: columns follow the paper's Table 1 order whatever order a file lists them in
SET_ORDER = (ORIGINAL, "objattrrem", "objshift", "objrep", "objpartial", "actrem", "actneg", "actrep", "synrem",
             "shuf", "rev")


def _ordered(names: Iterable[str]) -> list[str]:
    rank = {n: i for i, n in enumerate(SET_ORDER)}
    return sorted(dict.fromkeys(names), key=lambda n: (rank.get(n, len(rank)), n))


def notation(caption_set: str) -> str:
    """The paper's name for a caption set: Q, Q_actrem, ..."""
    return "Q" if caption_set == ORIGINAL else f"Q_{caption_set}"


def load_results(paths: Iterable[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Result records from files and folders; one line naming the file for anything else."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.glob("retrieval_*.json"))
            if not found:
                raise UserError(f"{p} holds no retrieval_*.json result file; give the files written by "
                                "`mmcomp-eval retrieval --output-path`")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"result file {p} does not exist")
    out: list[tuple[Path, dict[str, Any]]] = []
    seen: dict[tuple[str, str, str], Path] = {}
    for f in dict.fromkeys(x.resolve() for x in files):
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{f} is not JSON ({exc}); give retrieval result files") from None
        if not isinstance(rec, dict) or rec.get("kind") != RECORD_KIND:
            raise UserError(f"{f} is not a retrieval result (no \"kind\": \"retrieval\"); give the files written "
                            "by `mmcomp-eval retrieval`")
        if rec.get("schema_version") not in READABLE_SCHEMAS:
            raise UserError(f"{f} has schema_version {rec.get('schema_version')}; this mmcomp-eval reads "
                            f"{', '.join(map(str, READABLE_SCHEMAS))}: rerun `mmcomp-eval retrieval`")
        key = (label(rec), rec["dataset"]["name"], rec["dataset"]["split"])
        if key in seen:
            raise UserError(f"{f} and {seen[key]} are both '{key[0]}' on {key[1]}/{key[2]}; rerun one with "
                            "--label NAME to tell them apart")
        seen[key] = f
        out.append((f, rec))
    return out


def label(rec: dict[str, Any]) -> str:
    return str(rec["model"].get("label") or rec["model"]["name"])


def settings(rec: dict[str, Any]) -> dict[str, Any]:
    """The conventions a record's numbers depend on: v2t convention, frame sampling, text tokens, dtype."""
    if rec.get("schema_version") == 1:
        return dict(V1_SETTINGS)
    fp = rec["model"].get("fingerprint") or {}
    clip = fp.get("video") if isinstance(fp.get("video"), dict) else fp  # fusion nests its CLIP part
    return {"v2t": rec["config"].get("v2t_convention"), "frame_sampling": clip.get("frame_sampling"),
            "max_text_tokens": clip.get("max_text_tokens"), "dtype": clip.get("dtype")}


def settings_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per result file: what its numbers depend on beyond the model and the data."""
    lines = ["| model | dataset | v2t convention | frame sampling | text tokens | dtype |", "|---" * 6 + "|"]
    for r in records:
        st = settings(r)
        cells = [_text(st[k]) for k in ("v2t", "frame_sampling", "max_text_tokens", "dtype")]
        lines.append(f"| {label(r)} | {r['dataset']['name']}/{r['dataset']['split']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _text(x: Any) -> str:
    return "-" if x is None else str(x)


def mixed_settings(records: Sequence[dict[str, Any]], dataset: tuple[str, str]) -> list[str]:
    """Settings that differ between the records of one dataset (their rows are then not like for like)."""
    rows = [settings(r) for r in records if (r["dataset"]["name"], r["dataset"]["split"]) == dataset]
    return [k for k in ("v2t", "frame_sampling", "max_text_tokens", "dtype") if len({str(s[k]) for s in rows}) > 1]


def _r1(rec: dict[str, Any], caption_set: str, direction: str) -> float | None:
    res = rec["caption_sets"].get(caption_set)
    return None if res is None else float(res[direction]["R1"])


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _datasets(records: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r["dataset"]["name"], r["dataset"]["split"]) for r in records))


def table2(records: Sequence[dict[str, Any]], dataset: tuple[str, str]) -> str:
    """ICSVR Table 2: R@1 on Q, Q_actrem, Q_objattrrem, Q_synrem, both directions, a row per model."""
    rows = [r for r in records if (r["dataset"]["name"], r["dataset"]["split"]) == dataset]
    head = [f"{d} {notation(s)}" for d in ("t2v", "v2t") for s in TABLE2_SETS]
    lines = ["| model | " + " | ".join(head) + " |", "|---" * (1 + len(head)) + "|"]
    for r in rows:
        lines.append(f"| {label(r)} | " + " | ".join(_cell(_r1(r, s, d)) for d in ("t2v", "v2t")
                                                     for s in TABLE2_SETS) + " |")
    return "\n".join(lines)


def all_sets_table(records: Sequence[dict[str, Any]], dataset: tuple[str, str], direction: str) -> str:
    """R@1 of every caption set any of the models was run on, and the number left unchanged."""
    rows = [r for r in records if (r["dataset"]["name"], r["dataset"]["split"]) == dataset]
    sets = _ordered(s for r in rows for s in r["caption_sets"])
    lines = ["| model | " + " | ".join(notation(s) for s in sets) + " |", "|---" * (1 + len(sets)) + "|"]
    for r in rows:
        lines.append(f"| {label(r)} | " + " | ".join(_cell(_r1(r, s, direction)) for s in sets) + " |")
    unchanged = [next((r["caption_sets"][s].get("n_unchanged") for r in rows if s in r["caption_sets"]), None)
                 for s in sets]
    cells = " | ".join("-" if u is None else str(u) for u in unchanged)
    lines.append(f"| captions unchanged (first file with the set) | {cells} |")
    return "\n".join(lines)


def sumr_table(records: Sequence[dict[str, Any]], direction: str = "t2v") -> str:
    """SAVE style: R@1/5/10 and SumR per dataset on the original captions, and mR1 over all of them.

    mR1 is given only to a model with results on every dataset of the
    report: a mean over another set of datasets would sit in the same column
    without being comparable, so such a cell says how many it has instead.
    """
    datasets = _datasets(records)
    models = list(dict.fromkeys(label(r) for r in records))
    head = [f"{n}/{s} {m}" for n, s in datasets for m in ("R1", "R5", "R10", "SumR")]
    lines = ["| model | " + " | ".join(head) + f" | mR1 ({len(datasets)} datasets) |", "|---" * (2 + len(head)) + "|"]
    for m in models:
        cells, r1s = [], {}
        for ds in datasets:
            rec = next((r for r in records if label(r) == m and (r["dataset"]["name"], r["dataset"]["split"]) == ds),
                       None)
            res = None if rec is None else rec["caption_sets"].get(ORIGINAL, {}).get(direction)
            cells += ["-"] * 4 if res is None else [f"{res[k]:.1f}" for k in ("R1", "R5", "R10", "SumR")]
            if res is not None:
                r1s[f"{ds[0]}/{ds[1]}"] = res["R1"]
        mr1 = f"{mean_r1(r1s):.1f}" if len(r1s) == len(datasets) else f"none: {len(r1s)} of {len(datasets)} datasets"
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {mr1} |")
    return "\n".join(lines)


def bar_chart(records: Sequence[dict[str, Any]], dataset: tuple[str, str], sets: Sequence[str], title: str,
              direction: str, path: Path) -> bool:
    """Grouped bars: one group per model, one bar per caption set; False when no ablation is present."""
    rows = [r for r in records if (r["dataset"]["name"], r["dataset"]["split"]) == dataset]
    present = [s for s in sets if any(s in r["caption_sets"] for r in rows)]
    if not rows or not [s for s in present if s != ORIGINAL]:
        return False
    try:
        import matplotlib
    except ImportError:
        raise UserError("the retrieval report's charts need matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / len(present)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 + 1.1 * len(rows) * len(present) * 0.45), 3.6), dpi=120)
    for k, s in enumerate(present):
        xs = [i + (k - (len(present) - 1) / 2) * width for i in range(len(rows))]
        ys = [_r1(r, s, direction) or 0.0 for r in rows]
        bars = ax.bar(xs, ys, width, label="$Q$" if s == ORIGINAL else f"$Q_{{{s}}}$")
        ax.bar_label(bars, labels=[_cell(_r1(r, s, direction)) for r in rows], fontsize=7, padding=1)
    ax.set_xticks(range(len(rows)), [label(r) for r in rows], fontsize=8)
    ax.set_ylabel(f"R@1 ({DIRECTION_NAMES[direction]})")
    ax.set_title(f"{dataset[0]}/{dataset[1]}: {title}")
    ax.legend(fontsize=7, ncol=len(present))
    ax.margins(y=0.15)
    fig.tight_layout()
    with atomic_files.replacing(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return True


def build_report(paths: Iterable[Path], output_dir: Path, *, direction: str = "t2v") -> list[Path]:
    """Write report.md and the figures; return the paths written."""
    loaded = load_results(paths)
    records = [rec for _, rec in loaded]
    output_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    md = ["# Retrieval report", "",
          f"{len(records)} result file(s). R@1 in percent; ties are ranked pessimistically "
          "(an item scoring the same as the target ranks before it).", "",
          "## SumR and mR1 (original captions, text-to-video)" if direction == "t2v"
          else "## SumR and mR1 (original captions, video-to-text)", "", sumr_table(records, direction), "",
          "mR1 is the unweighted mean of R@1 over every dataset in this report; a model without results on all of "
          "them gets none, since a mean over a different set of datasets is not comparable.", "",
          "## Settings", "", settings_table(records), ""]
    for ds in _datasets(records):
        name = f"{ds[0]}_{ds[1]}"
        md += [f"## {ds[0]}/{ds[1]}", ""]
        mixed = mixed_settings(records, ds)
        if mixed:
            md += [f"**Not like for like:** the models here differ in {', '.join(mixed)} (see Settings).", ""]
        md += ["R@1 like ICSVR Table 2:", "", table2(records, ds), "",
               f"R@1 of every caption set ({DIRECTION_NAMES[direction]}):", "",
               all_sets_table(records, ds, direction), ""]
        for stem, title, sets in FIGURES:
            png = output_dir / f"{stem}_{name}.png"
            if bar_chart(records, ds, sets, title, direction, png):
                written.append(png)
                md += [f"![{title}]({png.name})", ""]
    md += ["## Files", ""] + [f"- {p}" for p, _ in loaded] + [""]
    report = output_dir / "report.md"
    atomic_files.write_text(report, "\n".join(md))
    return [report, *written]
