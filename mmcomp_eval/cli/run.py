"""``run`` (the default), ``ls`` and ``validate`` subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmcomp_eval.tasks.loaders import DataContext
from mmcomp_eval.errors import UserError


def add_parsers(sub: argparse._SubParsersAction) -> None:
    # allow_abbrev=False: a flag is spelt out, so a later flag never changes what an old command means
    run = sub.add_parser("run", help="evaluate a model on tasks (default command)", allow_abbrev=False)
    run.add_argument("--model", required=True, help="adapter or preset name (see `mmcomp-eval ls models`)")
    run.add_argument("--model-args", default=None,
                     help='adapter arguments: key=value pairs separated by commas, values as JSON when they parse '
                          '(quote values holding commas: stop="a,b"), or one JSON object')
    run.add_argument("--tasks", required=True, help="comma-separated task or group names")
    run.add_argument("--shots", type=int, default=None, help="few-shot examples per prompt (default: the task's)")
    run.add_argument("--sampler", default=None, help="few-shot sampler: similar, random, first, none")
    run.add_argument("--gen-kwargs", default=None,
                     help="generation settings overriding every task's generation: section, written like "
                          "--model-args, e.g. do_sample=true,temperature=0.6,top_p=0.9; keys: max_new_tokens, stop, "
                          "do_sample, temperature, top_p, top_k, num_beams, repetition_penalty, no_repeat_ngram_size")
    run.add_argument("--seed", type=int, default=0, help="first seed")
    run.add_argument("--seeds", type=int, default=1,
                     help="number of seeded repeats (mean +- std reported); a seed changes the few-shot draws "
                          "(similar's tie-breaks, random's picks) and, when sampling, every request's sampling seed")
    run.add_argument("--limit", type=int, default=None, help="evaluate the first N documents of each task")
    run.add_argument("--split", default=None, help="evaluation split (default: the task's, usually test)")
    run.add_argument("--apply-chat-template", action="store_true",
                     help="prompt through the tokenizer's chat template, few-shot examples as turns")
    run.add_argument("--output-path", type=Path, default=None, help="folder for results.json and samples.jsonl")
    run.add_argument("--batch-size", default=None,
                     help="requests per forward pass for local models: N, or auto (largest that fits, "
                          "backing off on out-of-memory); overrides --model-args batch_size")
    run.add_argument("--cache-dir", type=Path, default=None,
                     help="folder of the response store that makes runs resumable "
                          "(default: $MMCOMP_CACHE_DIR/responses, else ~/.cache/mmcomp_eval/responses)")
    run.add_argument("--no-cache", action="store_true", help="neither read nor write the response store")
    run.add_argument("--num-processes", type=int, default=1,
                     help="data-parallel processes on this machine, one per GPU (or use accelerate launch)")
    _common(run)
    run.add_argument("--no-progress", action="store_true")
    run.set_defaults(func=cmd_run)

    ls = sub.add_parser("ls", help="list tasks, models or metrics")
    ls.add_argument("what", choices=["tasks", "models", "metrics"])
    ls.add_argument("--include-path", type=Path, action="append", default=[])
    ls.set_defaults(func=cmd_ls)

    validate = sub.add_parser("validate", help="check a task file and render its prompt on one document")
    validate.add_argument("file", type=Path)
    validate.add_argument("--shots", type=int, default=None)
    _common(validate)
    validate.set_defaults(func=cmd_validate)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include-path", type=Path, action="append", default=[],
                   help="extra folder of task YAML files and prompts (repeatable)")
    p.add_argument("--ek100-dir", type=Path, default=None, help="folder with the EK-100 annotation CSVs")
    p.add_argument("--offline", action="store_true", help="never touch the network")


def _offline(args) -> bool:
    """--offline, or the Hugging Face / mmcomp-eval offline variables already set."""
    from mmcomp_eval.paths import is_offline

    return bool(args.offline) or is_offline()


def _data(args) -> DataContext:
    return DataContext(ek100_dir=args.ek100_dir, offline=_offline(args))


def cmd_run(args: argparse.Namespace) -> int:
    """Flags to :func:`mmcomp_eval.evaluate` arguments; the results table on stdout."""
    from mmcomp_eval.evaluation.evaluate import evaluate
    from mmcomp_eval.evaluation.report import markdown_table
    from mmcomp_eval.runtime.parallel import ProcessFailed

    if args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: expected at least 1")
    try:
        results = evaluate(
            args.model, args.tasks, model_args=args.model_args, shots=args.shots,
            seeds=range(args.seed, args.seed + args.seeds), limit=args.limit, split=args.split, sampler=args.sampler,
            gen_kwargs=args.gen_kwargs, apply_chat_template=args.apply_chat_template,
            include_paths=args.include_path, output_path=args.output_path, batch_size=args.batch_size,
            cache_dir=args.cache_dir, no_cache=args.no_cache, num_processes=args.num_processes,
            offline=args.offline, ek100_dir=args.ek100_dir, progress=not args.no_progress)
    except ProcessFailed as exc:  # the failed process has printed its error
        return exc.exit_code
    if results is None:  # a helper process of accelerate launch/torchrun: process 0 reports
        return 0
    print(markdown_table(results))
    if args.output_path:
        print(f"\nresults: {args.output_path / 'results.json'}  samples: {args.output_path / 'samples.jsonl'}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    if args.what == "tasks":
        from mmcomp_eval.tasks.index import TaskIndex

        index = TaskIndex.build(tuple(args.include_path))
        for name, t in sorted(index.tasks.items()):
            print(f"{name:24s} {t.dataset.name}:{t.dataset.options.get('split_kind', '')} "
                  f"{t.eval_split:10s} {t.source}")
        for name, g in sorted(index.groups.items()):
            print(f"{name:24s} group of {', '.join(g.tasks)}")
    elif args.what == "models":
        from mmcomp_eval.models import MODELS

        for name in MODELS:
            print(f"{name:24s} adapter")
        for name, spec in MODELS.presets().items():
            print(f"{name:24s} preset of {spec.adapter}: {dict(spec.defaults)}")
    else:
        from mmcomp_eval.metrics import METRICS

        for name in METRICS:
            doc = (METRICS.get(name).__doc__ or "").strip().splitlines()
            print(f"{name:24s} {doc[0] if doc else ''}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from mmcomp_eval.tasks.loaders import load_documents
    from mmcomp_eval.tasks.fewshot import build_sampler
    from mmcomp_eval.tasks.prompting import PromptTemplate
    from mmcomp_eval.config.task_config import GroupConfig
    from mmcomp_eval.tasks.checks import load_checked
    from mmcomp_eval.tasks.index import find_template

    cfg = load_checked(args.file)
    if isinstance(cfg, GroupConfig):
        print(f"{args.file}: group '{cfg.group}' of {', '.join(cfg.tasks)}: OK")
        return 0
    ctx = _data(args)
    docs = load_documents(cfg, cfg.eval_split, ctx)
    if not docs:
        raise UserError(f"{args.file}: split '{cfg.eval_split}' has no documents")
    k = cfg.fewshot.k if args.shots is None else args.shots
    pool = load_documents(cfg, cfg.fewshot_split, ctx) if k > 0 else []
    picks = build_sampler(cfg.fewshot.sampler, cfg.fewshot.options).select(docs[:1], pool, k, 0)[0]
    template = PromptTemplate(find_template(cfg, tuple(args.include_path)), max_chars=cfg.prompt.max_chars)
    prompt = template.render(docs[0], [pool[i] for i in picks], cfg.prompt.instruction)
    print(f"{args.file}: task '{cfg.task}' OK ({len(docs)} {cfg.eval_split} documents, {k} shots)")
    print("--- prompt for document", docs[0].id, "---")
    print(prompt.text)
    print("--- target:", json.dumps(str(docs[0][cfg.target_field])))
    sys.stdout.flush()
    return 0
