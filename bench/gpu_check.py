"""One-shot GPU check: IDEFICS over 64 CompAct-like documents with 5 shots; throughput and peak memory.

    python bench/gpu_check.py                       # CUDA: idefics-9b shapes, random weights, bf16
    python bench/gpu_check.py --pretrained /models/idefics-9b   # a real checkpoint folder instead
    python bench/gpu_check.py --tiny                # anywhere: a tiny random IDEFICS (smoke test of the path)
    python bench/gpu_check.py --backend vllm        # CUDA + vLLM: hf vs vllm on the same 64 text prompts
    python bench/gpu_check.py --backend vllm --pretrained /models/Llama-2-7b-hf   # a real text checkpoint

Everything runs through the harness: synthetic EK-100 media (half of the
videos as JPEG frame folders, half as MP4 files) are written to a temporary
folder, a jsonl task renders CompAct's Fig. 7 prompt (3 keyframes per
example, 5 shots + the query = 18 images per prompt), the evaluator's
``prepare`` makes the keyframes (timed separately) and ``predict`` asks the
model (timed, with peak GPU memory). Random weights make the answers
meaningless and the generation length fixed (no stop string is ever
produced early), which is what a throughput number wants. No network.

``--backend vllm`` compares the two text backends in one run: the same 64
five-shot CompAct prompts (the LLaMA2 template, prepared once) answered by
the ``hf`` adapter and then by the ``vllm`` adapter, both bf16 and greedy, on
a random-weight Llama with TinyLlama-1.1B's shapes (``--tiny``: a small one;
``--pretrained``: a real folder). It prints load and generation seconds,
documents and new tokens per second for each, the speed-up, and how many of
the 64 greedy answers are identical (vLLM's kernels round differently from
transformers', so a few may differ).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: the task both checks run (a format string: name, template, shots, max_new_tokens, extra lines)
TASK_TEMPLATE = """
task: {name}
dataset: {{name: jsonl, options: {{files: {{test: test.jsonl, train: train.jsonl}}}}}}
target_field: trg_narration
answer_kind: narration
prompt:
  template: {template}
  instruction: Predict the next narration given 3 sequential previous narrations from a cooking video
fewshot: {{sampler: random, k: {shots}}}
generation: {{max_new_tokens: {max_new_tokens}, stop: ["\\n"]}}
metrics: [exact_match]
{extra}"""


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
    media = f"media: {{frames_root: {root / 'media'}, videos_root: {root / 'media'}, resize: 256}}\n"
    (tasks / "gpu_check.yaml").write_text(TASK_TEMPLATE.format(name="gpu_check", template="compact_idefics.jinja",
                                                               shots=shots, max_new_tokens=max_new_tokens,
                                                               extra=media))
    return tasks


def timed_predict(prepared, model, cuda: bool) -> tuple[list[str], float]:
    """Seed 0's answers and their wall seconds; on CUDA the peak-memory counter restarts here."""
    import torch

    from mmcomp_eval.evaluation.evaluator import predict

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    raw, _ = predict(prepared, model, 0, progress=False)
    if cuda:
        torch.cuda.synchronize()
    return list(raw), time.perf_counter() - t0


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
    p.add_argument("--tiny", action="store_true",
                   help="tiny random IDEFICS (runs on CPU too); with --backend vllm a small random Llama")
    p.add_argument("--pretrained", default=None,
                   help="a local checkpoint folder instead of random weights (IDEFICS; a causal LM with --backend vllm)")
    p.add_argument("--docs", type=int, default=64)
    p.add_argument("--shots", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8, help="the hf/idefics adapter's batch size")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--backend", choices=["idefics", "vllm"], default="idefics",
                   help="vllm: compare the hf and vllm text adapters on the same prompts")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.6,
                   help="--backend vllm: vLLM's share of the GPU (the hf model ran before it in this process)")
    args = p.parse_args(argv)
    if args.backend == "vllm":
        return main_vllm(args)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("gpu_check: no CUDA device on this machine; run it on a GPU, or pass --tiny for a CPU smoke run",
              file=sys.stderr)
        return 2
    from mmcomp_eval.errors import UserError
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
        raw, t_predict = timed_predict(prepared, model, cuda)
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


# -- --backend vllm: hf and vllm on the same text prompts ------------------------------------------------------------

#: random-weight Llama shapes: TinyLlama-1.1B's, and a small one (head size 64, which every vLLM attention kernel takes)
LLAMA_SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
}


def write_text_inputs(root: Path, n_docs: int, shots: int, max_new_tokens: int) -> Path:
    """A task folder with ``n_docs`` CompAct-like documents, a shot pool and the LLaMA2 prompt; no media."""
    from mmcomp_eval.media import synthetic as S

    tasks = root / "text_tasks"
    tasks.mkdir()
    S.write_jsonl(tasks / "test.jsonl", S.compact_docs(n_docs, [f"P{k:02d}_01" for k in range(1, 9)], prefix="t"))
    S.write_jsonl(tasks / "train.jsonl", S.compact_docs(max(n_docs, shots + 1), [f"P{k:02d}_01" for k in range(11, 19)],
                                                        prefix="p"))
    (tasks / "gpu_check_text.yaml").write_text(TASK_TEMPLATE.format(
        name="gpu_check_text", template="compact_llama2.jinja", shots=shots, max_new_tokens=max_new_tokens, extra=""))
    return tasks


