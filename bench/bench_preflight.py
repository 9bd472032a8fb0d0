"""How long a run with a bad input takes to fail, against the model load it no longer waits for.

    python bench/bench_preflight.py [--no-load]

Each case calls ``mmcomp_eval.evaluate`` with one bad input on a small
JSONL task (``--model smollm2-135m``; the image case ``idefics-9b``, whose
weights need not even be present) and times it until the one-line
``UserError``. Before ``evaluate`` checked everything first, a bad
``--split`` or ``--sampler`` failed only after the model was built; the last
row times that build (the GGUF model, once loaded, comes from its cache).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

TASK = """
task: echo_task
dataset: {name: jsonl, options: {files: {test: docs.jsonl, train: docs.jsonl}}}
target_field: answer
prompt: {template: echo.jinja}
fewshot: {sampler: first, k: 2}
metrics: [exact_match, bleu]
"""
TEMPLATE = "{% for s in shots %}word: {{ s.word }} => {{ s.answer }}\n{% endfor %}word: {{ doc.word }} =>"
IMAGE_TASK = """
task: image_task
dataset: {name: jsonl, options: {files: {test: frames.jsonl, train: frames.jsonl}}}
target_field: trg_narration
prompt: {template: compact_idefics.jinja}
fewshot: {sampler: first, k: 2}
metrics: [exact_match]
media: {frames_root: /nonexistent/frames}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-load", action="store_true", help="skip timing the model load")
    args = p.parse_args()
    from mmcomp_eval import evaluate
    from mmcomp_eval.errors import UserError
    from mmcomp_eval.media import synthetic

    with tempfile.TemporaryDirectory(prefix="bench_preflight_") as tmp:
        d, bad_metric = Path(tmp) / "tasks", Path(tmp) / "bad_metric"
        for folder, metrics in ((d, "[exact_match, bleu]"), (bad_metric, "[{name: bleu, options: {max_m: 4}}]")):
            folder.mkdir()
            (folder / "echo_task.yaml").write_text(TASK.replace("[exact_match, bleu]", metrics))
            (folder / "echo.jinja").write_text(TEMPLATE)
            (folder / "docs.jsonl").write_text("".join(json.dumps({"id": str(i), "word": w, "answer": w}) + "\n"
                                                       for i, w in enumerate(["knife", "plate", "onion", "pan"])))
        (d / "image_task.yaml").write_text(IMAGE_TASK)
        synthetic.write_jsonl(d / "frames.jsonl", synthetic.compact_docs(4, ["P01_01"]))
        common = {"include_paths": [d], "no_cache": True, "progress": False, "offline": True}
        cases = [
            ("--split validaton", "smollm2-135m", "echo_task", {"split": "validaton"}),
            ("--sampler simlar", "smollm2-135m", "echo_task", {"sampler": "simlar"}),
            ("--gen-kwargs temperature=0.5 (no do_sample)", "smollm2-135m", "echo_task",
             {"gen_kwargs": "temperature=0.5"}),
            ("metric option max_m", "smollm2-135m", "echo_task", {"include_paths": [bad_metric]}),
            ("media folder missing", "idefics-9b", "image_task", {}),
        ]
        print("| bad input | seconds to the error | error |")
        print("|---|---|---|")
        for label, model, task, kwargs in cases:
            run_kwargs = {**common, **kwargs}
            t0 = time.perf_counter()
            try:
                evaluate(model, task, **run_kwargs)
                message = "no error (unexpected)"
            except UserError as exc:
                message = str(exc)
            print(f"| {label} | {time.perf_counter() - t0:.3f} | {message[:90]} |")
        if not args.no_load:
            from mmcomp_eval.models import create_model

            t0 = time.perf_counter()
            create_model("smollm2-135m", {"offline": True})
            print(f"| (the smollm2-135m model build a bad input used to wait for) | {time.perf_counter() - t0:.3f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
