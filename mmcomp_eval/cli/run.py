"""``run`` (the default), ``ls`` and ``validate`` subcommands.

``run`` also takes lm-evaluation-harness 0.4's spellings of its flags
(``--model_args``, ``--num_fewshot``, ``--output_path``, ...) and its habits
(``--tasks list``, space-separated values, ``--limit 0.1``), so that a
command written for ``lm_eval`` runs here; ``docs/lm_eval.md`` maps each one.
"""

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
    run.add_argument("--model", default=None, help="adapter or preset name (see `mmcomp-eval ls models`)")
    run.add_argument("--model-args", "--model_args", nargs="+", action=JoinPieces, default=None,
                     help='adapter arguments: key=value pairs separated by commas (or spaces, as lm-eval takes them), '
                          'values as JSON when they parse (quote values holding commas: stop="a,b"), or one JSON object')
    run.add_argument("--tasks", nargs="+", action=JoinPieces, default=None,
                     help="task or group names, separated by commas or spaces; glob patterns (compact_*) match "
                          "names; `--tasks list` lists them")
    run.add_argument("--shots", "--num_fewshot", "--num-fewshot", type=int, default=None,
                     help="few-shot examples per prompt (default: the task's)")
    run.add_argument("--sampler", default=None, help="few-shot sampler: similar, random, first, none")
    run.add_argument("--gen-kwargs", "--gen_kwargs", nargs="+", action=JoinPieces, default=None,
                     help="generation settings overriding every task's generation: section, written like "
                          "--model-args, e.g. do_sample=true,temperature=0.6,top_p=0.9; keys: max_new_tokens, stop, "
                          "do_sample, temperature, top_p, top_k, num_beams, repetition_penalty, no_repeat_ngram_size")
    run.add_argument("--seed", type=_seed, default=0, help="first seed (one integer)")
    run.add_argument("--seeds", type=int, default=1,
                     help="number of seeded repeats (mean +- std reported); a seed changes the few-shot draws "
                          "(similar's tie-breaks, random's picks) and, when sampling, every request's sampling seed")
    run.add_argument("--limit", type=_limit, default=None,
                     help="evaluate the first N documents of each task; below 1, that fraction of them "
                          "(rounded up, as lm-eval does)")
    run.add_argument("--split", default=None, help="evaluation split (default: the task's, usually test)")
    run.add_argument("--apply-chat-template", "--apply_chat_template", nargs="?", const=True, default=False,
                     type=_chat_template,
                     help="prompt through the tokenizer's chat template, few-shot examples as turns")
    run.add_argument("--fewshot-as-multiturn", "--fewshot_as_multiturn", nargs="?", const=True, default=None,
                     type=_boolean, metavar="BOOL",
                     help="lm-eval's flag: with --apply-chat-template the few-shot examples are always chat turns "
                          "here, so true is accepted (and needs --apply-chat-template, as in lm-eval) and false "
                          "refused")
    run.add_argument("--system-instruction", "--system_instruction", default=None,
                     help="text put before every task's instruction (a blank line between, as lm-eval joins "
                          "its system instruction and a task's description); with --apply-chat-template both are "
                          "the system turn")
    run.add_argument("--output-path", "--output_path", type=Path, default=None,
                     help="folder for results.json and samples.jsonl (earlier runs kept as results_<time>.json)")
    run.add_argument("--log-samples", "--log_samples", action="store_true",
                     help="accepted for lm-eval's sake and changes nothing: samples.jsonl is always written "
                          "into --output-path")
    run.add_argument("--predict-only", "--predict_only", action="store_true",
                     help="generate and store the answers without scoring them (no metric is built, so no "
                          "scorer model is needed); rerun without it to score the stored answers")
    run.add_argument("--batch-size", "--batch_size", default=None, type=_batch_size,
                     help="requests per forward pass for local models: N, or auto (largest that fits, "
                          "backing off on out-of-memory); overrides --model-args batch_size")
    run.add_argument("--device", default=None,
                     help="where a local model runs (cpu, cuda, cuda:1, mps): the model's device argument, "
                          "overriding --model-args device")
    run.add_argument("--cache-dir", "--use_cache", "--use-cache", dest="cache_dir", type=Path, default=None,
                     help="folder of the response store that makes runs resumable (lm-eval's --use_cache) "
                          "(default: $MMCOMP_CACHE_DIR/responses, else ~/.cache/mmcomp_eval/responses)")
    run.add_argument("--no-cache", action="store_true", help="neither read nor write the response store")
    run.add_argument("--num-processes", type=int, default=1,
                     help="data-parallel processes on this machine, one per GPU (or use accelerate launch)")
    _common(run)
    run.add_argument("--no-progress", action="store_true")
    add_verbosity(run)
    run.set_defaults(func=cmd_run)

    ls = sub.add_parser("ls", help="list tasks, models or metrics")
    ls.add_argument("what", choices=["tasks", "models", "metrics"])
    ls.add_argument("--include-path", "--include_path", type=Path, action="append", default=[])
    ls.set_defaults(func=cmd_ls)

    validate = sub.add_parser("validate", help="check a task file and render its prompt on one document")
    validate.add_argument("file", type=Path)
    validate.add_argument("--shots", type=int, default=None)
    _common(validate)
    validate.set_defaults(func=cmd_validate)