def save_random_llama(folder: Path, size: str, dtype: str = "bfloat16", device: str = "cpu") -> Path:
    """A random-weight Llama of ``LLAMA_SHAPES[size]`` with a throwaway tokenizer, saved as a folder both backends load."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmcomp_eval.media import synthetic as S
    from mmcomp_eval.testing.tiny_models import random_tokenizer

    tokenizer, _ = random_tokenizer(S.corpus(), vocab_size=2000 if size == "1b" else 400,
                                    pad_to=32000 if size == "1b" else None)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=False, **LLAMA_SHAPES[size])
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # no float32 copy of the weights
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


@dataclass
class BackendRun:
    label: str
    load_s: float
    generate_s: float
    answers: list[str]
    new_tokens: int
    peak_gpu_memory_gib: float | None  # this process's allocations: None for engines that run in their own process

    def row(self, n_docs: int) -> dict:
        return {"backend": self.label, "load_s": round(self.load_s, 2), "generate_s": round(self.generate_s, 2),
                "docs_per_s": round(n_docs / self.generate_s, 2),
                "new_tokens_per_s": round(self.new_tokens / self.generate_s, 1),
                "peak_gpu_memory_gib": self.peak_gpu_memory_gib}


def compare_backends(prepared, builders: Sequence[tuple[str, Callable[[], object], bool]],
                     count_tokens: Callable[[str], int], cuda: bool) -> list[BackendRun]:
    """Build each backend in turn, answer the same prepared prompts (seed 0), time it, and free it.

    ``builders``: (label, build, measured here) -- the last says whether this
    process's peak GPU memory means anything for that backend.
    """
    import torch

    runs = []
    for label, build, measured in builders:
        t0 = time.perf_counter()
        model = build()
        load_s = time.perf_counter() - t0
        raw, generate_s = timed_predict(prepared, model, cuda)
        peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda and measured else None
        runs.append(BackendRun(label, load_s, generate_s, list(raw), sum(count_tokens(r) for r in raw), peak))
        del model, raw
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()  # the next backend gets the memory
    return runs


def agreement(runs: Sequence[BackendRun]) -> int:
    """How many documents got the very same answer from every backend."""
    return sum(len(set(answers)) == 1 for answers in zip(*(r.answers for r in runs)))


def print_comparison(runs: Sequence[BackendRun], n_docs: int, extra: dict) -> dict:
    rows = [r.row(n_docs) for r in runs]
    print("| backend | load s | generate s | docs/s | new tokens/s | peak GPU GiB |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['backend']} | {row['load_s']} | {row['generate_s']} | {row['docs_per_s']} | "
              f"{row['new_tokens_per_s']} | {row['peak_gpu_memory_gib'] if row['peak_gpu_memory_gib'] is not None else '-'} |")
    same = agreement(runs)
    speedup = runs[0].generate_s / runs[-1].generate_s
    print(f"gpu_check: {runs[-1].label} generates {speedup:.2f}x as fast as {runs[0].label}; "
          f"identical greedy answers on {same}/{n_docs} documents")
    report = {**extra, "documents": n_docs, "backends": rows, "speedup": round(speedup, 2), "identical_answers": same}
    print(json.dumps(report))
    return report


def main_vllm(args) -> int:
    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None:
        missing = "a CUDA device" if not torch.cuda.is_available() else "vLLM (pip install 'mmcomp-eval[vllm]')"
        print(f"gpu_check: --backend vllm needs a CUDA GPU and vLLM; this machine lacks {missing}", file=sys.stderr)
        return 2
    import os

    from transformers import AutoTokenizer

    from mmcomp_eval.evaluation.prepare import ModelPlan, RunOptions, prepare
    from mmcomp_eval.models import create_model
    from mmcomp_eval.models.hf import HFCausalLM
    from mmcomp_eval.tasks.index import TaskIndex

    with tempfile.TemporaryDirectory(prefix="gpu_check_vllm_") as tmp:
        tmp = Path(tmp)
        os.environ["MMCOMP_CACHE_DIR"] = str(tmp / "cache")
        tasks = write_text_inputs(tmp, args.docs, args.shots, args.max_new_tokens)
        size = "tiny" if args.tiny else "1b"
        checkpoint = args.pretrained or str(save_random_llama(tmp / "ckpt", size, device="cuda"))
        index = TaskIndex.build((tasks,))
        task = index.resolve(["gpu_check_text"])[0]
        prepared = prepare(task, ModelPlan("hf", HFCausalLM.capabilities),
                           RunOptions(shots=args.shots, progress=False, include_paths=(tasks,)), index)
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        common = {"pretrained": checkpoint, "dtype": "bfloat16", "local_files_only": True}
        builders = [
            ("hf", lambda: create_model("hf", {**common, "batch_size": args.batch_size}), True),
            ("vllm", lambda: create_model("vllm", {**common, "enable_prefix_caching": True,
                                                   "gpu_memory_utilization": args.gpu_memory_utilization}), False),
        ]
        runs = compare_backends(prepared, builders, lambda t: len(tokenizer(t, add_special_tokens=False).input_ids),
                                cuda=True)
    import vllm

    print_comparison(runs, len(prepared.docs), {
        "model": args.pretrained or f"random llama ({size})", "device": torch.cuda.get_device_name(0),
        "shots": args.shots, "max_new_tokens": args.max_new_tokens, "hf_batch_size": args.batch_size,
        "torch": torch.__version__, "vllm": vllm.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
