"""``retrieval`` and ``retrieval-report``: the old retrieval commands, now spellings of ``run`` and ``compare``.

``mmcomp-eval retrieval --dataset D --perturb K ...`` runs the built-in
retrieval task of ``D`` and its perturbed variants (``icsvr_<d>_<kind>``
where ICSVR defines them, else ``<task>_<kind>``) through
:func:`mmcomp_eval.evaluate`, with the command's folders and options written
into the task configs; results are the ordinary ``results.json`` and
``samples.jsonl``. ``retrieval-report RUNS --output-dir DIR`` writes what
``compare`` prints as ``DIR/report.md`` and ICSVR's figures next to it.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from mmcomp_eval.errors import UserError
from mmcomp_eval.perturb.tokens import DEFAULT_POS_ROLES, POS_ROLES

#: ``--dataset`` (and ``--split``) -> the built-in task it means; ICSVR's short name for its perturbed tasks
BASE_TASKS = {("msrvtt", "test"): "msrvtt_1ka_retrieval", ("msrvtt", "test_1ka"): "msrvtt_1ka_retrieval",
              ("msrvtt", "test_full"): "msrvtt_full_retrieval", ("msrvtt", "full"): "msrvtt_full_retrieval"}
ICSVR_NAMES = {"msrvtt_1ka_retrieval": "msrvtt", "msvd_retrieval": "msvd", "didemo_retrieval": "didemo"}
#: model arguments of the old command that are task settings now (``retrieval:`` section)
TASK_SETTINGS = ("n_frames", "frame_sampling", "max_text_tokens")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("retrieval", help="text-video retrieval under caption perturbations (a spelling of `run` "
                                         "with the built-in retrieval tasks)")
    r.add_argument("--model", default="clip", help="clip, fusion, or a preset such as clip-b32 (default: clip)")
    r.add_argument("--model-args", default=None,
                   help="e.g. pretrained=openai/clip-vit-base-patch32,dtype=float16 (n_frames, frame_sampling and "
                        "max_text_tokens are moved into the tasks)")
    r.add_argument("--dataset", required=True, help="msrvtt, msvd, didemo, vatex, charades or lsmdc")
    r.add_argument("--split", default="test", help="test (MSR-VTT: 1k-A), test_full (MSR-VTT: 2,990 videos), val, ...")
    r.add_argument("--data-dir", type=Path, default=None, help="the dataset's caption files (default: "
                                                               "$MMCOMP_DATA_DIR/<dataset>)")
    r.add_argument("--perturb", default=None, help="comma-separated perturbation kinds, or all; default: original only")
    r.add_argument("--seed", type=int, default=0, help="first seed (selects the perturbations' random draws)")
    r.add_argument("--seeds", type=int, default=1, help="number of seeds")
    r.add_argument("--spacy-model", default=None, help="spaCy pipeline for perturbations (default: $MMCOMP_SPACY_MODEL, else en_core_web_sm)")
    r.add_argument("--pos-roles", choices=tuple(POS_ROLES), default=DEFAULT_POS_ROLES,
                   help="parts of speech as objects/attributes/actions: paper (ICSVR 4.3) or extended")
    r.add_argument("--videos-dir", type=Path, default=None, help="folder of <video_id>.mp4 (or .avi, .webm, ...)")
    r.add_argument("--features-dir", type=Path, default=None, help="folder of precomputed <video_id>.npy/.npz")
    r.add_argument("--audio-dir", type=Path, default=None, help="fusion: folder of <video_id>.wav etc.")
    r.add_argument("--transcripts", type=Path, default=None, help="fusion: JSON {video_id: text} or JSONL rows")
    r.add_argument("--v2t", choices=("best_caption", "all_captions"), default=None,
                   help="video-to-text with several captions per video (default: the task's, best_caption)")
    r.add_argument("--limit", type=int, default=None, help="only the first N videos (smoke runs; not comparable)")
    r.add_argument("--output-path", type=Path, default=None, help="folder for results.json and samples.jsonl")
    r.add_argument("--cache-dir", type=Path, default=None, help="response store folder (embeddings are kept there)")
    r.add_argument("--no-cache", action="store_true", help="neither read nor write the response store")
    r.add_argument("--num-processes", type=int, default=1, help="data-parallel processes sharing the encoding")
    r.add_argument("--offline", action="store_true", help="never touch the network")
    r.set_defaults(func=cmd_retrieval)

    rep = sub.add_parser("retrieval-report", help="ICSVR tables and figures, SAVE's SumR and mR1, from run folders "
                                                  "(what `compare` prints, written to a folder)")
    rep.add_argument("results", nargs="+", type=Path, help="run folders (--output-path) or their results.json")
    rep.add_argument("--output-dir", type=Path, required=True)
    rep.add_argument("--labels", default=None, help="comma-separated names for the runs (default: folder names)")
    rep.add_argument("--direction", choices=["t2v", "v2t"], default="t2v", help="direction plotted in the figures")
    rep.set_defaults(func=cmd_report)


def retrieval_tasks(args: argparse.Namespace, task_args: dict) -> list:
    """The built-in task of ``--dataset``/``--split`` and its perturbed variants, with the command's settings."""
    from mmcomp_eval.config.task_config import PerturbationConfig
    from mmcomp_eval.perturb import resolve_kinds
    from mmcomp_eval.tasks.index import TaskIndex

    index = TaskIndex.build()
    name = BASE_TASKS.get((args.dataset, args.split), f"{args.dataset}_retrieval")
    if name not in index.tasks:
        known = sorted({d for d, _ in BASE_TASKS} | {t.dataset.name for t in index.tasks.values()
                                                     if t.output_type == "retrieval"})
        raise UserError(f"--dataset {args.dataset}: no built-in retrieval task; known: {', '.join(known)}")
    base = index.tasks[name]
    folders = {"videos_dir": args.videos_dir, "features_dir": args.features_dir, "audio_dir": args.audio_dir,
               "transcripts": args.transcripts}
    if args.videos_dir is None and args.features_dir is None:
        raise UserError("give --videos-dir (video files) or --features-dir (precomputed .npy/.npz per video)")
    settings = replace(base.retrieval, **{k: None if v is None else str(v.resolve()) for k, v in folders.items()},
                       **task_args, **({"v2t": args.v2t} if args.v2t else {}))
    dataset = base.dataset if args.data_dir is None else \
        replace(base.dataset, options={**base.dataset.options, "data_dir": str(args.data_dir.resolve())})
    base = replace(base, retrieval=settings, dataset=dataset, eval_split=args.split)
    tasks = [base]
    for kind in resolve_kinds(args.perturb.split(",")) if args.perturb else ():
        short = ICSVR_NAMES.get(name)
        perturbation = PerturbationConfig(kind, settings.text_field, pos_roles=args.pos_roles,
                                          **({"spacy_model": args.spacy_model} if args.spacy_model else {}))
        tasks.append(replace(base, task=f"icsvr_{short}_{kind}" if short else f"{name}_{kind}",
                             perturbation=perturbation))
    return tasks