class JoinPieces(argparse.Action):
    """``--tasks a b`` and ``--model_args k=v k2=v2`` (lm-eval's space-separated form) as ``a,b``."""

    def __call__(self, parser, namespace, values, option_string=None):
        pieces = [v for v in values if v.strip()]
        if len(pieces) > 1 and any(p.lstrip().startswith("{") for p in pieces):
            raise UserError(f"{option_string}: a JSON object must be the only value; quote it as one argument")
        setattr(namespace, self.dest, ",".join(pieces))


def add_verbosity(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbosity", type=str.upper, default="INFO", choices=LOG_LEVELS,
                   help="what a run says on stderr: INFO (default) a line per stage, DEBUG more, WARNING only "
                        "problems, ERROR only errors")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid seed {text!r}: one integer (lm-eval's four-seed list python,numpy,torch,fewshot has no "
            "counterpart: a seed here sets the few-shot draws and the sampling seed together)") from None


def _limit(text: str) -> int | float:
    """An integer count, or a fraction below 1 (lm-eval's rule); checked against 0 by RunOptions."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid limit {text!r}: a number of documents, or a fraction below 1") \
            from None
    if 0 < value < 1:
        return value
    if value != int(value):
        raise argparse.ArgumentTypeError(f"invalid limit {text!r}: from 1 up it counts documents and must be "
                                         "whole; below 1 it is a fraction")
    return int(value)


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value {text!r}: true or false")


def _chat_template(text: str) -> bool:
    try:
        return _boolean(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: mmcomp-eval uses the tokenizer's own chat template; named templates are not supported, "
            "give the flag alone") from None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include-path", "--include_path", type=Path, action="append", default=[],
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
    if args.tasks is not None and args.tasks.strip() == "list":  # lm-eval's way of listing tasks
        return list_tasks(args.include_path)
    if not args.model:
        raise UserError("--model is required: an adapter or preset name (see `mmcomp-eval ls models`)")
    if not args.tasks:
        raise UserError("--tasks is required: task or group names (see `mmcomp-eval ls tasks`)")
    if args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: expected at least 1")
    _check_lm_eval_flags(args)
    from mmcomp_eval.evaluation.evaluate import evaluate
    from mmcomp_eval.evaluation.report import markdown_table
    from mmcomp_eval.runtime.parallel import ProcessFailed

    try:
        results = evaluate(
            args.model, args.tasks, model_args=args.model_args, shots=args.shots,
            seeds=range(args.seed, args.seed + args.seeds), limit=args.limit, split=args.split, sampler=args.sampler,
            gen_kwargs=args.gen_kwargs, apply_chat_template=args.apply_chat_template,
            system_instruction=args.system_instruction, include_paths=args.include_path,
            output_path=args.output_path, batch_size=args.batch_size, device=args.device, cache_dir=args.cache_dir,
            no_cache=args.no_cache, num_processes=args.num_processes, offline=args.offline,
            ek100_dir=args.ek100_dir, progress=not args.no_progress, predict_only=args.predict_only)
    except ProcessFailed as exc:  # the failed process has printed its error
        return exc.exit_code
    if results is None:  # a helper process of accelerate launch/torchrun: process 0 reports
        return 0
    print(markdown_table(results))
    if args.output_path:
        print(f"\nresults: {args.output_path / 'results.json'}  samples: {args.output_path / 'samples.jsonl'}")
    return 0


def _check_lm_eval_flags(args: argparse.Namespace) -> None:
    """lm-eval's flags that only constrain others: refused where they would promise what a run does not do."""
    if args.fewshot_as_multiturn is True and not args.apply_chat_template:
        raise UserError("--fewshot_as_multiturn needs --apply-chat-template (as in lm-eval): without a chat "
                        "template there are no turns")
    if args.fewshot_as_multiturn is False and args.apply_chat_template:
        raise UserError("--fewshot_as_multiturn false: mmcomp-eval's chat prompts always give each few-shot "
                        "example its own user/assistant turns; drop the flag")
    if args.log_samples and not args.output_path:
        raise UserError("--log_samples: samples are written into --output-path; add --output-path DIR")
    if args.predict_only and args.no_cache and not args.output_path:
        raise UserError("--predict-only with --no-cache and no --output-path keeps the answers nowhere; "
                        "drop --no-cache or add --output-path")


