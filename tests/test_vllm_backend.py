"""The vLLM adapters on a machine without vLLM or a GPU (like every machine these tests run on).

What can be checked here is checked for real: the one-line errors before any task is prepared,
the argument and decoding mappings, the prompt token ids against the ``hf`` adapter's, the image
placement, and the adapter's own loop (calls of ``batch_size`` requests, answers reported per
call, stop strings, resume through the store) driven by a stand-in engine that follows
``vllm.LLM.generate``'s contract with transformers doing the decoding. What cannot (vLLM's own
engine, ``VLLMEngine`` and ``build_engine``) runs in ``bench/gpu_check.py --backend vllm``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json

import pytest

from mmcomp_eval.api.request import ChatMessage, GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import create_model
from mmcomp_eval.models.vllm_backend import VLLMCausalLM, VLLMOptions, VLLMVisionLM, VLLMVisionOptions, gpu_slice
from mmcomp_eval.models.vllm_requests import (NO_TOP_K, SEED_MASK, content_parts, sampling_kwargs, token_prompt,
                                              unsupported, with_image_tokens)

from user_task import WORDS, make_user_tasks, run_cli


class TransformersEngine:
    """A stand-in for ``vllm.LLM`` (which needs a GPU): token-id prompts and SamplingParams fields in, one text per
    prompt out, greedy decoding done by the ``hf`` adapter's model. Records the size of every call."""

    def __init__(self, hf):
        self.hf = hf
        self.tokenizer = hf.tokenizer
        self.max_model_len = hf.max_length
        self.calls: list[int] = []
        self.prompts: list[dict] = []

    def generate(self, prompts, params):
        self.calls.append(len(prompts))
        self.prompts += prompts
        out = []
        for prompt, p in zip(prompts, params):
            assert p["temperature"] == 0.0 and p["n"] == 1 and p["skip_special_tokens"]
            settings = GenerationSettings(max_new_tokens=p["max_tokens"], stop=tuple(p["stop"]),
                                          repetition_penalty=p["repetition_penalty"])
            request = GenerationRequest("r", "", settings)
            out.append(self.hf._generate_batch([prompt["prompt_token_ids"]], settings, [request], None)[0])
        return out

    def describe(self):
        return {"engine": "transformers stand-in"}

    def placeholder(self, index):
        return f"<img{index}>"


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    return create_model("hf", f"pretrained={tiny_llama_dir},batch_size=1,max_length=64")


# -- before anything runs ------------------------------------------------------------------------------------------


def _tasks_without_documents(tmp_path):
    tasks = make_user_tasks(tmp_path)
    (tasks / "docs.jsonl").unlink()  # a run that got as far as preparing the task would fail on this instead
    return tasks


@pytest.mark.parametrize("model", ["vllm", "vllm-vlm"])
def test_without_vllm_a_run_stops_in_one_line_before_any_task_is_prepared(tmp_path, capsys, model):
    assert importlib.util.find_spec("vllm") is None  # these machines have no vLLM
    tasks = _tasks_without_documents(tmp_path)
    rc, _, err = run_cli(capsys, "--model", model, "--model-args", "pretrained=org/some-model", "--tasks",
                         "echo_task", "--include-path", str(tasks), "--no-cache")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"model '{model}' needs vLLM, which is not installed: pip install 'mmcomp-eval[vllm]'" in err


def test_with_vllm_but_no_gpu_the_run_stops_in_one_line(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: importlib.machinery.ModuleSpec("vllm", None)
                        if name == "vllm" else real(name, *a))  # as if vLLM were installed; the GPU check is real
    tasks = _tasks_without_documents(tmp_path)
    rc, _, err = run_cli(capsys, "--model", "vllm", "--model-args", "pretrained=org/some-model", "--tasks",
                         "echo_task", "--include-path", str(tasks), "--no-cache")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "runs vLLM, which needs a CUDA GPU, and none is visible" in err and "use --model hf" in err


