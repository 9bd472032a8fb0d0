"""Maximum Compound Divergence (MCD) split of CompAct (Yagcioglu et al., NAACL 2024).

CompAct wants train (U) and held-out (W) sets whose *atoms* (verb and noun classes)
are distributed alike while their *compounds* ((verb, noun) pairs) differ, so that a
model is tested on unseen combinations of familiar concepts. Algorithm 1 of the paper
builds the split greedily: each step picks a side at random and adds the remaining
candidate that keeps D_A = 1 - C_0.5(F_A(U)||F_A(W)) below a threshold while making
D_C = 1 - C_0.1(F_C(U)||F_C(W)) as large as possible.

Working out every candidate's effect afresh at each of ~8,800 steps over ~30,000
candidates took a first version 168 s. Here the unnormalised Chernoff sum
S = sum_k u_k^a w_k^(1-a) is kept together with, for every candidate and side, the
change of S its addition would cause. Adding an item only changes u or w at its own
keys, so only the candidates sharing one of those keys need their change updated,
and a per-key table of contributions makes that update a gather/scatter, not a power.
The normaliser is applied per candidate size, so windows of different sizes are exact.
The accumulated changes drift from a fresh recomputation by ~1e-16 in divergence
units after 8,800 steps, far below ``TIE_TOLERANCE``.

Conventions, fixed so that the split is reproducible and testable:

* Empty side: a distribution with no mass shares none with the other, so its Chernoff
  coefficient is 0 and both divergences are 1. While one side is empty every candidate
  therefore ties (D_A = D_C = 1, none passes the atom filter) and the tie-break below
  picks the first candidate of the random order; step 0 of Algorithm 1 ("add a random
  item to a random side") is this case, not a special one.
* Randomness: ``rng = np.random.default_rng(seed)``; ``order = rng.permutation(n)``
  ranks the candidates for tie-breaking, then ``sides = rng.integers(0, 2, size=n)``
  gives the side of each step (0 = train U, 1 = held-out W).
* Ties: candidates whose D_C is within ``TIE_TOLERANCE`` of the best are equal (so
  the choice never hinges on float rounding). Among them the lowest D_A wins (again
  within the tolerance), then the earliest in ``order``. The paper leaves ties open,
  but they are the rule, not the exception: for the first thousands of steps many
  candidates keep the sides compound-disjoint (D_C = 1), and picking among them at
  random lets D_A settle above the 0.02 target, where the atom filter is never met;
  preferring the lowest D_A keeps it well below (0.005 instead of 0.024 after 8,800
  steps of the independent-draws problem of bench/bench_mcd.py).
* Stop: after ``target_size`` assignments (default: the whole pool), or, when
  ``min_compound_divergence`` is given, before the first step whose best candidate
  would bring D_C below it; the returned split then still satisfies the bound.
* Held-out halves (``split_heldout=True``, an extension; the paper halves the held-out
  set at random afterwards): the held-out side is grown as two parts, 0 (validation)
  and 1 (test), and the atom filter asks D_A(U||part) below the threshold for the part
  an item joins, and for both parts (the larger D_A) when U grows; D_C stays train vs
  the whole held-out side, as in Algorithm 1. A held-out step grows the smaller part;
  when both are equal, each candidate joins the part where its D_A is lower (part 0
  on a tie), so the filter admits it if either part does, and the parts never differ
  by more than one instance. Why: D_A(U||W) is concave in W's distribution, so a
  random halving of a held-out set whose D_A sits just under the threshold leaves at
  least one half above it (0.0236 for test on CompAct); checking each half while it
  is built keeps both below. (Plain alternation between the parts also meets the
  target, at a lower D_C: 0.72 against 0.74 on CompAct, 0.81 against 0.86 with
  target-only compounds.)
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mmcomp_eval.errors import UserError

ATOM_ALPHA = 0.5
# Small alpha weights the train side: a compound matters by whether it occurs in
# train at all more than by how its train and held-out frequencies compare.
COMPOUND_ALPHA = 0.1
TIE_TOLERANCE = 1e-9
TRAIN, HELDOUT = 0, 1


def chernoff_coefficient(p: np.ndarray, q: np.ndarray, alpha: float) -> float:
    """C_alpha(P||Q) = sum_k p_k^alpha q_k^(1-alpha) of the normalised vectors.

    An all-zero vector is an empty distribution: it shares no mass, so the result is 0.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.ndim != 1 or p.shape != q.shape:
        raise UserError(f"chernoff_coefficient: p and q have shapes {p.shape} and {q.shape}; "
                        "expected two 1-D vectors over the same keys")
    if not 0.0 < alpha < 1.0:
        raise UserError(f"chernoff_coefficient: alpha={alpha!r}; expected a number in (0, 1)")
    if (p < 0).any() or (q < 0).any():
        raise UserError("chernoff_coefficient: p or q has a negative entry; expected counts or probabilities")
    p_total, q_total = p.sum(), q.sum()
    if p_total == 0 or q_total == 0:
        return 0.0
    coefficient = np.sum((p / p_total) ** alpha * (q / q_total) ** (1.0 - alpha))
    return float(min(coefficient, 1.0))


