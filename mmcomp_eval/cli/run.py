"""``run`` (the default), ``ls`` and ``validate`` subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mmcomp_eval.tasks.loaders import DataContext
from mmcomp_eval.errors import UserError


def add_parsers(sub: argparse._SubParsersAction) -> None:
    # allow_abbrev=False: --num-processes relaunches the command and must find its own flag verbatim.
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


def _go_offline() -> None:
    """Make every library that could download something refuse to."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "MMCOMP_OFFLINE"):
        os.environ[var] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # read at import time: set it on the module too
        constants.HF_HUB_OFFLINE = True


def _data(args) -> DataContext:
    return DataContext(ek100_dir=args.ek100_dir, offline=_offline(args))


def cmd_run(args: argparse.Namespace) -> int:
    from mmcomp_eval.runtime import parallel
    from mmcomp_eval.evaluation.evaluator import RunOptions, run, with_generation_overrides
    from mmcomp_eval.config.model_args import parse_model_args
    from mmcomp_eval.models import create_model
    from mmcomp_eval.evaluation.report import markdown_table
    from mmcomp_eval.evaluation.results import ResultWriter
    from mmcomp_eval.config.task_config import parse_generation_overrides
    from mmcomp_eval.tasks.index import TaskIndex

    if args.num_processes != 1:
        return _launch(args)
    proc = parallel.current()
    if proc.world_size > 1 and args.no_cache:
        raise UserError("data-parallel runs pass answers through the response store; drop --no-cache")
    if _offline(args):
        _go_offline()
    if args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: expected at least 1")
    gen_kwargs = parse_generation_overrides(parse_model_args(args.gen_kwargs, flag="--gen-kwargs"))
    opts = RunOptions(shots=args.shots, seeds=tuple(range(args.seed, args.seed + args.seeds)), gen_kwargs=gen_kwargs,
                      limit=args.limit, split=args.split, sampler=args.sampler,
                      apply_chat_template=args.apply_chat_template,
                      include_paths=tuple(args.include_path), data=_data(args),
                      progress=not args.no_progress and proc.is_main)
    opts.validate()
    index = TaskIndex.build(tuple(args.include_path))
    names = [n.strip() for n in args.tasks.split(",") if n.strip()]
    if not names:
        raise UserError("--tasks is empty; see `mmcomp-eval ls tasks`")
    tasks = index.resolve(names)
    for task in tasks:  # a bad combination with a task's own settings fails before the model loads
        with_generation_overrides(task, opts.gen_kwargs)
    model_args = _model_args(args, opts.data.offline)
    # The output folder and the response store are claimed before the model loads: a read-only folder, a
    # second run on the same --output-path or a damaged store then costs seconds, not a model load and all
    # the inference before the first write.
    with ResultWriter(args.output_path if proc.is_main else None) as writer:
        store = None if args.no_cache else _open_store(args, check=proc.is_main)
        try:
            model = create_model(args.model, model_args)
            info = {"name": args.model, "args": model_args, "fingerprint": model.fingerprint()}
            if store is not None:
                from mmcomp_eval.runtime.caching_model import CachingModel, cache_identity

                model = CachingModel(model, store, cache_identity(model, model_args))
            record = run(tasks, model, info, opts, index, writer)
        finally:
            if store is not None:
                store.close()
    if record is None:  # a data-parallel helper: process 0 reports
        return 0
    print(markdown_table(record.as_dict()))
    if args.output_path:
        print(f"\nresults: {args.output_path / 'results.json'}  samples: {args.output_path / 'samples.jsonl'}")
    return 0


def _open_store(args, check: bool):
    from mmcomp_eval.paths import cache_dir
    from mmcomp_eval.runtime.response_store import ResponseStore

    return ResponseStore(args.cache_dir or cache_dir() / "responses", check=check)


def _model_args(args, offline: bool) -> dict:
    """--model-args, with --batch-size and offline mode folded in where the adapter takes them."""
    from mmcomp_eval.config.model_args import accepted_arguments, parse_model_args
    from mmcomp_eval.models import MODELS

    margs = parse_model_args(args.model_args)
    if not args.model:
        return margs  # create_model names the problem
    params = accepted_arguments(MODELS.get(MODELS.spec(args.model).adapter))
    if args.batch_size is not None:
        if "batch_size" not in params:
            raise UserError(f"--batch-size: model '{args.model}' takes no batch size")
        margs["batch_size"] = args.batch_size
    if offline and "offline" in params and "offline" not in margs:
        margs["offline"] = True
    return margs


def _launch(args) -> int:
    """--num-processes N: the same command as N data-parallel processes."""
    from mmcomp_eval.runtime import parallel

    if args.num_processes < 1:
        raise UserError(f"--num-processes {args.num_processes}: expected at least 1")
    if parallel.current().world_size > 1:
        raise UserError("--num-processes inside accelerate launch/torchrun: let the launcher start the processes")
    if args.no_cache:
        raise UserError("data-parallel runs pass answers through the response store; drop --no-cache")
    argv, skip = [], False
    for a in args.argv:
        if skip:
            skip = False
        elif a == "--num-processes":
            skip = True
        elif not a.startswith("--num-processes="):
            argv.append(a)
    from mmcomp_eval.evaluation.results import ResultWriter

    # Checked once here, not by N processes each loading a model first; the lock is handed to process 0.
    with ResultWriter(args.output_path) as writer:
        _open_store(args, check=True).close()
        return parallel.launch(argv, args.num_processes, writer.lock)


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
    from mmcomp_eval.config.task_config import GroupConfig, load_task_file
    from mmcomp_eval.tasks.index import find_template

    cfg = load_task_file(args.file)
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