@pytest.mark.parametrize("args, fragment", [
    ("pretrained=m,dtype=float8", "dtype='float8' is not one of auto, float16, bfloat16, float32"),
    ("pretrained=m,data_parallel_size=4", "use --num-processes 4"),
    ("pretrained=m,max_length=2048,max_model_len=4096", "max_model_len and max_length are the same setting"),
    ("pretrained=m,gpu_memory_utilization=1.5", "gpu_memory_utilization=1.5 must be in (0, 1]"),
    ("pretrained=m,tensor_parallel=2", "(did you mean 'tensor_parallel_size'?)"),
    ("pretrained=m,batch_size=0", "batch size 0"),
    ("dtype=bfloat16", "needs --model-args pretrained="),
])
def test_bad_arguments_are_one_line_whatever_the_machine(tmp_path, capsys, args, fragment):
    tasks = make_user_tasks(tmp_path)
    rc, _, err = run_cli(capsys, "--model", "vllm", "--model-args", args, "--tasks", "echo_task",
                         "--include-path", str(tasks), "--no-cache")
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1


# -- the mappings ----------------------------------------------------------------------------------------------------


def test_engine_arguments_pass_through_what_is_set():
    options = VLLMOptions(dtype="bfloat16", tensor_parallel_size=2, gpu_memory_utilization=0.8, max_length=4096,
                          enable_prefix_caching=True, quantization="awq")
    assert options.engine_kwargs("/ckpt/llama") == {
        "model": "/ckpt/llama", "tokenizer": "/ckpt/llama", "revision": None, "dtype": "bfloat16",
        "trust_remote_code": False, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.8, "enforce_eager": False,
        "seed": 0, "quantization": "awq", "max_model_len": 4096, "enable_prefix_caching": True}
    defaults = VLLMOptions().engine_kwargs("m")
    assert "enable_prefix_caching" not in defaults and "max_model_len" not in defaults  # vLLM's own defaults
    assert VLLMVisionOptions(max_images=18).engine_kwargs("m")["limit_mm_per_prompt"] == {"image": 18}
    assert "limit_mm_per_prompt" not in VLLMVisionOptions().engine_kwargs("m")


def test_generation_settings_map_to_sampling_params():
    greedy = GenerationRequest("a", "p", GenerationSettings(max_new_tokens=8, stop=("\n", ".")))
    assert sampling_kwargs(greedy) == {"n": 1, "max_tokens": 8, "stop": ["\n", "."], "repetition_penalty": 1.0,
                                       "skip_special_tokens": True, "include_stop_str_in_output": False,
                                       "temperature": 0.0}
    sampled = GenerationRequest("a", "p", GenerationSettings(do_sample=True, temperature=0.6, top_p=0.9, seed=2,
                                                             repetition_penalty=1.1))
    kwargs = sampling_kwargs(sampled)
    assert {k: kwargs[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")} == {
        "temperature": 0.6, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1}
    assert kwargs["seed"] == sampled.sampling_seed() & SEED_MASK  # the local adapters' per-request seed
    other_seed = GenerationRequest("a", "p", GenerationSettings(do_sample=True, temperature=0.6, top_p=0.9, seed=3))
    assert sampling_kwargs(other_seed)["seed"] != kwargs["seed"]
    no_limit = GenerationRequest("a", "p", GenerationSettings(do_sample=True, top_k=0))
    assert sampling_kwargs(no_limit)["top_k"] == NO_TOP_K
    assert unsupported(GenerationSettings(num_beams=3)).startswith("num_beams=3")
    assert unsupported(GenerationSettings(no_repeat_ngram_size=3)).startswith("no_repeat_ngram_size=3")
    assert unsupported(GenerationSettings(do_sample=True, temperature=2.5)).startswith("temperature=2.5")
    assert unsupported(GenerationSettings(do_sample=True, temperature=0.6, repetition_penalty=1.3)) is None


def test_prompt_token_ids_are_the_hf_adapters(hf):
    settings = GenerationSettings(max_new_tokens=16)
    short = GenerationRequest("a", "Repeat the word.\nword: knife =>", settings)
    long = GenerationRequest("b", " ".join(["word: onion => onion"] * 30) + "\nword: pan =>", settings)
    chat = GenerationRequest("c", "", settings, messages=(ChatMessage("system", "Repeat the word."),
                                                          ChatMessage("user", "word: plate"),
                                                          ChatMessage("assistant", "plate"),
                                                          ChatMessage("user", "word: knife")))
    budget = hf.prompt_budget(settings)
    assert budget == 48
    for request in (short, long, chat):
        hf_ids = hf._encode(request).value
        expected = hf_ids[-budget:]  # hf cuts a long prompt from the left to the same budget
        assert token_prompt(hf.tokenizer, request, budget, "m") == expected
    assert len(hf._encode(long).value) > budget  # the long one was cut
    assert token_prompt(hf.tokenizer, chat, budget, "m")[:1] == hf.tokenizer(
        hf.tokenizer.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False),
        add_special_tokens=False).input_ids[:1]  # the chat template's own start, no extra BOS