def atom_divergence(u_counts, w_counts) -> float:
    """D_A(U||W): symmetric alpha, because atoms should be distributed alike on both sides."""
    return 1.0 - chernoff_coefficient(u_counts, w_counts, ATOM_ALPHA)


def compound_divergence(u_counts, w_counts) -> float:
    """D_C(U||W), with U the train side (the order matters: alpha = 0.1)."""
    return 1.0 - chernoff_coefficient(u_counts, w_counts, COMPOUND_ALPHA)


@dataclass(frozen=True)
class MCDResult:
    train: np.ndarray  # candidate indices, in the order added (the order is the greedy's history)
    heldout: np.ndarray
    atom_divergence: float  # D_A and D_C of train vs the whole held-out side
    compound_divergence: float
    trace: tuple[tuple[int, float, float], ...]  # (n_assigned, D_A, D_C), to choose a stop size
    #: with ``split_heldout``: the part (0 validation, 1 test) of each ``heldout`` entry; else all 0
    heldout_part: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class _Bags:
    """The candidates' multisets of keys, in two CSR views.

    Candidates are numbered by their position in the tie-break order. The view by
    candidate applies an added item; the view by key finds every candidate that shares
    a key with it. Multiplicities and candidate sizes are stored as indices into their
    few distinct values, so that per-value work is done once per step, not per candidate.
    """

    n_keys: int
    item_ptr: np.ndarray  # candidate c owns item_keys[item_ptr[c]:item_ptr[c + 1]]
    item_keys: np.ndarray
    item_counts: np.ndarray
    key_ptr: np.ndarray  # key k is held by key_cands[key_ptr[k]:key_ptr[k + 1]]
    key_cands: np.ndarray
    key_count_idx: np.ndarray  # multiplicity of that (key, candidate), as index into count_values
    count_values: np.ndarray
    size_values: np.ndarray
    size_idx: np.ndarray  # candidate's total occurrences, as index into size_values


def _bags(flat_ids: np.ndarray, lengths: np.ndarray, position: np.ndarray) -> _Bags:
    n = len(lengths)
    key_values, keys = np.unique(flat_ids, return_inverse=True)
    owners = np.repeat(position, lengths)
    pairs, multiplicity = np.unique(keys.astype(np.int64) * n + owners, return_counts=True)
    pair_keys, pair_cands = np.divmod(pairs, n)
    count_values, count_idx = np.unique(multiplicity, return_inverse=True)
    by_cand = np.argsort(pair_cands, kind="stable")
    size_values, size_idx = np.unique(np.bincount(owners, minlength=n), return_inverse=True)
    return _Bags(
        n_keys=len(key_values),
        item_ptr=_pointers(pair_cands, n),
        item_keys=pair_keys[by_cand].astype(np.intp),
        item_counts=multiplicity[by_cand].astype(np.float64),
        key_ptr=_pointers(pair_keys, len(key_values)),
        key_cands=pair_cands.astype(np.intp),
        key_count_idx=count_idx.astype(np.intp),
        count_values=count_values.astype(np.float64),
        size_values=size_values.astype(np.float64),
        size_idx=size_idx.astype(np.intp),
    )


