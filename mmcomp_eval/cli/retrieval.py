"""``retrieval`` (score a model on original and perturbed captions) and ``retrieval-report``."""

from __future__ import annotations

import argparse
from pathlib import Path

from mmcomp_eval.errors import UserError
from mmcomp_eval.perturb.tokens import DEFAULT_POS_ROLES, POS_ROLES


def add_parsers(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("retrieval", help="text-video retrieval under caption perturbations (ICSVR, SAVE)")
    r.add_argument("--model", default="clip", help="retrieval model: clip, fusion, or a preset (default: clip)")
    r.add_argument("--model-args", default=None,
                   help="e.g. pretrained=openai/clip-vit-base-patch32,n_frames=12,frame_sampling=clip4clip,"
                        "max_text_tokens=32,dtype=float16 (fusion, our score-fusion baseline: clap=..., w_video=1, "
                        "w_transcript=0.5, w_audio=0.5, normalise=zscore)")
    r.add_argument("--dataset", required=True, help="msrvtt, msvd, didemo, vatex, charades or lsmdc")
    r.add_argument("--split", default="test", help="test (MSR-VTT: 1k-A), test_full (MSR-VTT: 2,990 videos), val, ...")
    r.add_argument("--data-dir", type=Path, default=None,
                   help="folder with the dataset's caption files (default: $MMCOMP_DATA_DIR/<dataset>)")
    r.add_argument("--perturb", default=None,
                   help="comma-separated perturbation kinds, or all (objattrrem ... rev); default: original only")
    r.add_argument("--seed", type=int, default=0, help="perturbation seed")
    r.add_argument("--spacy-model", default=None, help="spaCy pipeline for perturbations (default: en_core_web_sm)")
    r.add_argument("--lexicon", default="auto", help="synonym/antonym filter for replacements: auto, wordnet, none")
    r.add_argument("--pos-roles", choices=tuple(POS_ROLES), default=DEFAULT_POS_ROLES,
                   help="parts of speech as objects/attributes/actions: paper (ICSVR 4.3) or extended (+ proper "
                        "nouns, numerals)")
    r.add_argument("--videos-dir", type=Path, default=None, help="folder of <video_id>.mp4 (or .avi, .webm, ...)")
    r.add_argument("--features-dir", type=Path, default=None,
                   help="folder of precomputed <video_id>.npy/.npz features (used first where present)")
    r.add_argument("--audio-dir", type=Path, default=None,
                   help="fusion: folder of <video_id>.wav etc. (default: the video file's own audio track)")
    r.add_argument("--transcripts", type=Path, default=None,
                   help="fusion: JSON {video_id: transcript} or JSONL rows {video_id, transcript}")
    r.add_argument("--limit", type=int, default=None, help="only the first N videos (smoke runs; not comparable)")
    r.add_argument("--label", default=None, help="model name in reports (default: model and checkpoint)")
    r.add_argument("--output-path", type=Path, default=None, help="folder for the results JSON and ranks JSONL")
    r.add_argument("--v2t", choices=("best_caption", "all_captions"), default="best_caption",
                   help="video-to-text with several captions per video: best_caption ranks videos' caption sets by "
                        "their best caption (CLIP4Clip, default); all_captions ranks every caption")
    r.add_argument("--block-elements", type=int, default=None,
                   help="similarity scores held at once while ranking (default 16M: 64 MiB)")
    r.set_defaults(func=cmd_retrieval)

    rep = sub.add_parser("retrieval-report", help="ICSVR Table 2 style report and Figures 1-3 from result files")
    rep.add_argument("results", nargs="+", type=Path, help="retrieval result JSON files, or folders holding them")
    rep.add_argument("--output-dir", type=Path, required=True)
    rep.add_argument("--direction", choices=["t2v", "v2t"], default="t2v", help="direction plotted in the figures")
    rep.set_defaults(func=cmd_report)


def _default_label(model: str, model_args: dict) -> str:
    pretrained = model_args.get("pretrained")
    return f"{model} ({Path(str(pretrained)).name})" if pretrained else model


def cmd_retrieval(args: argparse.Namespace) -> int:
    from mmcomp_eval.data.captions import load_caption_dataset
    from mmcomp_eval.config.model_args import parse_model_args
    from mmcomp_eval.perturb import resolve_kinds
    from mmcomp_eval.retrieval import runner
    from mmcomp_eval.retrieval.metrics import DEFAULT_BLOCK_ELEMENTS
    from mmcomp_eval.retrieval.models import create_retrieval_model, dataset_model_args

    if args.block_elements is not None and args.block_elements < 1:
        raise UserError(f"--block-elements {args.block_elements} must be at least 1")
    kinds = resolve_kinds(args.perturb.split(",")) if args.perturb else ()
    model_args = parse_model_args(args.model_args)
    ds = runner.limit_dataset(load_caption_dataset(args.dataset, args.split, args.data_dir), args.limit)
    transcripts = runner.read_transcripts(args.transcripts) if args.transcripts else None
    items = runner.gallery_items(ds.videos, videos_dir=args.videos_dir, features_dir=args.features_dir,
                                 audio_dir=args.audio_dir, transcripts=transcripts)
    # perturb before loading the model: a missing spaCy pipeline should fail in seconds, not after loading weights
    sets, perturb_info = runner.caption_sets(ds, kinds, seed=args.seed, spacy_model=args.spacy_model,
                                             lexicon=args.lexicon, pos_roles=args.pos_roles, data_dir=args.data_dir)
    dataset_args = dataset_model_args(args.model, args.dataset, model_args)
    model = create_retrieval_model(args.model, {**dataset_args, **model_args})
    info = {"name": args.model, "args": model_args, "label": args.label or _default_label(args.model, model_args)}
    config = {"perturb": list(kinds), **perturb_info, "limit": args.limit, "dataset_model_args": dataset_args,
              "videos_dir": str(args.videos_dir) if args.videos_dir else None,
              "features_dir": str(args.features_dir) if args.features_dir else None,
              "n_from_features": sum(1 for it in items if it.features_path is not None),
              "n_with_transcript": sum(1 for it in items if it.transcript),
              "n_with_audio_file": sum(1 for it in items if it.audio_path is not None)}
    run = runner.run_retrieval(model, ds, items, sets, model_info=info, config=config,
                               block_elements=args.block_elements or DEFAULT_BLOCK_ELEMENTS, v2t=args.v2t)
    print(runner.summary_table(run.record))
    if args.output_path is not None:
        path = runner.write_run(run, args.output_path)
        print(f"\nwrote {path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from mmcomp_eval.retrieval import report

    written = report.build_report(args.results, args.output_dir, direction=args.direction)
    for p in written:
        print(f"wrote {p}")
    return 0
