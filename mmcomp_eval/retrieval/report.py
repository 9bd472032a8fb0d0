"""Retrieval across tasks and runs: ICSVR's perturbation drops (Table 2, Figures 1-3) and SAVE's SumR / mR1.

Read from ordinary run records (``results.json``): every task with
``output_type: retrieval`` is one caption set (the original captions, or one
perturbation's) of one dataset. Tasks share a dataset when they were scored
on the same query documents (``documents_sha256``: same captions, gallery
and ``--limit``); a perturbation changes the captions per seed, not the
documents. ``mmcomp-eval compare`` prints these tables and draws the figures.

mR1, the mean R@1 over datasets, is given to a run only when it has results
on every dataset of the comparison: a mean over another set of datasets
would sit in the same column without being comparable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmcomp_eval.errors import UserError
from mmcomp_eval.retrieval.ranking import mean_r1
from mmcomp_eval.runtime import atomic_files

ORIGINAL = "original"
#: columns follow ICSVR's Table 1 order whatever order the runs list them in
SET_ORDER = (ORIGINAL, "objattrrem", "objshift", "objrep", "objpartial", "actrem", "actneg", "actrep", "synrem",
             "shuf", "rev")
#: ICSVR Figures 1-3: file stem, title, caption sets
FIGURES = (
    ("fig1_objects", "object ablations", (ORIGINAL, "objshift", "objrep", "objpartial")),
    ("fig2_actions", "action ablations", (ORIGINAL, "actneg", "actrep")),
    ("fig3_word_order", "word order", (ORIGINAL, "shuf", "rev")),
)
DIRECTION_NAMES = {"t2v": "text-to-video", "v2t": "video-to-text"}
#: what a run's numbers depend on beyond the model and the data, per task
SETTINGS = ("v2t", "frame_sampling", "n_frames", "max_text_tokens", "dtype")


@dataclass(frozen=True)
class CaptionSet:
    """One retrieval task of one run: a dataset's captions as given or as one perturbation leaves them."""

    run: str
    task: str
    dataset: str        # "msrvtt/test", with the gallery size when --limit cut it
    documents: str      # documents_sha256: what makes two tasks the same dataset
    caption_set: str    # ORIGINAL or the perturbation kind
    metrics: Mapping[str, Mapping[str, Any]]
    settings: Mapping[str, Any]

    def value(self, metric: str) -> float | None:
        m = self.metrics.get(metric)
        return None if m is None else float(m["mean"])


def caption_sets(label: str, results: Mapping[str, Any]) -> list[CaptionSet]:
    """The retrieval tasks of one run record, in its order."""
    out = []
    for task, t in results.get("tasks", {}).items():
        cfg = t.get("config") or {}
        if cfg.get("output_type") != "retrieval":
            continue
        info = t.get("retrieval") or {}
        gallery = info.get("gallery") or {}
        name = f"{(cfg.get('dataset') or {}).get('name', '?')}/{t.get('split', '?')}"
        if gallery.get("limited"):
            name += f" (first {gallery.get('n_videos')} videos)"
        settings = dict(info.get("settings") or {})
        fp = (results.get("model") or {}).get("fingerprint") or {}
        clip = fp.get("video") if isinstance(fp.get("video"), dict) else fp  # fusion nests its CLIP part
        settings["dtype"] = clip.get("dtype")
        kind = (cfg.get("perturbation") or {}).get("kind") or ORIGINAL
        out.append(CaptionSet(label, task, name, str(t.get("documents_sha256")), kind, t.get("metrics") or {},
                              settings))
    return out


def _ordered(names) -> list[str]:
    rank = {n: i for i, n in enumerate(SET_ORDER)}
    return sorted(dict.fromkeys(names), key=lambda n: (rank.get(n, len(rank)), n))


def notation(caption_set: str) -> str:
    """The paper's name for a caption set: Q, Q_actrem, ..."""
    return "Q" if caption_set == ORIGINAL else f"Q_{caption_set}"


def _datasets(sets: Sequence[CaptionSet]) -> list[tuple[str, str]]:
    """(documents, display name) of every dataset, in first-seen order."""
    return list(dict.fromkeys((s.documents, s.dataset) for s in sets))


def _find(sets: Sequence[CaptionSet], run: str, documents: str, caption_set: str) -> CaptionSet | None:
    found = [s for s in sets if (s.run, s.documents, s.caption_set) == (run, documents, caption_set)]
    if len(found) > 1:
        raise UserError(f"run '{run}' has tasks {found[0].task} and {found[1].task} for the same caption set "
                        f"{notation(caption_set)} of {found[0].dataset}; compare one of them")
    return found[0] if found else None


def _runs(sets: Sequence[CaptionSet]) -> list[str]:
    return list(dict.fromkeys(s.run for s in sets))