def _batch_size(text: str) -> int | str:
    """``N`` as a number (results.json records what the model got), ``auto``/``auto:N`` as written."""
    return int(text) if text.isdigit() else text


def list_tasks(include_paths) -> int:
    """Each task with its output type, dataset, split, description and file (last); then the groups."""
    from mmcomp_eval.tasks.index import TaskIndex

    index = TaskIndex.build(tuple(include_paths))
    width = max([22, *map(len, index.tasks), *map(len, index.groups)])
    for name, t in sorted(index.tasks.items()):
        dataset = f"{t.dataset.name}:{t.dataset.options['split_kind']}" if "split_kind" in t.dataset.options \
            else t.dataset.name
        print(f"{name:{width}s} {t.output_type:13s} {dataset:22s} {t.eval_split:10s} {_one_line(t.description)}  "
              f"{t.source}")
    for name, g in sorted(index.groups.items()):
        print(f"{name:{width}s} {'group':13s} {', '.join(g.tasks)}  {_one_line(g.description)}")
    return 0


def _one_line(text: str) -> str:
    return " ".join((text or "").split()) or "(no description)"


def cmd_ls(args: argparse.Namespace) -> int:
    if args.what == "tasks":
        return list_tasks(args.include_path)
    if args.what == "models":
        from mmcomp_eval.models import MODELS

        def kind(adapter: str) -> str:  # retrieval models embed and do not generate
            caps = MODELS.get(adapter).capabilities
            return "retrieval " if caps.embeddings and not caps.generate else ""

        for name in MODELS:
            print(f"{name:26s} {kind(name)}adapter: {_docline(MODELS.get(name))}")
        for name, spec in MODELS.presets().items():
            args_text = ",".join(f"{k}={v}" for k, v in spec.defaults.items())
            print(f"{name:26s} {kind(spec.adapter)}preset of {spec.adapter}: {_one_line(spec.description)} "
                  f"({args_text})")
    else:
        from mmcomp_eval.metrics import METRICS

        for name in METRICS:
            print(f"{name:24s} {_docline(METRICS.get(name))}")
    return 0


def _docline(obj) -> str:
    doc = (obj.__doc__ or "").strip().splitlines()
    return doc[0] if doc else "(no description)"


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
    if cfg.prompt is None:  # a retrieval task ranks its captions against a gallery: no prompt to render
        videos = len({str(d[cfg.target_field]) for d in docs})
        print(f"{args.file}: task '{cfg.task}' OK ({cfg.output_type}: {len(docs)} {cfg.eval_split} captions "
              f"of {videos} videos; the gallery's media are checked when it runs)")
        return 0
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
