"""``mmcomp-eval data build compact``: build CompAct and print its statistics."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from mmcomp_eval.data.compact_build import HELDOUT_SPLITS, SPLIT_KINDS, BuildParams, build_compact, load_split
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.mrh import mrh_atom_scores

#: CompAct paper, Table 2 (test split): MRH verb EM / CA, noun EM / CA.
PAPER_MRH_TEST = {"verb_em": 2.39, "verb_ca": 9.61, "noun_em": 57.24, "noun_ca": 61.15}
PAPER_SIZES = {"train": 4407, "validation": 2184, "test": 2175}


def add_parser(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="build evaluation datasets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    build = data_sub.add_parser("build", help="build a dataset")
    build.add_argument("dataset", choices=["compact"])
    build.add_argument("--ek100-dir", type=Path, default=None,
                       help="folder with the EK-100 annotation CSVs (default: $MMCOMP_DATA_DIR/ek100, "
                            "else downloaded into the cache)")
    d = BuildParams()
    build.add_argument("--seed", type=int, default=d.seed)
    build.add_argument("--target-size", type=int, default=d.target_size,
                       help="instances the MCD greedy assigns before stopping (paper: 8766)")
    build.add_argument("--max-atom-divergence", type=float, default=d.max_atom_divergence)
    build.add_argument("--min-compound-divergence", type=float, default=d.min_compound_divergence,
                       help="stop the greedy early before D_C would fall below this (default: off)")
    build.add_argument("--compound-scope", choices=["window", "target"], default=d.compound_scope)
    build.add_argument("--heldout-split", choices=list(HELDOUT_SPLITS), default=d.heldout_split,
                       help="validation/test from the held-out side: grown as two sides by the greedy, "
                            "each under the atom threshold (default), or halved at random (the paper)")
    build.add_argument("--output-dir", type=Path, default=None, help="also copy the built splits here")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.add_argument("--offline", action="store_true")
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    params = BuildParams(seed=args.seed, target_size=args.target_size,
                         max_atom_divergence=args.max_atom_divergence,
                         min_compound_divergence=args.min_compound_divergence,
                         compound_scope=args.compound_scope, heldout_split=args.heldout_split)
    result = build_compact(args.ek100_dir, params, offline=args.offline, force=args.force)
    if args.output_dir is not None:
        try:
            shutil.copytree(result.directory, args.output_dir, dirs_exist_ok=True)
        except OSError as exc:  # a file in the way, a read-only place: the build itself is cached
            raise UserError(f"--output-dir {args.output_dir}: cannot copy the splits there "
                            f"({exc.strerror or exc}); give a folder you can write to") from None
    print(format_summary(result))
    return 0


def format_summary(result) -> str:
    s = result.stats
    w = s["windows"]
    how = "cached" if result.cached else f"{s['build_seconds']} s"
    lines = [
        f"CompAct built in {result.directory} ({how})",
        "",
        f"clips read {w['clips_read']}, duplicate narrations dropped {w['duplicate_clips_dropped']}, "
        f"windows considered {w['windows_considered']}, kept {w['windows_kept']}",
        "windows dropped: " + ", ".join(f"{k} {v}" for k, v in w["windows_dropped"].items()),
        "",
        "| split kind | train | validation | test | D_A train-val / train-test | D_C train-val / train-test "
        "| D_A < 0.02 and D_C > 0.6 on both | test targets seen as train targets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in SPLIT_KINDS:
        k = s[kind]
        sz = k["sizes"]
        val, test = k["train_vs_validation"], k["train_vs_test"]
        seen = k["test_target_compounds"]
        lines.append(f"| {kind} | {sz['train']} | {sz['validation']} | {sz['test']} | "
                     f"{val['atom_divergence']:.4f} / {test['atom_divergence']:.4f} | "
                     f"{val['compound_divergence']:.4f} / {test['compound_divergence']:.4f} | "
                     f"{'yes' if k['meets_paper_targets'] else 'no'} | "
                     f"{seen['seen_as_train_target']} ({seen['seen_as_train_target_pct']}%) |")
    lines.append(f"| paper (compositional) | {PAPER_SIZES['train']} | {PAPER_SIZES['validation']} | "
                 f"{PAPER_SIZES['test']} | < 0.02 (train vs held-out) | > 0.6 | yes | 0 (premise) |")
    lines += ["", "MRH baseline (most recent verb / noun of the context), scores x100:", "",
              "| split | verb EM | verb CA | noun EM | noun CA |", "|---|---|---|---|---|"]
    for kind in SPLIT_KINDS:
        for split in ("validation", "test"):
            m = mrh_atom_scores(load_split(result.directory, kind, split))
            lines.append(f"| {kind} {split} | {m['verb_em']:.2f} | {m['verb_ca']:.2f} | "
                         f"{m['noun_em']:.2f} | {m['noun_ca']:.2f} |")
    p = PAPER_MRH_TEST
    lines.append(f"| paper test (Table 2) | {p['verb_em']:.2f} | {p['verb_ca']:.2f} | "
                 f"{p['noun_em']:.2f} | {p['noun_ca']:.2f} |")
    return "\n".join(lines)
