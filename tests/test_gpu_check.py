"""bench/gpu_check.py's ``--backend vllm`` mode, as far as a machine without a GPU can run it.

The comparison itself (build each backend in turn, answer the same prepared prompts, time, free,
count identical answers) runs here with two ``hf`` configurations in place of hf and vllm; only
building the vllm adapter needs the GPU machine.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["gpu_check"]


def test_vllm_mode_refuses_a_machine_without_gpu_in_one_line(gpu_check, capsys):
    assert gpu_check.main(["--backend", "vllm"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "gpu_check: --backend vllm needs a CUDA GPU and vLLM; this machine lacks a CUDA device"


def test_the_comparison_answers_the_same_prompts_with_each_backend(gpu_check, tmp_path, capsys):
    from transformers import AutoTokenizer

    from mmcomp_eval.evaluation.prepare import ModelPlan, RunOptions, prepare
    from mmcomp_eval.models import create_model
    from mmcomp_eval.models.hf import HFCausalLM
    from mmcomp_eval.tasks.index import TaskIndex

    tasks = gpu_check.write_text_inputs(tmp_path, n_docs=8, shots=2, max_new_tokens=4)
    checkpoint = gpu_check.save_random_llama(tmp_path / "ckpt", "tiny", dtype="float32")
    index = TaskIndex.build((tasks,))
    prepared = prepare(index.resolve(["gpu_check_text"])[0], ModelPlan("hf", HFCausalLM.capabilities),
                       RunOptions(shots=2, progress=False, include_paths=(tasks,)), index)
    assert prepared.prompts[0][0].text.count("=>") == 3  # two shots and the query, LLaMA2 template
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    common = {"pretrained": str(checkpoint), "dtype": "float32", "local_files_only": True}
    builders = [(label, lambda b=b: create_model("hf", {**common, "batch_size": b}), True)
                for label, b in (("hf batch 8", 8), ("hf batch 1", 1))]
    runs = gpu_check.compare_backends(prepared, builders, lambda t: len(tokenizer(t).input_ids), cuda=False)
    assert [r.label for r in runs] == ["hf batch 8", "hf batch 1"]
    assert all(len(r.answers) == 8 and r.generate_s > 0 and r.peak_gpu_memory_gib is None for r in runs)
    assert runs[0].answers == runs[1].answers and any(runs[0].answers)  # hf answers do not depend on the batch
    assert runs[0].new_tokens == sum(len(tokenizer(a).input_ids) for a in runs[0].answers) > 0
    report = gpu_check.print_comparison(runs, 8, {"model": "tiny"})
    out = capsys.readouterr().out
    assert "| backend | load s | generate s | docs/s | new tokens/s | peak GPU GiB |" in out
    assert "identical greedy answers on 8/8 documents" in out
    assert json.loads(out.strip().splitlines()[-1]) == report and report["identical_answers"] == 8
