"""How often few-shot examples show the query's answer, with the shared-clip rule off and on.

CompAct windows overlap, so a training window can contain a test window's target
clip. For every test query of both split kinds and every sampler (5 shots, seed 0)
this counts the queries whose shots contain the query's *target* clip (the answer
itself, shown as a shot's context or answer) and those whose shots share *any*
clip with it, once with ``exclude_shared_clips: false`` (the behaviour before the
rule) and once with the default. Prints a Markdown table; timings are in
bench/bench_compact.py.

    MMCOMP_DATA_DIR=../shared/data python bench/bench_shot_leaks.py
    MMCOMP_DATA_DIR=../shared/data python bench/bench_shot_leaks.py --heldout-split random   # builder v2's split
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mmcomp_eval.api.document import Document
from mmcomp_eval.data.compact_build import HELDOUT_SPLITS, SPLIT_KINDS, BuildParams, build_compact, load_split
from mmcomp_eval.tasks.fewshot import build_sampler


def leaks(queries: list[Document], pool: list[Document], picks: list[list[int]]) -> tuple[int, int]:
    """(queries whose shots hold the query's target clip, queries whose shots share any clip with it)."""
    target = shared = 0
    for q, row in zip(queries, picks):
        shot_clips = {c for i in row for c in pool[i]["narration_ids"]}
        target += q["narration_ids"][-1] in shot_clips
        shared += bool(shot_clips & set(q["narration_ids"]))
    return target, shared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ek100-dir", type=Path,
                    default=Path(os.environ.get("MMCOMP_DATA_DIR", "../shared/data")) / "ek100")
    ap.add_argument("--heldout-split", choices=HELDOUT_SPLITS, default=BuildParams().heldout_split)
    ap.add_argument("--shots", type=int, default=5)
    args = ap.parse_args()
    directory = build_compact(args.ek100_dir, BuildParams(heldout_split=args.heldout_split)).directory
    print(f"CompAct build: {directory} (heldout_split={args.heldout_split}), {args.shots} shots, seed 0\n")
    print("| split kind | sampler | queries | rule | target clip in shots | any shared clip | "
          "excluded pairs | queries affected | max per query |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in SPLIT_KINDS:
        pool = [Document(r["id"], r) for r in load_split(directory, kind, "train")]
        queries = [Document(r["id"], r) for r in load_split(directory, kind, "test")]
        for name in ("similar", "random", "first"):
            for exclude in (False, True):
                sampler = build_sampler(name, {"exclude_shared_clips": exclude})
                selection = sampler.choose(queries, pool, args.shots, 0)
                target, shared = leaks(queries, pool, selection.picks)
                ex = selection.exclusion
                n = len(queries)
                print(f"| {kind} | {name} | {n} | {'on' if exclude else 'off'} | {target} ({100 * target / n:.1f}%) | "
                      f"{shared} ({100 * shared / n:.1f}%) | {ex.excluded_pairs} | {ex.queries_affected} | "
                      f"{ex.max_excluded_per_query} |")


if __name__ == "__main__":
    main()
