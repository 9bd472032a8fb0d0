"""CompAct data speed: full build, cached rebuild, and few-shot selection.

Prints a Markdown table. Targets (issues 2 and 3): full build <= 60 s on 2
cores, cached rebuild <= 1 s, 5 similar shots for every test instance <= 1 s.
The baseline row for selection is the plain Python double loop (score every
train instance for every query), the simplest correct implementation.

    MMCOMP_DATA_DIR=../shared/data python bench/bench_compact.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_build(ek100: Path, cache: Path) -> float:
    env = {**os.environ, "MMCOMP_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mmcomp_eval", "data", "build", "compact", "--ek100-dir", str(ek100)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


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
        rows.append(("full build (process wall, incl. imports)", timed_build(args.ek100_dir, cache), "<= 60 s"))
        rows.append(("cached rebuild (process wall)", timed_build(args.ek100_dir, cache), "<= 1 s"))
        os.environ["MMCOMP_CACHE_DIR"] = str(cache)
        from mmcomp_eval.api.document import Document
        from mmcomp_eval.data.compact_build import build_compact, load_split
        from mmcomp_eval.fewshot import build_sampler

        d = build_compact(args.ek100_dir).directory
        train = load_split(d, "compositional", "train")
        test = load_split(d, "compositional", "test")
        tdocs = [Document(r["id"], r) for r in train]
        qdocs = [Document(r["id"], r) for r in test]
        sampler = build_sampler("similar", {})
        sampler.select(qdocs[:2], tdocs, 5, 0)  # warm-up: scipy import
        start = time.perf_counter()
        sampler.select(qdocs, tdocs, 5, 0)
        rows.append((f"similar 5-shot, {len(test)} queries x {len(train)} pool (vectorised)",
                     time.perf_counter() - start, "<= 1 s"))
        n = 200
        start = time.perf_counter()
        python_similar(test[:n], train, 5)
        per = (time.perf_counter() - start) / n
        rows.append((f"same, plain Python loop (measured on {n} queries, scaled)", per * len(test), "baseline"))
    print("| step | seconds | target |\n|---|---|---|")
    for name, sec, target in rows:
        print(f"| {name} | {sec:.3f} | {target} |")


if __name__ == "__main__":
    main()