def cmd_retrieval(args: argparse.Namespace) -> int:
    from mmcomp_eval.config.model_args import parse_model_args
    from mmcomp_eval.evaluation.compare import load_runs, retrieval_report
    from mmcomp_eval.evaluation.evaluate import evaluate
    from mmcomp_eval.evaluation.report import markdown_table
    from mmcomp_eval.runtime.parallel import ProcessFailed

    model_args = parse_model_args(args.model_args)
    task_args = {k: model_args.pop(k) for k in TASK_SETTINGS if k in model_args}
    if args.num_processes > 1:
        raise UserError("--num-processes starts processes that find tasks by name; run "
                        "`mmcomp-eval run --tasks ... --num-processes N` with task files of your own")
    try:
        results = evaluate(args.model, retrieval_tasks(args, task_args), model_args=model_args,
                           seeds=range(args.seed, args.seed + args.seeds), limit=args.limit,
                           output_path=args.output_path, cache_dir=args.cache_dir, no_cache=args.no_cache,
                           offline=args.offline)
    except ProcessFailed as exc:
        return exc.exit_code
    if results is None:
        return 0
    print(markdown_table(results))
    if args.output_path:
        print("\n" + retrieval_report(load_runs([args.output_path])), end="")
        print(f"\nresults: {args.output_path / 'results.json'}  samples: {args.output_path / 'samples.jsonl'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from mmcomp_eval.evaluation import compare
    from mmcomp_eval.retrieval import report
    from mmcomp_eval.runtime import atomic_files

    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    runs = compare.load_runs(args.results, labels)
    text = compare.retrieval_report(runs)
    if not text:
        raise UserError("none of these runs has a retrieval task (output_type: retrieval)")
    atomic_files.make_folder(args.output_dir, "--output-dir")
    written = report.figures([(r.label, r.results) for r in runs], args.output_dir, args.direction)
    figures = "".join(f"![{p.stem}]({p.name})\n\n" for p in written)
    target = args.output_dir / "report.md"
    atomic_files.write_text(target, "# Retrieval report\n\n" + text + "\n" + figures)
    for p in [target, *written]:
        print(f"wrote {p}")
    return 0