def _pointers(sorted_groups: np.ndarray, n_groups: int) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(np.bincount(sorted_groups, minlength=n_groups))))


class _Divergence:
    """One Chernoff divergence (atoms or compounds) between the two sides, kept incrementally.

    ``gain[side, c]`` is how much S would grow if candidate c were added to ``side``;
    ``table[side, k, v]`` is the part of it due to key k held with multiplicity
    count_values[v]. Both only change at the keys of an added item.
    """

    def __init__(self, bags: _Bags, alpha: float):
        self.bags = bags
        self.alpha = alpha
        self.exponents = (alpha, 1.0 - alpha)  # of the train and the held-out side
        self.counts = np.zeros((2, bags.n_keys))
        self.totals = np.zeros(2)
        self.terms = np.zeros(bags.n_keys)  # u_k^a w_k^(1-a); S is their sum
        self.table = np.zeros((2, bags.n_keys, len(bags.count_values)))
        self.gain = np.zeros((2, len(bags.size_idx)))
        self._out = np.empty(len(bags.size_idx))

    def if_added(self, side: int) -> np.ndarray:
        """The divergence after adding each candidate (removed ones included) to ``side``.

        Written into a buffer that the next call overwrites: these passes over every
        candidate run each step, and fresh temporaries of that size cost page faults.
        """
        grown = (self.totals[side] + self.bags.size_values) ** self.exponents[side]
        norm = grown * self.totals[1 - side] ** self.exponents[1 - side]
        inverse = np.divide(1.0, norm, out=np.zeros_like(norm), where=norm > 0)
        out = np.add(self.gain[side], self.terms.sum(), out=self._out)
        # Candidates of one size (CompAct's windows) share one normaliser: skip the gather.
        out *= inverse[self.bags.size_idx] if len(inverse) > 1 else inverse[0]
        return np.subtract(1.0, out, out=out)

    def add(self, cand: int, side: int) -> None:
        bags = self.bags
        span = slice(bags.item_ptr[cand], bags.item_ptr[cand + 1])
        keys = bags.item_keys[span]
        self.counts[side, keys] += bags.item_counts[span]
        self.totals[side] += bags.item_counts[span].sum()
        self.terms[keys] = self.counts[TRAIN, keys] ** self.alpha * self.counts[HELDOUT, keys] ** (1 - self.alpha)
        self._refresh_gains(keys)

    def _refresh_gains(self, keys: np.ndarray) -> None:
        a, bags = self.alpha, self.bags
        u = self.counts[TRAIN, keys, None]
        w = self.counts[HELDOUT, keys, None]
        v = bags.count_values
        rows = np.stack([((u + v) ** a - u**a) * w ** (1 - a), u**a * ((w + v) ** (1 - a) - w ** (1 - a))])
        change = rows - self.table[:, keys]
        self.table[:, keys] = rows
        for i, key in enumerate(keys):
            span = slice(bags.key_ptr[key], bags.key_ptr[key + 1])
            cands, count_idx = bags.key_cands[span], bags.key_count_idx[span]
            for side in (TRAIN, HELDOUT):
                # A candidate holds a key at most once, so this fancy-indexed += is exact;
                # one 1-D row at a time is several times faster than gain[:, cands].
                self.gain[side][cands] += change[side, i][count_idx]

    def value(self) -> float:
        return 1.0 - chernoff_coefficient(self.counts[TRAIN], self.counts[HELDOUT], self.alpha)


