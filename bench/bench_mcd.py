"""Timing of the MCD greedy split: brute-force reference vs the incremental one.

Run from the repository root: ``python bench/bench_mcd.py`` (about 3 minutes, nearly all
of it the reference; ``--sub-candidates`` / ``--sub-steps`` shrink that part). Prints
Markdown tables. The brute-force reference is the one the tests check against
(tests/test_mcd.py); both are timed on the same subproblem, then the fast one alone on
two CompAct-sized synthetic problems.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np

from mmcomp_eval.data.mcd import atom_divergence, compound_divergence, mcd_split

ROOT = Path(__file__).resolve().parents[1]
N_VERBS, N_NOUNS, CLIPS = 97, 300, 4


def load_reference():
    spec = importlib.util.spec_from_file_location("test_mcd", ROOT / "tests" / "test_mcd.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reference_split


def zipf(n: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    return weights / weights.sum()


def independent_windows(rng: np.random.Generator, n_windows: int):
    """Windows of CLIPS clips, each clip's verb and noun class drawn independently from Zipf(1).

    Returns (atoms, compounds): verbs then nouns (offset by N_VERBS), and
    verb * N_NOUNS + noun per clip. Independence gives far more distinct compounds
    than EK-100 has (about 16,000 against 3,489), so compounds are easy to keep apart.
    """
    verbs = rng.choice(N_VERBS, size=(n_windows, CLIPS), p=zipf(N_VERBS, 1.0))
    nouns = rng.choice(N_NOUNS, size=(n_windows, CLIPS), p=zipf(N_NOUNS, 1.0))
    return np.concatenate([verbs, N_VERBS + nouns], axis=1), verbs * N_NOUNS + nouns


def paired_windows(rng: np.random.Generator, n_windows: int, n_pairs: int = 6000):
    """Like independent_windows, but each clip draws a (verb, noun) pair from a Zipf(0.8)-ranked
    list of pairs whose verbs and nouns are Zipf(1): about 2,800 distinct compounds, close to
    EK-100, and the D_A / D_C trajectory comes out close to the one measured on the real data.
    """
    verbs = rng.choice(N_VERBS, size=n_pairs, p=zipf(N_VERBS, 1.0))
    nouns = rng.choice(N_NOUNS, size=n_pairs, p=zipf(N_NOUNS, 1.0))
    pairs = np.unique(verbs * N_NOUNS + nouns)
    compounds = pairs[rng.choice(len(pairs), size=(n_windows, CLIPS), p=zipf(len(pairs), 0.8))]
    verb, noun = np.divmod(compounds, N_NOUNS)
    return np.concatenate([verb, N_VERBS + noun], axis=1), compounds


def compact(rows: np.ndarray) -> list[list[int]]:
    """Renumber ids to 0..k-1 so that the dense reference stays small."""
    return np.unique(rows, return_inverse=True)[1].reshape(rows.shape).tolist()


def final_divergences(atoms, compounds, train, heldout):
    def sides(rows):
        rows = np.asarray(rows)
        counts = np.zeros((len(rows), rows.max() + 1))
        np.add.at(counts, (np.arange(len(rows))[:, None], rows), 1)
        return counts[train].sum(axis=0), counts[heldout].sum(axis=0)

    return atom_divergence(*sides(atoms)), compound_divergence(*sides(compounds))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sub-candidates", type=int, default=2000)
    parser.add_argument("--sub-steps", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=30000)
    parser.add_argument("--steps", type=int, default=8800)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    atoms, compounds = independent_windows(rng, args.candidates)
    sub = rng.choice(args.candidates, size=args.sub_candidates, replace=False)
    sub_atoms, sub_compounds = compact(atoms[sub]), compact(compounds[sub])
    options = {"seed": 0, "target_size": args.sub_steps}

    rows = []
    (train, heldout), seconds = timed(lambda: load_reference()(sub_atoms, sub_compounds, **options))
    d_a, d_c = final_divergences(sub_atoms, sub_compounds, train, heldout)
    rows.append(("brute-force reference", "independent", args.sub_candidates, args.sub_steps, seconds, d_a, d_c))
    fast, seconds = timed(lambda: mcd_split(sub_atoms, sub_compounds, **options))
    same = fast.train.tolist() == train and fast.heldout.tolist() == heldout
    rows.append(("fast", "independent", args.sub_candidates, args.sub_steps, seconds, fast.atom_divergence,
                 fast.compound_divergence))
    traces = {}
    for name, problem in (("independent", (atoms, compounds)), ("paired", paired_windows(rng, args.candidates))):
        full_atoms, full_compounds = (rows_.tolist() for rows_ in problem)
        fast, seconds = timed(lambda: mcd_split(full_atoms, full_compounds, seed=0, target_size=args.steps,
                                                 trace_every=1000))
        rows.append(("fast", name, args.candidates, args.steps, seconds, fast.atom_divergence,
                     fast.compound_divergence))
        traces[name] = (len(np.unique(problem[1])), fast.trace)

    print("| implementation | problem | candidates | steps | seconds | final D_A | final D_C |")
    print("|---|---|---|---|---|---|---|")
    for name, problem, n, steps, seconds, d_a, d_c in rows:
        print(f"| {name} | {problem} | {n:,} | {steps:,} | {seconds:.2f} | {d_a:.4f} | {d_c:.4f} |")
    print()
    print(f"Same selections as the reference on the subproblem: {'yes' if same else 'NO'}.")
    for name, (n_compounds, trace) in traces.items():
        print()
        print(f"Trace, {name} problem ({n_compounds:,} distinct compounds):")
        print()
        print("| instances assigned | D_A | D_C |")
        print("|---|---|---|")
        for n_assigned, d_a, d_c in trace:
            print(f"| {n_assigned:,} | {d_a:.4f} | {d_c:.4f} |")


if __name__ == "__main__":
    main()
