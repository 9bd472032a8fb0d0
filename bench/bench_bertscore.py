"""BERTScore: bert-score's own batching against this metric's per-pair computation.

Pairs: the compositional test targets (``trg_narration``) against the last
context narration (an MRH-like prediction). For each way of scoring, prints
the time, how many per-sample values change when the same pairs come in
reverse order (bert-score pads its batches by position, so they can), and
how far the values are from bert-score's. The hash-seed part of the fix is
checked by ``tests/test_metrics.py`` (two processes); within one process
bert-score's ``set()`` order is fixed.

    MMCOMP_DATA_DIR=../shared/data python bench/bench_bertscore.py [--limit 500]
"""

from __future__ import annotations

import argparse
import time

from mmcomp_eval.data.compact_build import build_compact, load_split
from mmcomp_eval.metrics import MetricResources, build_metric
from mmcomp_eval.metrics.bertscore import _scorer


def timed(fn, cands, refs):
    start = time.perf_counter()
    forward = fn(cands, refs)
    seconds = time.perf_counter() - start
    backward = fn(cands[::-1], refs[::-1])[::-1]
    return seconds, forward, sum(a != b for a, b in zip(forward, backward))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None, help="pairs (default: the whole test split)")
    ap.add_argument("--limit-single", type=int, default=300, help="pairs for the batch_size=1 row")
    args = ap.parse_args()
    docs = load_split(build_compact().directory, "compositional", "test")[:args.limit]
    refs = [d["trg_narration"] for d in docs]
    cands = [d["narrations"][-2] for d in docs]
    offline = MetricResources(offline=True)
    metric = build_metric("bertscore", {}, offline)
    single = build_metric("bertscore", {"batch_size": 1}, offline)
    scorer = _scorer(metric.model, False)
    scorer.score(["warm up"], ["the model"])

    def package(c, r):
        return [100 * float(f) for f in scorer.score(c, r, batch_size=64)[2]]

    rows = []
    n_single = min(args.limit_single, len(cands))
    ref_values = None
    for name, fn, k in (("bert-score BERTScorer.score (before)", package, len(cands)),
                        ("this metric, batch_size 64", lambda c, r: list(metric.compute(c, r, []).per_sample),
                         len(cands)),
                        ("bert-score, first pairs", package, n_single),
                        ("this metric, batch_size 1, first pairs",
                         lambda c, r: list(single.compute(c, r, []).per_sample), n_single)):
        seconds, values, moved = timed(fn, cands[:k], refs[:k])
        if ref_values is None or k != len(ref_values):
            ref_values = values
        diffs = [abs(a - b) for a, b in zip(values, ref_values)]
        rows.append((name, k, seconds, moved, max(diffs), sum(d > 1e-4 for d in diffs), sum(values) / k))
    print("| scoring | pairs | seconds | values changed by reversing the pairs | max abs diff vs bert-score "
          "| pairs > 1e-4 off | mean |\n|---|---:|---:|---:|---:|---:|---:|")
    for name, k, seconds, moved, worst, off, mean in rows:
        print(f"| {name} | {k} | {seconds:.2f} | {moved} | {worst:.2e} | {off} | {mean:.4f} |")


if __name__ == "__main__":
    main()
