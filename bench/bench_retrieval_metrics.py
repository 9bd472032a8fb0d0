"""Benchmark of the retrieval metrics: speed on 1,000 x 1,000, memory on 100,000 x 100,000.

Usage: ``python bench/bench_retrieval_metrics.py [--n-large 100000] [--dim 64] [--reps 20]``

Prints a Markdown table:

* 1,000 x 1,000 similarity matrix, both directions: the chunked count-based
  scorer (:func:`score_similarity`) against a simple correct baseline that
  sorts every row (``np.argsort``) and looks the target up; the two must give
  the same ranks (continuous random scores have no ties).
* N x N from random ``dim``-d embeddings (one caption per video), both
  directions, through :func:`score_embeddings`: wall time and peak memory
  (tracemalloc's peak of Python/numpy allocations, and the process's max RSS)
  next to what the full float32 matrix would need.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mmcomp_eval.retrieval.ranking import DEFAULT_BLOCK_ELEMENTS, score_embeddings, score_similarity  # noqa: E402


def argsort_baseline(sim: np.ndarray, caption_video: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Full sort per query row; rank = 1 + position of the target (one caption per video)."""
    order = np.argsort(-sim, axis=1)
    t2v = np.argmax(order == caption_video[:, None], axis=1) + 1
    order_v = np.argsort(-sim.T, axis=1)
    video_caption = np.argsort(caption_video)
    v2t = np.argmax(order_v == video_caption[:, None], axis=1) + 1
    return t2v, v2t


def timed(fn, reps: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-small", type=int, default=1000)
    ap.add_argument("--n-large", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--block-elements", type=int, default=DEFAULT_BLOCK_ELEMENTS)
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    n = args.n_small
    sim = rng.standard_normal((n, n)).astype(np.float32)
    cv = rng.permutation(n)
    t_fast, fast = timed(lambda: score_similarity(sim, cv), args.reps)
    t_base, (b_t2v, b_v2t) = timed(lambda: argsort_baseline(sim, cv), max(3, args.reps // 4))
    same = np.array_equal(fast.t2v_ranks, b_t2v) and np.array_equal(fast.v2t_ranks, b_v2t)

    N, d = args.n_large, args.dim
    text = rng.standard_normal((N, d)).astype(np.float32)
    video = rng.standard_normal((N, d)).astype(np.float32)
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    video /= np.linalg.norm(video, axis=1, keepdims=True)
    mapping = np.arange(N)
    inputs_mib = (text.nbytes + video.nbytes) / 2**20
    tracemalloc.start()
    t = time.perf_counter()
    big = score_embeddings(text, video, mapping, block_elements=args.block_elements)
    t_big = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m = big.metrics()

    print(f"cpus: {os.cpu_count()}, numpy {np.__version__}, block_elements {args.block_elements:,}\n")
    print("| case | scorer | time | peak memory | check |")
    print("|---|---|---|---|---|")
    print(f"| {n:,} x {n:,} matrix, both directions | chunked counts (score_similarity) | "
          f"{t_fast * 1e3:.2f} ms (median of {args.reps}) | - | ranks equal to baseline: {same} |")
    print(f"| {n:,} x {n:,} matrix, both directions | argsort per row (baseline) | {t_base * 1e3:.2f} ms | - | "
          f"speed-up x{t_base / t_fast:.1f} |")
    print(f"| {N:,} x {N:,} from {d}-d embeddings, both directions | chunked (score_embeddings) | {t_big:.1f} s | "
          f"{peak / 2**20:.0f} MiB traced (inputs {inputs_mib:.0f} MiB), max RSS {rss_mib:.0f} MiB | "
          f"full matrix would be {N * N * 4 / 2**30:.1f} GiB; t2v R1 {m['t2v']['R1']:.3f}, "
          f"MdR {m['t2v']['MdR']:.0f} (random: ~{(N + 1) / 2:.0f}) |")


if __name__ == "__main__":
    main()