def _cell(x: float | None, base: float | None = None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if base is None else f"{x:.1f} ({x - base:+.1f})"


def drop_table(sets: Sequence[CaptionSet], documents: str, direction: str) -> str:
    """R@1 of every caption set, each perturbation with its change from the original captions (ICSVR Table 2)."""
    here = [s for s in sets if s.documents == documents]
    names = _ordered(s.caption_set for s in here)
    lines = ["| run | " + " | ".join(notation(n) for n in names) + " |", "|---" * (1 + len(names)) + "|"]
    metric = f"{direction}_r1"
    for run in _runs(here):
        original = _find(here, run, documents, ORIGINAL)
        base = original.value(metric) if original else None
        cells = []
        for n in names:
            s = _find(here, run, documents, n)
            v = s.value(metric) if s else None
            cells.append(_cell(v, None if n == ORIGINAL or base is None else base))
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sumr_table(sets: Sequence[CaptionSet], direction: str = "t2v") -> str:
    """SAVE style: R@1/5/10 and SumR of the original captions per dataset, and mR1 over every dataset."""
    datasets = _datasets([s for s in sets if s.caption_set == ORIGINAL])
    head = [f"{name} {m}" for _, name in datasets for m in ("R1", "R5", "R10", "SumR")]
    lines = ["| run | " + " | ".join(head) + f" | mR1 ({len(datasets)} datasets) |", "|---" * (2 + len(head)) + "|"]
    for run in _runs(sets):
        cells, r1s = [], {}
        for documents, name in datasets:
            s = _find(sets, run, documents, ORIGINAL)
            values = [None if s is None else s.value(f"{direction}_{m}") for m in ("r1", "r5", "r10", "sumr")]
            cells += [_cell(v) for v in values]
            if values[0] is not None:
                r1s[documents] = values[0]
        mr1 = f"{mean_r1(r1s):.1f}" if len(r1s) == len(datasets) and r1s else \
            f"none: {len(r1s)} of {len(datasets)} datasets"
        lines.append(f"| {run} | " + " | ".join(cells) + f" | {mr1} |")
    return "\n".join(lines)


def mixed_settings(sets: Sequence[CaptionSet], documents: str) -> list[str]:
    """Settings that differ between the runs' tasks on one dataset (their rows are then not like for like)."""
    here = [s for s in sets if s.documents == documents]
    return [k for k in SETTINGS if len({str(s.settings.get(k)) for s in here}) > 1]


def report(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Markdown: per dataset the perturbation drops in both directions; SumR and mR1 over datasets. "" without any."""
    sets = [s for label, results in runs for s in caption_sets(label, results)]
    if not sets:
        return ""
    md = ["Retrieval: R@1 per caption set, each perturbation's change from the original captions in brackets "
          "(ICSVR); ties ranked pessimistically.", ""]
    for documents, name in _datasets(sets):
        mixed = mixed_settings(sets, documents)
        md += [f"{name}:" + (f" **not like for like**: the runs differ in {', '.join(mixed)}" if mixed else ""), ""]
        for direction in DIRECTION_NAMES:
            md += [f"{DIRECTION_NAMES[direction]} R@1:", "", drop_table(sets, documents, direction), ""]
    if not any(s.caption_set == ORIGINAL for s in sets):  # only perturbed caption sets: no SumR to show
        md += ["SumR and mR1 need the original captions' tasks (e.g. msrvtt_1ka_retrieval); these runs have none.", ""]
        return "\n".join(md)
    md += ["SumR and mR1 (original captions, text-to-video). mR1 is the mean R@1 over every dataset here; a run "
           "without results on all of them gets none.", "", sumr_table(sets), ""]
    return "\n".join(md)


def figures(runs: Sequence[tuple[str, Mapping[str, Any]]], folder: Path, direction: str = "t2v") -> list[Path]:
    """ICSVR Figures 1-3 per dataset: R@1 of the original captions next to each ablation, a group of bars per run."""
    sets = [s for label, results in runs for s in caption_sets(label, results)]
    written = []
    for documents, name in _datasets(sets):
        stem_name = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
        for stem, title, wanted in FIGURES:
            path = Path(folder) / f"{stem}_{stem_name}.png"
            if _bar_chart(sets, documents, name, wanted, title, direction, path):
                written.append(path)
    return written


def _bar_chart(sets: Sequence[CaptionSet], documents: str, name: str, wanted: Sequence[str], title: str,
               direction: str, path: Path) -> bool:
    """Grouped bars; False (nothing drawn) when none of the figure's ablations is present."""
    here = [s for s in sets if s.documents == documents]
    present = [c for c in wanted if any(s.caption_set == c for s in here)]
    runs = _runs(here)
    if not [c for c in present if c != ORIGINAL]:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = f"{direction}_r1"

    def value(run: str, c: str) -> float | None:
        s = _find(here, run, documents, c)
        return s.value(metric) if s else None

    width = 0.8 / len(present)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 + 1.1 * len(runs) * len(present) * 0.45), 3.6), dpi=120)
    for k, c in enumerate(present):
        xs = [i + (k - (len(present) - 1) / 2) * width for i in range(len(runs))]
        ys = [value(r, c) for r in runs]
        bars = ax.bar(xs, [y or 0.0 for y in ys], width, label="$Q$" if c == ORIGINAL else f"$Q_{{{c}}}$")
        ax.bar_label(bars, labels=[_cell(y) for y in ys], fontsize=7, padding=1)
    ax.set_xticks(range(len(runs)), runs, fontsize=8)
    ax.set_ylabel(f"R@1 ({DIRECTION_NAMES[direction]})")
    ax.set_title(f"{name}: {title}")
    ax.legend(fontsize=7, ncol=len(present))
    ax.margins(y=0.15)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_files.replacing(path, "wb") as f:
        fig.savefig(f, format="png", metadata={"Software": None})
    plt.close(fig)
    return True