def test_data_parallel_processes_take_consecutive_gpu_groups():
    assert gpu_slice(["0", "1", "2", "3"], 0, 1) == ["0"]
    assert gpu_slice(["4", "5", "6", "7"], 1, 2) == ["6", "7"]  # CUDA_VISIBLE_DEVICES=4,5,6,7, rank 1, tp 2
    with pytest.raises(UserError, match="process 2 needs GPUs 4..5"):
        gpu_slice(["0", "1", "2", "3"], 2, 2)


# -- the adapter's loop, with the stand-in engine -----------------------------------------------------------------


def test_answers_equal_the_hf_adapters_and_are_reported_call_by_call(hf, tmp_path):
    import mmcomp_eval

    tasks = make_user_tasks(tmp_path)
    common = dict(tasks=["echo_task"], include_paths=[tasks], progress=False)
    direct = mmcomp_eval.evaluate(hf, **common, no_cache=True, output_path=tmp_path / "hf")
    engine = TransformersEngine(hf)
    model = VLLMCausalLM.with_engine(engine, pretrained="tiny", batch_size=4)
    served = mmcomp_eval.evaluate(model, **common, cache_dir=tmp_path / "store", output_path=tmp_path / "vllm")
    assert engine.calls == [4, 2]  # 6 requests, batch_size=4 per LLM.generate call
    rows = [[json.loads(line)["prediction"] for line in (tmp_path / d / "samples.jsonl").read_text().splitlines()]
            for d in ("hf", "vllm")]
    assert rows[0] == rows[1] and any(rows[0])
    assert served["tasks"]["echo_task"]["metrics"] == direct["tasks"]["echo_task"]["metrics"]
    assert served["model"]["fingerprint"]["backend"] == "vllm"
    assert served["model"]["fingerprint"]["engine"] == "transformers stand-in"
    # a rerun finds every answer in the store
    again = mmcomp_eval.evaluate(VLLMCausalLM.with_engine(engine, pretrained="tiny", batch_size=4), **common,
                                 cache_dir=tmp_path / "store")
    assert engine.calls == [4, 2] and again["cache"]["hits"] == len(WORDS)

    reported = []
    one_by_one = VLLMCausalLM.with_engine(engine, pretrained="tiny", batch_size="auto")
    answers = one_by_one.generate([GenerationRequest(w, f"word: {w} =>", GenerationSettings(max_new_tokens=4))
                                   for w in WORDS], on_result=lambda i, a: reported.append(i))
    assert engine.calls[-1] == len(WORDS) and reported == list(range(len(WORDS))) and len(answers) == len(WORDS)
    with pytest.raises(UserError, match="cannot decode with num_beams=2"):
        one_by_one.generate([GenerationRequest("a", "p", GenerationSettings(num_beams=2))])
    with pytest.raises(UserError, match="text-only but request a has images; use vllm-vlm"):
        one_by_one.generate([GenerationRequest("a", "p <image>", images=("d#0",))])


def test_vllm_and_hf_plans_ask_the_same_requests(tmp_path):
    """Same prompts and settings, so the same response-store request keys (the model key differs: another backend)."""
    from mmcomp_eval.evaluation.prepare import ModelPlan, RunOptions, prepare
    from mmcomp_eval.models.hf import HFCausalLM
    from mmcomp_eval.runtime.response_store import request_key
    from mmcomp_eval.tasks.index import TaskIndex

    tasks = make_user_tasks(tmp_path)
    index = TaskIndex.build((tasks,))
    task = index.resolve(["echo_task"])[0]
    opts = RunOptions(seeds=(0, 1), include_paths=(tasks,), progress=False,
                      gen_kwargs={"do_sample": True, "temperature": 0.7})
    calls = {}
    for name, cls in (("hf", HFCausalLM), ("vllm", VLLMCausalLM)):
        prepared = prepare(task, ModelPlan(name, cls.capabilities), opts, index)
        calls[name] = [prepared.output.requests(prepared, seed).requests for seed in (0, 1)]
    assert calls["hf"] == calls["vllm"]
    keys = [[request_key("generate", r) for r in reqs] for reqs in calls["vllm"]]
    assert keys == [[request_key("generate", r) for r in reqs] for reqs in calls["hf"]]
    assert keys[0] != keys[1]  # sampled: the seed is part of each request