def mcd_split(
    atoms: Sequence[Sequence[int]],
    compounds: Sequence[Sequence[int]],
    *,
    seed: int,
    max_atom_divergence: float = 0.02,
    target_size: int | None = None,
    min_compound_divergence: float | None = None,
    trace_every: int = 500,
    split_heldout: bool = False,
) -> MCDResult:
    """Greedy MCD split (Algorithm 1 of CompAct); see the module docstring for the conventions.

    ``atoms[i]`` and ``compounds[i]`` are candidate i's occurrences (repeats count).
    The trace holds (n_assigned, D_A, D_C) every ``trace_every`` assignments and at the end,
    train vs the whole held-out side.
    """
    n = _check_pool(atoms, compounds)
    _check_options(seed, max_atom_divergence, target_size, min_compound_divergence, trace_every, n)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    sides = rng.integers(0, 2, size=n)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    atom_bags = _bags(*_flatten("atoms", atoms), position)
    # One atom divergence per held-out part: each keeps its own copy of the train counts.
    atom_divs = [_Divergence(atom_bags, ATOM_ALPHA) for _ in range(2 if split_heldout else 1)]
    compound_div = _Divergence(_bags(*_flatten("compounds", compounds), position), COMPOUND_ALPHA)

    scorer = _Scorer(n, max_atom_divergence)
    chosen: tuple[list[int], list[int]] = ([], [])
    parts: list[int] = []
    trace = []
    for step in range(n if target_size is None else target_size):
        side = int(sides[step])
        if side == TRAIN:  # train touches every part: the larger D_A counts
            d_a = atom_divs[0].if_added(TRAIN)
            for other in atom_divs[1:]:
                np.maximum(d_a, other.if_added(TRAIN), out=d_a)
            part_of: int | np.ndarray = 0  # unused
        else:
            d_a, part_of = _heldout_atom_divergences(atom_divs, parts)
        cand, d_c = scorer.best(d_a, compound_div.if_added(side))
        if min_compound_divergence is not None and d_c < min_compound_divergence:
            break
        scorer.remove(cand)
        part = int(part_of[cand]) if isinstance(part_of, np.ndarray) else part_of
        for div in (atom_divs if side == TRAIN else [atom_divs[part]]):
            div.add(cand, side)
        compound_div.add(cand, side)
        chosen[side].append(int(order[cand]))
        if side == HELDOUT:
            parts.append(part)
        if (step + 1) % trace_every == 0:
            trace.append((step + 1, _heldout_atom_divergence(atom_divs), compound_div.value()))
    n_assigned = len(chosen[TRAIN]) + len(chosen[HELDOUT])
    final = (n_assigned, _heldout_atom_divergence(atom_divs), compound_div.value())
    if n_assigned and (not trace or trace[-1][0] != n_assigned):
        trace.append(final)
    return MCDResult(
        train=np.array(chosen[TRAIN], dtype=np.int64),
        heldout=np.array(chosen[HELDOUT], dtype=np.int64),
        atom_divergence=final[1],
        compound_divergence=final[2],
        trace=tuple(trace),
        heldout_part=np.array(parts, dtype=np.int64),
    )


def _heldout_atom_divergences(atom_divs: list[_Divergence], parts: list[int]) -> tuple[np.ndarray, int | np.ndarray]:
    """Every candidate's D_A if added to the held-out side, and the part it would join.

    With two parts of equal size a candidate may join either: the one where its D_A is
    lower (part 0 on a tie), so the filter admits it if either part does. Otherwise the
    smaller part grows, which keeps the parts within one instance of each other.
    """
    if len(atom_divs) == 1:
        return atom_divs[0].if_added(HELDOUT), 0
    in_test = sum(parts)
    if len(parts) - in_test != in_test:
        smaller = int(len(parts) - in_test > in_test)
        return atom_divs[smaller].if_added(HELDOUT), smaller
    d_a = atom_divs[0].if_added(HELDOUT)
    d_a_test = atom_divs[1].if_added(HELDOUT)
    to_test = (d_a_test < d_a).astype(np.int8)
    return np.minimum(d_a, d_a_test, out=d_a), to_test


