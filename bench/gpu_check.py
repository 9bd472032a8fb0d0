"""One-shot GPU check: IDEFICS over 64 CompAct-like documents with 5 shots; throughput and peak memory.

    python bench/gpu_check.py                       # CUDA: idefics-9b shapes, random weights, bf16
    python bench/gpu_check.py --pretrained /models/idefics-9b   # a real checkpoint folder instead
    python bench/gpu_check.py --tiny                # anywhere: a tiny random IDEFICS (smoke test of the path)

Everything runs through the harness: synthetic EK-100 media (half of the
videos as JPEG frame folders, half as MP4 files) are written to a temporary
folder, a jsonl task renders CompAct's Fig. 7 prompt (3 keyframes per
example, 5 shots + the query = 18 images per prompt), the evaluator's
``prepare`` makes the keyframes (timed separately) and ``predict`` asks the
model (timed, with peak GPU memory). Random weights make the answers
meaningless and the generation length fixed (no stop string is ever
produced early), which is what a throughput number wants. No network.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

TASK = """
task: gpu_check
dataset: {{name: jsonl, options: {{files: {{test: test.jsonl, train: train.jsonl}}}}}}
target_field: trg_narration
answer_kind: narration
prompt:
  template: compact_idefics.jinja
  instruction: Predict the next narration given 3 sequential previous narrations from a cooking video
fewshot: {{sampler: random, k: {shots}}}
generation: {{max_new_tokens: {max_new_tokens}, stop: ["\\n"]}}
metrics: [exact_match]
media: {{frames_root: {media}, videos_root: {media}, resize: 256}}
"""


def write_inputs(root: Path, n_docs: int, shots: int, max_new_tokens: int, frame_size: tuple[int, int]) -> Path:
    from mmcomp_eval.media import synthetic as S

    videos_test = [f"P{k:02d}_01" for k in range(1, 9)]
    videos_pool = [f"P{k:02d}_01" for k in range(11, 19)]
    test = S.compact_docs(n_docs, videos_test, prefix="t")
    pool = S.compact_docs(max(n_docs, shots + 1), videos_pool, prefix="p")
    frames_needed = 40 * -(-max(len(test), len(pool)) // 8)
    for i, v in enumerate(videos_test + videos_pool):
        if i % 2:
            S.write_video(root / "media", v, frames_needed, video_index=i, size=frame_size)
        else:
            S.write_frames(root / "media", v, frames_needed, video_index=i, size=frame_size)
    tasks = root / "tasks"
    tasks.mkdir()
    S.write_jsonl(tasks / "test.jsonl", test)
    S.write_jsonl(tasks / "train.jsonl", pool)
    (tasks / "gpu_check.yaml").write_text(TASK.format(shots=shots, max_new_tokens=max_new_tokens,
                                                      media=root / "media"))
    return tasks


def build_model(args, cuda: bool):
    from mmcomp_eval.media import synthetic as S
    from mmcomp_eval.models import create_model
    from mmcomp_eval.models.idefics import IdeficsAdapter
    from mmcomp_eval.testing.tiny_models import random_idefics

    if args.pretrained:
        return create_model("idefics", {"pretrained": args.pretrained, "dtype": "bfloat16" if cuda else "float32",
                                        "batch_size": args.batch_size, "local_files_only": True}), args.pretrained
    size = "tiny" if args.tiny else "9b"
    model, processor = random_idefics(S.corpus(), size=size, dtype="bfloat16" if cuda else "float32",
                                      device="cuda" if cuda else "cpu")
    return IdeficsAdapter.from_loaded(model, processor, pretrained=f"random idefics ({size})",
                                      batch_size=args.batch_size), f"random-{size}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny random IDEFICS (runs on CPU too)")
    p.add_argument("--pretrained", default=None, help="a local IDEFICS checkpoint folder instead of random weights")
    p.add_argument("--docs", type=int, default=64)
    p.add_argument("--shots", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    args = p.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("gpu_check: no CUDA device on this machine; run it on a GPU, or pass --tiny for a CPU smoke run",
              file=sys.stderr)
        return 2
    from mmcomp_eval.errors import UserError
    from mmcomp_eval.evaluation.evaluator import predict
    from mmcomp_eval.evaluation.prepare import RunOptions, load_media, prepare
    from mmcomp_eval.media.video import DECODES
    from mmcomp_eval.tasks.index import TaskIndex

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        tmp = Path(tmp)
        import os

        os.environ["MMCOMP_CACHE_DIR"] = str(tmp / "cache")  # cold keyframe cache, nothing left behind
        t0 = time.perf_counter()
        tasks = write_inputs(tmp, args.docs, args.shots, args.max_new_tokens, (456, 256))  # EK-100 frame size
        t_media = time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            model, label = build_model(args, cuda)
        except UserError as exc:
            print(f"gpu_check: {exc}", file=sys.stderr)
            return 2
        t_load = time.perf_counter() - t0
        index = TaskIndex.build((tasks,))
        task = index.resolve(["gpu_check"])[0]
        opts = RunOptions(shots=args.shots, progress=False, include_paths=(tasks,))
        t0 = time.perf_counter()
        prepared = prepare(task, model, opts, index)
        load_media(prepared, progress=False)
        t_prepare = time.perf_counter() - t0
        n_images = sum(len(pr.images) for pr in prepared.prompts[0])
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        raw, _ = predict(prepared, model, 0, progress=False)
        if cuda:
            torch.cuda.synchronize()
        t_predict = time.perf_counter() - t0
        tok = model.processor.tokenizer
        new_tokens = sum(len(tok(r, add_special_tokens=False).input_ids) for r in raw)
        report = {
            "model": label, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "dtype": str(model.model.dtype).removeprefix("torch."),
            "parameters_b": round(sum(x.numel() for x in model.model.parameters()) / 1e9, 3),
            "documents": len(prepared.docs), "shots": prepared.shots, "images_per_prompt": n_images / len(raw),
            "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
            "seconds": {"write_media": round(t_media, 2), "load_model": round(t_load, 2),
                        "keyframes": round(t_prepare, 2), "generate": round(t_predict, 2)},
            "docs_per_s": round(len(raw) / t_predict, 3),
            "new_tokens_per_s": round(new_tokens / t_predict, 1),
            "frames_decoded": DECODES.frames, "keyframes": prepared.media.stats["keyframes"],
            "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "torch": torch.__version__,
        }
    print(f"gpu_check: {report['documents']} docs x {report['images_per_prompt']:.0f} images, {report['model']} "
          f"({report['parameters_b']}B, {report['dtype']}) on {report['device']}: {report['docs_per_s']} docs/s, "
          f"{report['new_tokens_per_s']} new tokens/s, peak GPU memory {report['peak_gpu_memory_gib']} GiB")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
