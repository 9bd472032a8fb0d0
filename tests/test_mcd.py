"""Tests of the MCD greedy split, against hand arithmetic and a brute-force reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mmcomp_eval.data.mcd import (
    TIE_TOLERANCE,
    MCDResult,
    atom_divergence,
    chernoff_coefficient,
    compound_divergence,
    mcd_split,
)
from mmcomp_eval.errors import UserError

# ---------------------------------------------------------------- brute-force reference


def _dense(seqs, n_keys):
    counts = np.zeros((len(seqs), n_keys))
    for i, seq in enumerate(seqs):
        np.add.at(counts[i], np.asarray(seq, dtype=np.int64), 1)
    return counts


def _normalise(counts):
    """Rows scaled to sum to 1; an all-zero row (an empty side) stays zero."""
    totals = counts.sum(axis=-1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def _divergence_if_added(counts, train, heldout, side, remaining, alpha):
    """1 - C_alpha(train || held-out) with each remaining candidate added to `side`, from scratch.

    An empty side normalises to zeros, so its coefficient is 0 (the documented convention).
    """
    grown_idx, other_idx = (train, heldout) if side == 0 else (heldout, train)
    grown = _normalise(counts[grown_idx].sum(axis=0) + counts[remaining])  # a row per candidate
    other = _normalise(counts[other_idx].sum(axis=0))
    grown_exponent = alpha if side == 0 else 1 - alpha  # alpha goes with the train side
    return 1.0 - grown**grown_exponent @ other ** (1 - grown_exponent)


def reference_split(atoms, compounds, *, seed, max_atom_divergence=0.02, target_size=None,
                    min_compound_divergence=None, split_heldout=False, with_parts=False):
    """Algorithm 1 written out literally: every candidate re-scored from scratch every step.

    Only the randomness protocol, the tie rules and the stop rule are shared with
    mcd_split (they are its documented contract); all divergence arithmetic is redone.
    Returns (train, heldout) as lists of candidate indices in the order added, and with
    ``with_parts`` the held-out part of each held-out entry. ``split_heldout``: D_A is
    judged against the part an item joins (the larger of both when train grows), D_C
    against the whole held-out side; a held-out item joins the smaller part, or, when
    both are equal, the one where its D_A is lower (part 0 on a tie).
    """
    n = len(atoms)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    sides = rng.integers(0, 2, size=n)
    n_atoms = max((max(a, default=-1) for a in atoms), default=-1) + 1
    n_compounds = max((max(c, default=-1) for c in compounds), default=-1) + 1
    atom_counts = _dense(atoms, n_atoms)
    compound_counts = _dense(compounds, n_compounds)
    split = ([], [])
    parts = ([], [])  # held-out entries by part (all in part 0 unless split_heldout)
    part_of = []
    remaining = list(order)  # in tie-break order
    for step in range(n if target_size is None else target_size):
        side = int(sides[step])
        sizes = [len(p) for p in parts]
        open_parts = [0] if not split_heldout else [0, 1] if sizes[0] == sizes[1] else [int(sizes[1] < sizes[0])]
        part = open_parts[0]
        if step == 0:
            pick = 0  # Algorithm 1, line 10: a random item (first of the random order)
        else:
            by_part = {p: _divergence_if_added(atom_counts, split[0], parts[p], side, remaining, 0.5)
                       for p in ([0, 1] if split_heldout else [0])}
            if side == 0:
                d_a = np.max(list(by_part.values()), axis=0)
            else:
                d_a = np.min([by_part[p] for p in open_parts], axis=0)
            d_c = _divergence_if_added(compound_counts, split[0], split[1], side, remaining, 0.1)
            eligible = d_a < max_atom_divergence
            if not eligible.any():
                eligible[:] = True
            tied = eligible & (d_c >= d_c[eligible].max() - TIE_TOLERANCE)
            tied &= d_a <= d_a[tied].min() + TIE_TOLERANCE
            pick = int(np.flatnonzero(tied)[0])
            if min_compound_divergence is not None and d_c[pick] < min_compound_divergence:
                break
        if step and side == 1 and len(open_parts) == 2:
            part = int(by_part[1][pick] < by_part[0][pick])
        chosen = int(remaining.pop(pick))
        split[side].append(chosen)
        if side == 1:
            parts[part].append(chosen)
            part_of.append(part)
    return (*split, part_of) if with_parts else split


def random_problem(rng, n, n_verbs, n_nouns, clips=4, variable=False):
    """Windows of `clips` (verb, noun) clips; atoms are verbs then nouns offset by n_verbs."""
    atoms, compounds = [], []
    for _ in range(n):
        k = int(rng.integers(0, clips + 1)) if variable else clips  # 0: a candidate with no clips
        verbs = rng.zipf(1.6, size=k) % n_verbs
        nouns = rng.zipf(1.4, size=k) % n_nouns
        atoms.append([int(v) for v in verbs] + [int(n_verbs + x) for x in nouns])
        compounds.append([int(v * n_nouns + x) for v, x in zip(verbs, nouns)])
    return atoms, compounds


# ---------------------------------------------------------------- Chernoff and divergences


def test_chernoff_hand_computed():
    # p = (1, 3) / 4 = (0.25, 0.75); q = (1, 1) / 2 = (0.5, 0.5)
    # C_0.5 = sqrt(0.25 * 0.5) + sqrt(0.75 * 0.5) = 0.353553 + 0.612372 = 0.965926
    assert chernoff_coefficient([1, 3], [1, 1], 0.5) == pytest.approx(math.sqrt(0.125) + math.sqrt(0.375))
    assert chernoff_coefficient([1, 3], [1, 1], 0.5) == pytest.approx(0.9659258, abs=1e-7)
    # C_0.1 = 0.25^0.1 * 0.5^0.9 + 0.75^0.1 * 0.5^0.9
    #       = 0.870551 * 0.535887 + 0.971642 * 0.535887 = 0.466516 + 0.520691 = 0.987207
    assert chernoff_coefficient([1, 3], [1, 1], 0.1) == pytest.approx(0.987207, abs=1e-6)


def test_divergences_hand_computed():
    # u = (2, 2, 0) -> (0.5, 0.5, 0); w = (0, 1, 1) -> (0, 0.5, 0.5): only key 1 is shared.
    # D_A = 1 - sqrt(0.5 * 0.5) = 0.5; D_C = 1 - 0.5^0.1 * 0.5^0.9 = 1 - 0.5 = 0.5
    assert atom_divergence([2, 2, 0], [0, 1, 1]) == pytest.approx(0.5)
    assert compound_divergence([2, 2, 0], [0, 1, 1]) == pytest.approx(0.5)
    # u = (1, 0) -> (1, 0); w = (1, 3) -> (0.25, 0.75): C_0.1 = 1^0.1 * 0.25^0.9 = 0.287175,
    # but swapped (u = (0.25, 0.75), w = (1, 0)): C_0.1 = 0.25^0.1 * 1^0.9 = 0.870551.
    # A held-out compound missing from train costs far more than a train compound
    # missing from held-out: what matters is that held-out compounds occur in train.
    assert compound_divergence([1, 0], [1, 3]) == pytest.approx(1 - 0.25**0.9)
    assert compound_divergence([1, 3], [1, 0]) == pytest.approx(1 - 0.25**0.1)


def test_identical_distributions_have_no_divergence():
    counts = [3, 1, 4, 1, 5]
    assert atom_divergence(counts, counts) == pytest.approx(0.0, abs=1e-12)
    assert compound_divergence(counts, [2 * c for c in counts]) == pytest.approx(0.0, abs=1e-12)


def test_disjoint_and_empty_distributions_diverge_fully():
    assert atom_divergence([1, 2, 0], [0, 0, 7]) == 1.0
    assert compound_divergence([1, 2, 0], [0, 0, 7]) == 1.0
    assert atom_divergence([0, 0], [1, 1]) == 1.0  # empty side: coefficient 0 by convention
    assert compound_divergence([1, 1], [0, 0]) == 1.0


@pytest.mark.parametrize(("p", "q", "alpha"), [([1, 2], [1], 0.5), ([1, 2], [1, 1], 1.5), ([1, -1], [1, 1], 0.5)])
def test_chernoff_rejects_bad_input(p, q, alpha):
    with pytest.raises(UserError):
        chernoff_coefficient(p, q, alpha)


# ---------------------------------------------------------------- the greedy split


def _assert_same_as_reference(atoms, compounds, **options):
    result = mcd_split(atoms, compounds, **options)
    train, heldout = reference_split(atoms, compounds, **options)
    assert result.train.tolist() == train
    assert result.heldout.tolist() == heldout
    assert result.atom_divergence == pytest.approx(atom_divergence(*_side_counts(atoms, train, heldout)))
    expected_d_c = compound_divergence(*_side_counts(compounds, train, heldout))
    assert result.compound_divergence == pytest.approx(expected_d_c)


def _side_counts(seqs, train, heldout):
    n_keys = max(max(s, default=-1) for s in seqs) + 1
    counts = _dense(seqs, n_keys)
    return counts[train].sum(axis=0), counts[heldout].sum(axis=0)


@pytest.mark.parametrize("seed", range(6))
def test_fast_greedy_matches_reference(seed):
    rng = np.random.default_rng(100 + seed)
    atoms, compounds = random_problem(rng, n=60, n_verbs=6, n_nouns=10)
    # At this threshold both branches (some candidates pass the atom filter / none does)
    # occur within most runs, and D_C ties within the tolerance are frequent.
    _assert_same_as_reference(atoms, compounds, seed=seed, max_atom_divergence=0.05)


@pytest.mark.parametrize("seed", range(5))
def test_fast_greedy_with_split_heldout_matches_reference(seed):
    rng = np.random.default_rng(300 + seed)
    atoms, compounds = random_problem(rng, n=60, n_verbs=6, n_nouns=10)
    options = {"seed": seed, "max_atom_divergence": 0.08, "split_heldout": True}
    result = mcd_split(atoms, compounds, **options)
    train, heldout, parts = reference_split(atoms, compounds, with_parts=True, **options)
    assert result.train.tolist() == train and result.heldout.tolist() == heldout
    assert result.heldout_part.tolist() == parts
    sizes = np.cumsum(np.eye(2, dtype=int)[parts], axis=0)  # (validation, test) after each held-out step
    assert np.abs(sizes[:, 0] - sizes[:, 1]).max() == 1
    assert parts != [i % 2 for i in range(len(parts))]  # the part is chosen, not merely alternated
    assert result.atom_divergence == pytest.approx(atom_divergence(*_side_counts(atoms, train, heldout)))
    assert result.compound_divergence == pytest.approx(compound_divergence(*_side_counts(compounds, train, heldout)))
    # and it is a different greedy from the plain one
    assert (result.train.tolist(), result.heldout.tolist()) != tuple(reference_split(
        atoms, compounds, seed=seed, max_atom_divergence=0.08))


def test_split_heldout_keeps_both_parts_under_the_threshold_where_random_halves_do_not():
    atoms, compounds = random_problem(np.random.default_rng(0), n=600, n_verbs=6, n_nouns=12)
    options = {"seed": 0, "max_atom_divergence": 0.02, "target_size": 300}

    def part_divergences(train, parts):
        return [atom_divergence(*_side_counts(atoms, train.tolist(), p.tolist())) for p in parts]

    plain = mcd_split(atoms, compounds, **options)
    assert plain.atom_divergence < 0.02 and not plain.heldout_part.any()
    halves = np.split(np.random.default_rng(1).permutation(plain.heldout), [(len(plain.heldout) + 1) // 2])
    assert max(part_divergences(plain.train, halves)) > 0.025  # 0.0253: one random half misses the target
    split = mcd_split(atoms, compounds, split_heldout=True, **options)
    parts = [split.heldout[split.heldout_part == p] for p in (0, 1)]
    assert [len(p) for p in parts] == [75, 75]
    assert max(part_divergences(split.train, parts)) < 0.02


@pytest.mark.parametrize("seed", range(4))
def test_fast_greedy_matches_reference_with_variable_sizes(seed):
    rng = np.random.default_rng(200 + seed)
    atoms, compounds = random_problem(rng, n=50, n_verbs=5, n_nouns=8, variable=True)
    _assert_same_as_reference(atoms, compounds, seed=seed, max_atom_divergence=0.1)


def test_fast_greedy_matches_reference_at_paper_threshold():
    atoms, compounds = random_problem(np.random.default_rng(7), n=200, n_verbs=4, n_nouns=6)
    _assert_same_as_reference(atoms, compounds, seed=3, max_atom_divergence=0.02, target_size=80)


def test_fast_greedy_matches_reference_with_compound_stop():
    atoms, compounds = random_problem(np.random.default_rng(8), n=80, n_verbs=8, n_nouns=30)
    options = {"seed": 0, "max_atom_divergence": 0.1, "min_compound_divergence": 0.6}
    assert 40 < sum(map(len, reference_split(atoms, compounds, **options))) < 80  # stops mid-run
    _assert_same_as_reference(atoms, compounds, **options)


def test_deterministic_for_a_seed_and_varies_with_it():
    atoms, compounds = random_problem(np.random.default_rng(1), n=200, n_verbs=10, n_nouns=30)
    first = mcd_split(atoms, compounds, seed=5, max_atom_divergence=0.1)
    again = mcd_split(atoms, compounds, seed=5, max_atom_divergence=0.1)
    other = mcd_split(atoms, compounds, seed=6, max_atom_divergence=0.1)
    assert first.train.tolist() == again.train.tolist()
    assert first.heldout.tolist() == again.heldout.tolist()
    assert first.trace == again.trace
    assert first.train.tolist() != other.train.tolist()


def test_split_is_disjoint_and_covers_the_pool():
    atoms, compounds = random_problem(np.random.default_rng(2), n=150, n_verbs=8, n_nouns=25)
    result = mcd_split(atoms, compounds, seed=0)
    assigned = np.concatenate([result.train, result.heldout])
    assert sorted(assigned.tolist()) == list(range(150))
    assert isinstance(result, MCDResult)


def test_target_size_stops_early():
    atoms, compounds = random_problem(np.random.default_rng(3), n=150, n_verbs=8, n_nouns=25)
    result = mcd_split(atoms, compounds, seed=0, target_size=40, trace_every=15)
    assert len(result.train) + len(result.heldout) == 40
    assert len(set(result.train.tolist()) | set(result.heldout.tolist())) == 40
    assert [t[0] for t in result.trace] == [15, 30, 40]  # every 15 steps, plus the end
    assert result.trace[-1][1:] == (result.atom_divergence, result.compound_divergence)


def test_min_compound_divergence_keeps_the_bound():
    atoms, compounds = random_problem(np.random.default_rng(4), n=200, n_verbs=6, n_nouns=15)
    full = mcd_split(atoms, compounds, seed=2, max_atom_divergence=0.1, trace_every=1)
    bound = 0.5
    assert full.compound_divergence < bound  # the whole pool cannot keep compounds apart
    stopped = mcd_split(atoms, compounds, seed=2, max_atom_divergence=0.1, min_compound_divergence=bound)
    n_stopped = len(stopped.train) + len(stopped.heldout)
    assert 50 < n_stopped < 200
    assert stopped.compound_divergence >= bound
    # The stop comes right before the first step that would cross the bound.
    assert full.trace[n_stopped][2] < bound
    # Stopping only truncates the same greedy run.
    assert stopped.train.tolist() == full.train.tolist()[: len(stopped.train)]
    assert stopped.heldout.tolist() == full.heldout.tolist()[: len(stopped.heldout)]


def test_empty_pool_and_zero_target():
    empty = mcd_split([], [], seed=0)
    assert empty.train.size == 0 and empty.heldout.size == 0 and empty.trace == ()
    assert empty.atom_divergence == 1.0 and empty.compound_divergence == 1.0
    none = mcd_split([[0, 1]], [[0]], seed=0, target_size=0)
    assert none.train.size == 0 and none.heldout.size == 0


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"target_size": 11}, "target_size=11"),
        ({"target_size": -1}, "target_size=-1"),
        ({"target_size": 2.5}, "target_size=2.5"),
        ({"max_atom_divergence": 1.5}, "max_atom_divergence=1.5"),
        ({"max_atom_divergence": -0.1}, "max_atom_divergence=-0.1"),
        ({"min_compound_divergence": 2}, "min_compound_divergence=2"),
        ({"min_compound_divergence": float("nan")}, "min_compound_divergence=nan"),
        ({"trace_every": 0}, "trace_every=0"),
        ({"seed": -3}, "seed=-3"),
    ],
)
def test_bad_arguments_raise_user_error(options, names):
    atoms, compounds = random_problem(np.random.default_rng(0), n=10, n_verbs=3, n_nouns=4)
    options = {"seed": 0, **options}
    with pytest.raises(UserError, match=names.replace(".", r"\.")) as error:
        mcd_split(atoms, compounds, **options)
    assert "\n" not in str(error.value)


def test_bad_pools_raise_user_error():
    with pytest.raises(UserError, match="compounds has 1"):
        mcd_split([[0], [1]], [[0]], seed=0)
    with pytest.raises(UserError, match="not plain integers"):
        mcd_split([[0.5]], [[0]], seed=0)
    with pytest.raises(UserError, match="not plain integers"):
        mcd_split([[[0, 1]]], [[0]], seed=0)
    with pytest.raises(UserError, match="sequence of sequences"):
        mcd_split([[0]], [3], seed=0)