def _heldout_atom_divergence(atom_divs: list[_Divergence]) -> float:
    """D_A of train vs the whole held-out side (the sum of the parts' held-out counts)."""
    heldout = sum(div.counts[HELDOUT] for div in atom_divs)
    return 1.0 - chernoff_coefficient(atom_divs[0].counts[TRAIN], heldout, ATOM_ALPHA)


class _Scorer:
    """Algorithm 1, lines 14-21: the highest D_C among the candidates that keep D_A below
    the threshold, else the highest D_C overall; ties as in the module docstring.

    Masks are applied as additive penalties on preallocated arrays because masked
    selection (np.where, copyto(where=)) is several times slower on random masks.
    """

    def __init__(self, n: int, max_atom_divergence: float):
        self.max_atom_divergence = max_atom_divergence
        self.blocked = np.zeros(n)  # +inf once a candidate has been assigned
        self.penalty = np.empty(n)

    def best(self, d_a: np.ndarray, d_c: np.ndarray) -> tuple[int, float]:
        """The candidate to add and the D_C it leads to, from every candidate's D_A and D_C
        after its addition (buffers: both are overwritten)."""
        d_a += self.blocked
        d_c -= self.blocked
        ineligible = d_a >= self.max_atom_divergence
        if not ineligible.all():
            # D_C of a candidate still in the pool lies in [0, 1], so a penalty of 2
            # ranks every eligible candidate above every ineligible one.
            d_c -= np.multiply(ineligible, 2.0, out=self.penalty)
        ties = np.flatnonzero(d_c >= d_c.max() - TIE_TOLERANCE)
        tied_d_a = d_a[ties]
        cand = int(ties[np.argmax(tied_d_a <= tied_d_a.min() + TIE_TOLERANCE)])
        return cand, float(d_c[cand])

    def remove(self, cand: int) -> None:
        self.blocked[cand] = np.inf


def _flatten(name: str, seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    try:
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        flat = np.array(list(itertools.chain.from_iterable(seqs)))
    except TypeError:
        raise UserError(f"mcd_split: {name} must be a sequence of sequences of integer ids") from None
    if flat.ndim != 1 or (flat.size and flat.dtype.kind not in "iu"):
        raise UserError(f"mcd_split: {name} holds ids that are not plain integers; "
                        "expected a sequence of sequences of integer ids")
    return flat.astype(np.int64), lengths


def _check_pool(atoms, compounds) -> int:
    if len(atoms) != len(compounds):
        raise UserError(f"mcd_split: atoms has {len(atoms)} candidates but compounds has {len(compounds)}; "
                        "expected one entry per candidate in both")
    return len(atoms)


def _check_options(seed, max_atom_divergence, target_size, min_compound_divergence, trace_every, n) -> None:
    if not _is_int(seed) or seed < 0:
        raise UserError(f"mcd_split: seed={seed!r}; expected a non-negative integer")
    _check_fraction("max_atom_divergence", max_atom_divergence)
    if min_compound_divergence is not None:
        _check_fraction("min_compound_divergence", min_compound_divergence)
    if target_size is not None and not (_is_int(target_size) and 0 <= target_size <= n):
        raise UserError(f"mcd_split: target_size={target_size!r}; expected None or an integer in [0, {n}] "
                        "(the number of candidates)")
    if not _is_int(trace_every) or trace_every < 1:
        raise UserError(f"mcd_split: trace_every={trace_every!r}; expected a positive integer")


def _check_fraction(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise UserError(f"mcd_split: {name}={value!r}; expected a number in [0, 1]")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