# -- images -----------------------------------------------------------------------------------------------------------


def _vlm(hf, **options):
    return VLLMVisionLM.with_engine(TransformersEngine(hf), pretrained="tiny-vlm", **options)


def test_images_go_to_the_multimodal_input_in_prompt_order(hf):
    assert with_image_tokens("a <image> b <image>", lambda i: f"<img{i}>") == "a <img1> b <img2>"
    assert content_parts("a <image> b <image>", images=True) == [
        {"type": "text", "text": "a "}, {"type": "image"}, {"type": "text", "text": " b "}, {"type": "image"}]
    assert content_parts("a <image> b", images=False) == [{"type": "text", "text": "a b"}]

    red, green = object(), object()  # vLLM takes PIL images; the adapter only passes them on, in order
    request = GenerationRequest("q", "narration <image> next <image> =>", GenerationSettings(max_new_tokens=4),
                                images=("d#0", "d#1"))
    model = _vlm(hf)
    prompt = model._prompt(request, [green, red])
    assert prompt["multi_modal_data"] == {"image": [green, red]}
    assert hf.tokenizer.decode(prompt["prompt_token_ids"], skip_special_tokens=True) == \
        "narration <img1> next <img2> =>"
    assert _vlm(hf, image_token="<image>")._prompt(request, [green, red])["prompt_token_ids"] == \
        hf.tokenizer("narration <image> next <image> =>").input_ids

    with pytest.raises(UserError, match="2 <image> placeholders but 1 images"):
        model._prompt(request, [green])
    text_only = _vlm(hf, images=False)
    assert not text_only.capabilities.reads_images
    plain = text_only._prompt(request, None)
    assert "multi_modal_data" not in plain
    assert hf.tokenizer.decode(plain["prompt_token_ids"], skip_special_tokens=True) == "narration next =>"
    with pytest.raises(UserError, match="takes at most 1 \\(max_images\\)"):
        _vlm(hf, max_images=1).generate([request], images=[[green, red]])
    too_long = GenerationRequest("long", "x " * 80 + "<image>", GenerationSettings(max_new_tokens=4), images=("d#0",))
    with pytest.raises(UserError, match="request long: the prompt has .* more than max_model_len 64"):
        model._prompt(too_long, [green])


def test_chat_turns_go_through_the_processor_template_with_image_parts(hf):
    template = ("{% for m in messages %}{{ m.role }}:{% for p in m.content %}"
                "{% if p.type == 'image' %}[IMG]{% else %}{{ p.text }}{% endif %}{% endfor %}{{ '\\n' }}{% endfor %}"
                "assistant:")

    class Processor:  # a processor's chat template, as transformers' processors apply it
        chat_template = template

        def apply_chat_template(self, conversation, add_generation_prompt, tokenize):
            assert add_generation_prompt and not tokenize
            return hf.tokenizer.apply_chat_template(conversation, chat_template=template, tokenize=False)

    model = _vlm(hf)
    model.__dict__["processor"] = Processor()
    turns = (ChatMessage("user", "take <image>"), ChatMessage("assistant", "take"), ChatMessage("user", "cut <image>"))
    a, b = object(), object()
    prompt = model._prompt(GenerationRequest("q", "", GenerationSettings(max_new_tokens=4), messages=turns,
                                             images=("d#0", "d#1")), [a, b])
    assert hf.tokenizer.decode(prompt["prompt_token_ids"]) == "user:take [IMG]\nassistant:take\nuser:cut [IMG]\nassistant:"
    assert prompt["multi_modal_data"] == {"image": [a, b]}
