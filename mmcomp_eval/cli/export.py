"""``mmcomp-eval export lm-eval``: tasks as a folder lm-evaluation-harness runs with ``--include_path``."""

from __future__ import annotations

import argparse
from pathlib import Path

from mmcomp_eval.cli.run import JoinPieces, _limit, _seed


def add_parser(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="write tasks for another harness")
    targets = export.add_subparsers(dest="target", required=True)
    p = targets.add_parser("lm-eval", allow_abbrev=False,
                           help="a folder lm-evaluation-harness 0.4 runs: lm_eval --include_path DIR --tasks ...")
    p.add_argument("--tasks", nargs="+", action=JoinPieces, required=True,
                   help="task or group names (commas or spaces; glob patterns match names)")
    p.add_argument("--output-dir", "--output_dir", type=Path, required=True,
                   help="the folder to write (new, empty, or an earlier export, which is replaced)")
    p.add_argument("--shots", "--num_fewshot", type=int, default=None,
                   help="few-shot examples rendered into each prompt (default: the task's)")
    p.add_argument("--seed", type=_seed, default=0, help="the seed the few-shot examples are drawn with")
    p.add_argument("--limit", type=_limit, default=None,
                   help="the first N documents of each task, or a fraction of them below 1")
    p.add_argument("--split", default=None, help="evaluation split (default: the task's)")
    p.add_argument("--sampler", default=None, help="few-shot sampler: similar, random, first, none")
    p.add_argument("--system-instruction", "--system_instruction", default=None,
                   help="text put before every task's instruction, as `mmcomp-eval run` does")
    p.add_argument("--include-path", "--include_path", type=Path, action="append", default=[],
                   help="extra folder of task YAML files and prompts (repeatable)")
    p.add_argument("--ek100-dir", type=Path, default=None, help="folder with the EK-100 annotation CSVs")
    p.add_argument("--offline", action="store_true", help="never touch the network")
    p.set_defaults(func=cmd_export_lm_eval)


def cmd_export_lm_eval(args: argparse.Namespace) -> int:
    from mmcomp_eval.export.lm_eval import export_lm_eval

    summaries = export_lm_eval(args.tasks, args.output_dir, shots=args.shots, seed=args.seed, limit=args.limit,
                               split=args.split, sampler=args.sampler, system_instruction=args.system_instruction,
                               include_paths=args.include_path, ek100_dir=args.ek100_dir, offline=args.offline)
    for s in summaries:
        skipped = f" (not exported: {', '.join(s.not_exported)})" if s.not_exported else ""
        print(f"{s.name}: {s.n_documents} documents, {s.shots} shots, "
              f"{', '.join(m['name'] for m in s.metrics)}{skipped}")
    print(f"\nrun it: lm_eval --model hf --model_args pretrained=MODEL --include_path {args.output_dir} "
          f"--tasks {','.join(s.name for s in summaries)}")
    return 0
