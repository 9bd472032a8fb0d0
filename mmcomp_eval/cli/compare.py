"""``mmcomp-eval compare RESULTS...``: tables, paired significance tests, plots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation.results import PARTIAL_RESULTS_FILE, RESULTS_FILE


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare runs: side-by-side table, paired bootstrap tests, plots")
    p.add_argument("results", nargs="+", type=Path, help="run folders (--output-path) or their results.json")
    p.add_argument("--labels", default=None, help="comma-separated names for the runs (default: folder names)")
    p.add_argument("--format", default="md", choices=["md", "latex", "csv"], help="table format")
    p.add_argument("--output", type=Path, default=None, help="write the tables here instead of printing them")
    p.add_argument("--plot-dir", type=Path, default=None,
                   help="write one PNG bar chart per metric here (and ICSVR's perturbation figures for retrieval runs)")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples for the paired tests")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    p.add_argument("--no-significance", action="store_true", help="only the table (no samples.jsonl needed)")
    p.add_argument("--allow-different-prompts", action="store_true",
                   help="compare runs whose prompts differ (documents must still be the same)")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from mmcomp_eval.evaluation import compare

    if args.resamples < 100:
        raise UserError(f"--resamples {args.resamples}: use at least 100")
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    runs = compare.load_runs(args.results, labels)
    for run in runs:
        if run.results_file.name == RESULTS_FILE and (run.folder / PARTIAL_RESULTS_FILE).exists():
            print(f"mmcomp-eval: note: {run.folder} also holds the progress of a run that is going or did not "
                  f"finish ({PARTIAL_RESULTS_FILE}); comparing the last complete run there ({RESULTS_FILE}, "
                  f"created {run.results.get('created', '?')})", file=sys.stderr)
    parts = [compare.side_by_side(runs, args.format)]
    gaps = compare.gap_table(runs, args.format)
    if gaps:
        parts.append(gaps)
    retrieval = compare.retrieval_report(runs) if args.format == "md" else ""
    if retrieval:
        parts.append(retrieval)
    if len(runs) > 1 and not args.no_significance:
        tests = compare.paired_tests(runs, args.resamples, args.seed, args.allow_different_prompts)
        if args.format == "md":
            parts.append(f"Paired bootstrap over documents ({args.resamples} resamples, seed {args.seed}):\n")
        parts.append(compare.significance_table(tests, args.format))
    text = "\n".join(parts)
    if args.output:
        try:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            atomic_files.write_text(args.output, text)
        except OSError as exc:
            raise UserError(f"--output {args.output}: cannot write it ({exc.strerror})") from None
    else:
        print(text, end="")
    if args.plot_dir:
        for path in compare.plot(runs, args.plot_dir):
            print(f"plot: {path}")
    return 0
