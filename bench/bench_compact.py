"""CompAct data speed: full build, cached rebuild, and few-shot selection.

Prints a Markdown table. Targets (issues 2, 3 and 9): full build <= 60 s on 2
cores, cached rebuild <= 1 s, 5 similar shots for every test instance <= 1 s,
with the shared-clip exclusion on (the default) and off. The baseline row for
selection is the plain Python double loop (score every train instance for
every query), the simplest correct implementation. CPU seconds are given next
to wall seconds because a shared machine inflates the wall clock.

    MMCOMP_DATA_DIR=../shared/data python bench/bench_compact.py
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_build(ek100: Path, cache: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one ``data build compact`` process."""
    env = {**os.environ, "MMCOMP_CACHE_DIR": str(cache)}
    cpu_before = _children_cpu()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mmcomp_eval", "data", "build", "compact", "--ek100-dir", str(ek100)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, _children_cpu() - cpu_before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def python_similar(queries, pool, k):
    out = []
    for q in queries:
        qa = {("n", x) for x in q["nouns"][:-1]} | {("v", x) for x in q["verbs"][:-1]}
        scored = []
        for j, p in enumerate(pool):
            if p["id"] == q["id"]:
                continue
            pa = {("n", x) for x in p["nouns"][:-1]} | {("v", x) for x in p["verbs"][:-1]}
            scored.append((-len(qa & pa), j))
        scored.sort()
        out.append([j for _, j in scored[:k]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ek100-dir", type=Path,
                    default=Path(os.environ.get("MMCOMP_DATA_DIR", "../shared/data")) / "ek100")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        rows.append(("full build (whole process, incl. imports)", *timed_build(args.ek100_dir, cache), "<= 60 s"))
        rows.append(("cached rebuild (whole process)", *timed_build(args.ek100_dir, cache), "<= 1 s"))
        os.environ["MMCOMP_CACHE_DIR"] = str(cache)
        from mmcomp_eval.api.document import Document
        from mmcomp_eval.data.compact_build import build_compact, load_split
        from mmcomp_eval.tasks.fewshot import build_sampler

        d = build_compact(args.ek100_dir).directory
        train = load_split(d, "compositional", "train")
        test = load_split(d, "compositional", "test")
        tdocs = [Document(r["id"], r) for r in train]
        qdocs = [Document(r["id"], r) for r in test]
        build_sampler("similar", {}).select(qdocs[:2], tdocs, 5, 0)  # warm-up
        for exclude in (True, False):
            sampler = build_sampler("similar", {"exclude_shared_clips": exclude})
            best = min((timed(lambda: sampler.select(qdocs, tdocs, 5, 0)) for _ in range(3)), key=lambda t: t[1])
            rows.append((f"similar 5-shot, {len(test)} queries x {len(train)} pool, shared-clip exclusion "
                         f"{'on (default)' if exclude else 'off'} (best of 3)", *best, "<= 1 s"))
        n = 200
        wall, cpu = timed(lambda: python_similar(test[:n], train, 5))
        rows.append((f"same, plain Python loop, no exclusion (measured on {n} queries, scaled)",
                     wall / n * len(test), cpu / n * len(test), "baseline"))
    print("| step | wall s | CPU s | target |\n|---|---|---|---|")
    for name, wall, cpu, target in rows:
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | {target} |")


if __name__ == "__main__":
    main()
