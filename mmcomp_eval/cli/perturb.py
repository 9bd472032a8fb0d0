"""``mmcomp-eval perturb``: write ICSVR-perturbed caption files for a retrieval dataset.

One JSONL file per perturbation (``<dataset>_<split>_<kind>.jsonl``: caption
id, video id, perturbed and original caption) plus ``summary.json`` (seed,
spaCy pipeline, lexicon, POS role mapping, replacement vocabulary), and a
table of how many captions each perturbation left unchanged: a caption
without a verb has nothing to remove under ``actrem``, and a model's score on
it says nothing about actions, so the count belongs next to any result.

Replacement words (``objrep``, ``actrep``) come from every caption of the
dataset's folder, all splits, so a caption's output is the same whichever
split it is perturbed in.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.config.task_config import default_spacy_model
from mmcomp_eval.data.captions import load_caption_dataset
from mmcomp_eval.errors import UserError
from mmcomp_eval.perturb.kinds import KINDS, UNCHANGED_WHEN
from mmcomp_eval.perturb.lexicon import LEXICON_CHOICES
from mmcomp_eval.perturb.nlp import DEFAULT_SPACY_MODEL
from mmcomp_eval.perturb.suite import perturb_captions, resolve_kinds
from mmcomp_eval.perturb.tokens import DEFAULT_POS_ROLES, POS_ROLES
from mmcomp_eval.perturb.vocab_source import dataset_vocabulary


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("perturb", help="write perturbed caption files (ICSVR objects/actions/syntax perturbations)")
    p.add_argument("--dataset", required=True, help="msrvtt, msvd, didemo, vatex, charades or lsmdc")
    p.add_argument("--split", default="test", help="dataset split (default: test; msrvtt also test_full, val_full, train_full, train_9k, train_7k)")
    p.add_argument("--kind", action="append", required=True, metavar="KIND",
                   help=f"perturbation, repeatable or comma-separated; 'all' for the ten: {', '.join(KINDS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, default=None,
                   help="folder with the dataset's files (default: $MMCOMP_DATA_DIR/<dataset>)")
    p.add_argument("--spacy-model", default=None,
                   help=f"spaCy pipeline for POS tags and lemmas (default: $MMCOMP_SPACY_MODEL, else {DEFAULT_SPACY_MODEL})")
    p.add_argument("--lexicon", choices=LEXICON_CHOICES, default="auto",
                   help="synonym/antonym filter for replacements (auto: WordNet when installed)")
    p.add_argument("--pos-roles", choices=tuple(POS_ROLES), default=DEFAULT_POS_ROLES,
                   help="which parts of speech are objects/attributes/actions: paper (ICSVR 4.3: nouns; adjectives, "
                        "adverbs; verbs) or extended (also proper nouns and numerals)")
    p.set_defaults(func=run_perturb)


def run_perturb(args: argparse.Namespace) -> int:
    kinds = resolve_kinds([k.strip() for arg in args.kind for k in arg.split(",") if k.strip()])
    ds = load_caption_dataset(args.dataset, args.split, args.data_dir)
    run = perturb_captions(ds.captions, kinds, seed=args.seed, keys=ds.caption_ids,
                           spacy_model=args.spacy_model or default_spacy_model(),
                           lexicon=args.lexicon, pos_roles=args.pos_roles,
                           vocabulary=dataset_vocabulary(args.dataset, args.data_dir))
    out = args.output_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--output-dir {out}: cannot create it ({exc.strerror})") from None
    summary = {"dataset": ds.name, "split": ds.split, **run.settings(), "n_videos": len(ds.videos),
               "n_captions": len(ds), "sources": ds.sources, "notes": ds.notes, "perturbations": {}}
    for kind in kinds:
        result = run[kind]
        path = out / f"{ds.name}_{ds.split}_{kind}.jsonl"
        with atomic_files.replacing(path) as f:
            for cid, text, orig, j in zip(ds.caption_ids, result.captions, ds.captions, ds.caption_video):
                f.write(json.dumps({"caption_id": cid, "video_id": ds.videos[j], "caption": text,
                                    "original": orig}, ensure_ascii=False) + "\n")
        summary["perturbations"][kind] = {"file": path.name, "unchanged": result.n_unchanged,
                                          "empty": len(result.empty)}
    atomic_files.write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(format_summary(summary, out))
    return 0


def format_summary(summary: dict, out: Path) -> str:
    n = summary["n_captions"]
    lines = [f"{summary['dataset']} {summary['split']}: {n} captions of {summary['n_videos']} videos, "
             f"seed {summary['seed']}, spaCy {summary['spacy_model']}, POS roles: {summary['pos_roles']}, "
             f"synonym/antonym filter: {summary['lexicon']}",
             f"replacement vocabulary: {summary['vocabulary']['source']}",
             *(f"note: {note}" for note in summary["notes"]), "",
             "| perturbation | unchanged | unchanged % | empty | a caption stays unchanged when |",
             "|---|---|---|---|---|"]
    for kind, r in summary["perturbations"].items():
        lines.append(f"| {kind} | {r['unchanged']} | {100 * r['unchanged'] / max(n, 1):.1f} | {r['empty']} | "
                     f"{UNCHANGED_WHEN[kind]} |")
    lines += ["", f"wrote {len(summary['perturbations'])} caption files and summary.json to {out}"]
    return "\n".join(lines)
