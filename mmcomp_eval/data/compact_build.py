"""Build the CompAct splits (compositional by MCD, and random) with a cache.

The build is a pure function of the input annotation files and the build
parameters, so its output is cached under a key made from both: a second
build with the same inputs is a directory lookup.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mmcomp_eval import paths

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.data import ek100
from mmcomp_eval.data.compact_windows import WindowStats, build_windows, order_and_deduplicate
from mmcomp_eval.data.mcd import atom_divergence, compound_divergence, mcd_split
from mmcomp_eval.data.vocab import CategoryIndex
from mmcomp_eval.errors import UserError

log = logging.getLogger(__name__)

#: Bump when the builder's output for the same inputs changes.
BUILDER_VERSION = 4
SPLITS = ("train", "validation", "test")
SPLIT_KINDS = ("compositional", "random")
#: Atom ids: verbs keep their class id, nouns are shifted past all verbs.
NOUN_OFFSET = 1000
#: The paper's split criteria (section 2.1): D_A < 0.02 and D_C > 0.6 ...
PAPER_MAX_ATOM_DIVERGENCE, PAPER_MIN_COMPOUND_DIVERGENCE = 0.02, 0.6
#: ... judged here on these pairs of splits (the held-out union is reported, not judged).
CHECKED_PAIRS = ("train_vs_validation", "train_vs_test")
HELDOUT_SPLITS = ("greedy", "random")


@dataclass(frozen=True)
class BuildParams:
    """Choices the paper leaves open; see docs/compact.md for the defaults."""

    seed: int = 0
    #: instances assigned by the greedy before it stops (paper: 8,766)
    target_size: int = 8766
    #: a candidate qualifies when D_A after adding it stays below this (paper: 0.02)
    max_atom_divergence: float = 0.02
    #: optionally stop early before D_C would fall below this. Off by default:
    #: with few instances assigned D_C swings widely and would stop the greedy
    #: at once; the paper's D_C > 0.6 is reported as met or not in stats.json.
    min_compound_divergence: float | None = None
    #: which clips' atoms/compounds the divergences count: all 4 ("window") or the target only
    compound_scope: str = "window"
    #: how the held-out side becomes validation and test: "greedy" (the MCD greedy grows
    #: them as two sides, each kept under the atom threshold) or "random" (the paper's
    #: random halving afterwards, which leaves train vs test at D_A 0.0236)
    heldout_split: str = "greedy"

    def validate(self) -> None:
        if self.compound_scope not in ("window", "target"):
            raise UserError(f"--compound-scope {self.compound_scope!r}: expected 'window' or 'target'")
        if self.heldout_split not in HELDOUT_SPLITS:
            raise UserError(f"--heldout-split {self.heldout_split!r}: expected "
                            f"{' or '.join(repr(h) for h in HELDOUT_SPLITS)}")
        if self.target_size < 3:
            raise UserError(f"--target-size {self.target_size}: expected at least 3 instances")


@dataclass(frozen=True)
class BuildResult:
    directory: Path
    stats: dict
    cached: bool


def build_compact(ek100_dir: Path | None = None, params: BuildParams = BuildParams(), *,
                  offline: bool = False, cache_root: Path | None = None, force: bool = False) -> BuildResult:
    params.validate()
    files = ek100.locate(ek100_dir, offline=offline)
    key = _cache_key(files, params)
    root = cache_root or paths.cache_dir() / "compact"
    target = root / key
    if not force and (target / "stats.json").is_file():
        log.info("CompAct splits from the cache: %s", target)
        return BuildResult(target, json.loads((target / "stats.json").read_text()), cached=True)
    log.info("building CompAct from the EK-100 annotations in %s (MCD split, once; cached in %s)",
             files.train.parent, target)
    started = time.perf_counter()
    stats, splits = _build(files, params)
    stats["build_seconds"] = round(time.perf_counter() - started, 3)
    stats["cache_key"] = key
    _write_atomically(target, splits, stats)
    log.info("built CompAct in %.1f s", stats["build_seconds"])
    return BuildResult(target, stats, cached=False)


def load_split(directory: Path, kind: str, split: str) -> list[dict]:
    path = Path(directory) / kind / f"{split}.jsonl"
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _cache_key(files: ek100.EK100Files, params: BuildParams) -> str:
    h = hashlib.sha256()
    for f in files.all():
        h.update(f.name.encode())
        h.update(ek100.cached_sha256(f).encode())
    h.update(json.dumps(asdict(params), sort_keys=True).encode())
    h.update(f"builder={BUILDER_VERSION}".encode())
    return h.hexdigest()[:20]


def _build(files: ek100.EK100Files, params: BuildParams) -> tuple[dict, dict]:
    index = CategoryIndex.from_csv(files.verb_classes, files.noun_classes)
    verb_ids, noun_ids = set(index.verbs), set(index.nouns)
    clips = ek100.read_clips(files.train, verb_ids, noun_ids) + ek100.read_clips(files.validation, verb_ids, noun_ids)
    wstats = WindowStats()
    pool = build_windows(order_and_deduplicate(clips, wstats), index, wstats)
    if len(pool) < params.target_size:
        raise UserError(f"--target-size {params.target_size}: only {len(pool)} windows survive filtering; "
                        "lower --target-size")
    atoms, compounds = _atoms_and_compounds(pool, params.compound_scope)
    mcd = mcd_split(atoms, compounds, seed=params.seed, max_atom_divergence=params.max_atom_divergence,
                    target_size=params.target_size, min_compound_divergence=params.min_compound_divergence,
                    split_heldout=params.heldout_split == "greedy")
    if min(len(mcd.train), len(mcd.heldout)) < 2:
        raise UserError(f"the MCD greedy stopped after {len(mcd.train) + len(mcd.heldout)} instances "
                        f"(D_C {mcd.compound_divergence:.3f}); lower --min-compound-divergence or leave it unset")
    rng = np.random.default_rng(params.seed + 1)
    if params.heldout_split == "greedy":
        validation, test = mcd.heldout[mcd.heldout_part == 0], mcd.heldout[mcd.heldout_part == 1]
    else:
        held = rng.permutation(mcd.heldout)
        validation, test = np.split(held, [(len(held) + 1) // 2])
    compositional = {"train": np.asarray(mcd.train), "validation": validation, "test": test}
    chosen = np.concatenate([compositional[s] for s in SPLITS])
    shuffled = rng.permutation(chosen)
    sizes = [len(compositional[s]) for s in SPLITS]
    random = dict(zip(SPLITS, np.split(shuffled, np.cumsum(sizes)[:-1])))
    splits = {
        "compositional": {s: [pool[i] for i in sorted(compositional[s])] for s in SPLITS},
        "random": {s: [pool[i] for i in sorted(random[s])] for s in SPLITS},
    }
    stats = {
        "paper_targets": {"max_atom_divergence": PAPER_MAX_ATOM_DIVERGENCE,
                          "min_compound_divergence": PAPER_MIN_COMPOUND_DIVERGENCE,
                          "checked_pairs": list(CHECKED_PAIRS)},
        "builder_version": BUILDER_VERSION,
        "params": asdict(params),
        "inputs": {name: str(p) for name, p in zip(("train", "validation", "verb_classes", "noun_classes"), files.all())},
        "windows": wstats.as_dict(),
        "pool_size": len(pool),
        "mcd_trace": [list(t) for t in mcd.trace],
    }
    for kind in SPLIT_KINDS:
        stats[kind] = _split_stats(splits[kind], atoms, compounds, {s: idx for s, idx in
                                   (compositional if kind == "compositional" else random).items()})
    return stats, splits


def _atoms_and_compounds(pool: list[dict], scope: str) -> tuple[list[list[int]], list[list[int]]]:
    sl = slice(None) if scope == "window" else slice(-1, None)
    atoms = [[*r["verb_classes"][sl], *(NOUN_OFFSET + n for n in r["noun_classes"][sl])] for r in pool]
    compounds = [[v * NOUN_OFFSET + n for v, n in zip(r["verb_classes"][sl], r["noun_classes"][sl])] for r in pool]
    return atoms, compounds


def _counts(rows: list[list[int]], idx) -> Counter:
    c: Counter = Counter()
    for i in idx:
        c.update(rows[i])
    return c


def _divergences(atoms, compounds, train_idx, test_idx) -> dict:
    out = {}
    for name, rows, fn in (("atom_divergence", atoms, atom_divergence),
                           ("compound_divergence", compounds, compound_divergence)):
        u, w = _counts(rows, train_idx), _counts(rows, test_idx)
        keys = sorted(set(u) | set(w))
        out[name] = float(fn(np.array([u[k] for k in keys], float), np.array([w[k] for k in keys], float)))
    return out


def _split_stats(split_rows: dict[str, list[dict]], atoms, compounds, split_idx: dict) -> dict:
    train_targets = {(r["trg_verb_class"], r["trg_noun_class"]) for r in split_rows["train"]}
    train_any = {(v, n) for r in split_rows["train"] for v, n in zip(r["verb_classes"], r["noun_classes"])}
    train_atoms_v = {v for r in split_rows["train"] for v in r["verb_classes"]}
    train_atoms_n = {n for r in split_rows["train"] for n in r["noun_classes"]}
    stats: dict = {"sizes": {s: len(split_rows[s]) for s in SPLITS}}
    sides = {"validation": split_idx["validation"], "test": split_idx["test"],
             "heldout": np.concatenate([split_idx["validation"], split_idx["test"]])}
    for name, idx in sides.items():
        div = _divergences(atoms, compounds, split_idx["train"], idx)
        stats[f"train_vs_{name}"] = {
            **{k: round(v, 6) for k, v in div.items()},
            # Judged before rounding: the greedy keeps D_A just under 0.02, which rounds to 0.02.
            "meets_paper_targets": bool(div["atom_divergence"] < PAPER_MAX_ATOM_DIVERGENCE
                                        and div["compound_divergence"] > PAPER_MIN_COMPOUND_DIVERGENCE),
        }
    stats["meets_paper_targets"] = all(stats[pair]["meets_paper_targets"] for pair in CHECKED_PAIRS)
    for s in ("validation", "test"):
        rows = split_rows[s]
        n = max(len(rows), 1)
        seen_target = sum((r["trg_verb_class"], r["trg_noun_class"]) in train_targets for r in rows)
        seen_any = sum((r["trg_verb_class"], r["trg_noun_class"]) in train_any for r in rows)
        atoms_seen = sum(r["trg_verb_class"] in train_atoms_v and r["trg_noun_class"] in train_atoms_n for r in rows)
        stats[f"{s}_target_compounds"] = {
            "seen_as_train_target": seen_target,
            "seen_as_train_target_pct": round(100 * seen_target / n, 2),
            "seen_in_any_train_clip": seen_any,
            "seen_in_any_train_clip_pct": round(100 * seen_any / n, 2),
            "both_atoms_seen_in_train_pct": round(100 * atoms_seen / n, 2),
        }
    return stats


def _write_atomically(target: Path, splits: dict, stats: dict) -> None:
    """Write into a sibling temp dir, then rename: an interrupted build leaves no half cache."""
    with atomic_files.replacing_folder(target) as tmp:
        for kind, per_split in splits.items():
            (tmp / kind).mkdir()
            for split, rows in per_split.items():
                with (tmp / kind / f"{split}.jsonl").open("w", encoding="utf-8") as f:
                    for r in rows:
                        f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
