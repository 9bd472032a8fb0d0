"""The OpenAI-compatible adapter against a real HTTP server on 127.0.0.1 (tests/openai_server.py).

No OpenAI-compatible server can be pip-installed on these machines (llama-cpp-python has no
wheel for them, vLLM needs a GPU), so the server is a small one written for the tests; one test
puts the ``hf`` adapter behind it, so the API path is compared with a real model's answers.
"""

from __future__ import annotations

import base64
import io
import json
import random
import re
import socket
import threading
import time

import pytest

from mmcomp_eval.api.request import ChatMessage, GenerationRequest, GenerationSettings
from mmcomp_eval.errors import UserError
from mmcomp_eval.models import create_model
from mmcomp_eval.models.http_retry import RetryPolicy
from mmcomp_eval.models.openai_api import SEED_MASK, chat_messages, sampling_fields

from openai_server import Fault, FakeOpenAIServer, echo_last_word, prompt_text
from user_task import WORDS, make_user_tasks, run_cli

FAST = "max_retries=3,backoff_base=0.01,backoff_max=0.05,timeout=5"


def chat_model(server, extra: str = "", name: str = "openai-chat"):
    return create_model(name, f"base_url={server.base_url},model=x,{FAST}" + (f",{extra}" if extra else ""))


def ask(word: str, **settings) -> GenerationRequest:
    return GenerationRequest(word, f"Repeat the word.\nword: {word} =>", GenerationSettings(**settings))


# -- the request body ------------------------------------------------------------------------------------------


def test_decoding_settings_map_to_the_api_fields():
    greedy = ask("knife", max_new_tokens=4)
    assert sampling_fields(greedy) == {"max_tokens": 4, "n": 1, "stop": ["\n"], "temperature": 0.0}

    sampled = ask("knife", do_sample=True, temperature=0.6, top_p=0.9, seed=3)
    fields = sampling_fields(sampled)
    assert fields == {"max_tokens": 16, "n": 1, "stop": ["\n"], "temperature": 0.6, "top_p": 0.9, "top_k": 50,
                      "seed": sampled.sampling_seed() & SEED_MASK}
    assert 0 <= fields["seed"] < 2**63
    # the seed is the local adapters' per-request seed: it follows the run seed and the content, nothing else
    assert sampling_fields(ask("knife", do_sample=True, temperature=0.6, top_p=0.9, seed=4))["seed"] != fields["seed"]
    assert sampling_fields(ask("onion", do_sample=True, temperature=0.6, top_p=0.9, seed=3))["seed"] != fields["seed"]
    assert "top_k" not in sampling_fields(ask("knife", do_sample=True, top_k=0))
    many = ask("knife", stop=("\n", ".", ";", "!", "?"))
    assert sampling_fields(many)["stop"] == ["\n", ".", ";", "!"]  # the API takes 4; all 5 are cut locally


def test_images_become_data_url_parts_in_prompt_order_across_turns():
    turns = (ChatMessage("system", "Narrate."), ChatMessage("user", "a <image> b <image>"),
             ChatMessage("assistant", "cut onion"), ChatMessage("user", "c <image> =>"))
    request = GenerationRequest("q", "unused", messages=turns, images=("d#0", "d#1", "d#2"))
    messages = chat_messages(request, ["u0", "u1", "u2"])
    assert messages[0] == {"role": "system", "content": "Narrate."}
    assert messages[1]["content"] == [{"type": "text", "text": "a "}, {"type": "image_url", "image_url": {"url": "u0"}},
                                      {"type": "text", "text": " b "},
                                      {"type": "image_url", "image_url": {"url": "u1"}}]
    assert messages[2] == {"role": "assistant", "content": "cut onion"}
    assert messages[3]["content"][1] == {"type": "image_url", "image_url": {"url": "u2"}}
    # not reading images: placeholders go, text stays a string
    assert chat_messages(request, None)[1] == {"role": "user", "content": "a b"}
    with pytest.raises(UserError, match="3 <image> placeholders but 2 images"):
        chat_messages(request, ["u0", "u1"])
    bad = GenerationRequest("q", "", messages=(ChatMessage("assistant", "x <image>"),), images=("d#0",))
    with pytest.raises(UserError, match="assistant turn"):
        chat_messages(bad, ["u0"])


def test_backoff_doubles_with_jitter_and_is_capped():
    policy = RetryPolicy(max_retries=8, backoff_base=1.0, backoff_max=6.0)
    rng = random.Random(0)
    for retry, step in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 6.0), (7, 6.0)]:
        waits = [policy.wait(retry, None, rng) for _ in range(200)]
        assert step / 2 <= min(waits) and max(waits) <= step  # equal jitter: half fixed, half random
        assert max(waits) - min(waits) > step / 4  # and it does spread
    assert policy.wait(1, 3.0, rng) >= 3.0  # Retry-After is a floor ...
    assert policy.wait(1, 100.0, rng) == 6.0  # ... under the cap


# -- talking to a server -----------------------------------------------------------------------------------------


def test_answers_come_back_in_request_order_with_at_most_num_concurrent_in_flight():
    words = [f"w{k}" for k in range(12)]

    def slow_first(endpoint, body, attempt):  # early requests finish last
        k = int(prompt_text(endpoint, body).rsplit("w", 1)[-1].removesuffix(" =>"))
        return Fault(delay=0.02 * (12 - k))

    with FakeOpenAIServer(fault=slow_first) as server:
        model = chat_model(server, "num_concurrent=4")
        reported = []
        answers = model.generate([ask(w) for w in words], on_result=lambda i, a: reported.append((i, a)))
    assert answers == words  # " w3\nword: extra" cut at the stop string, leading space dropped
    assert server.max_in_flight == 4
    assert len(server.received) == 12
    assert sorted(reported) == list(enumerate(words))
    assert [i for i, _ in reported] != list(range(12))  # reported as they arrived, not in request order
    body = server.bodies()[0]
    assert body["model"] == "x" and body["messages"][0]["role"] == "user" and body["temperature"] == 0.0


def test_429_and_500_are_retried_with_backoff():
    def flaky(endpoint, body, attempt):
        if attempt == 1:
            return Fault(status=429, retry_after="0")
        if attempt == 2:
            return Fault(status=500)
        return None

    with FakeOpenAIServer(fault=flaky) as server:
        model = chat_model(server, "num_concurrent=2")
        assert model.generate([ask("knife"), ask("onion")]) == ["knife", "onion"]
    assert len(server.received) == 6  # 3 attempts each
    assert model.poster.stats.retries == 4
    for word in ("knife", "onion"):
        times = [r.at for r in server.received if word in prompt_text(r.endpoint, r.body)]
        assert times[1] - times[0] >= 0.005 and times[2] - times[1] >= 0.01  # at least half of 0.01 s, then of 0.02 s


def test_a_timeout_is_retried():
    def slow_once(endpoint, body, attempt):
        return Fault(delay=1.5) if attempt == 1 else None

    with FakeOpenAIServer(fault=slow_once) as server:
        model = create_model("openai-chat", f"base_url={server.base_url},model=x,timeout=0.3,backoff_base=0.01")
        started = time.monotonic()
        assert model.generate([ask("plate")]) == ["plate"]
        assert time.monotonic() - started < 1.4  # it did not wait for the slow answer
    assert len(server.received) == 2


def test_retries_are_capped_then_the_error_is_one_line():
    with FakeOpenAIServer(fault=lambda e, b, a: Fault(status=503)) as server:
        model = chat_model(server)
        with pytest.raises(UserError) as exc:
            model.generate([ask("knife")])
    assert len(server.received) == 4  # the first attempt and max_retries=3
    message = str(exc.value)
    assert "failed 4 times" in message and "HTTP 503: injected 503" in message and "\n" not in message


def test_a_server_that_is_not_up_is_retried_then_named():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = create_model("openai-chat", f"base_url=http://127.0.0.1:{port}/v1,model=x,max_retries=1,backoff_base=0.01")
    with pytest.raises(UserError, match=f"127.0.0.1:{port}/v1/chat/completions failed 2 times, last with "
                                        "ConnectionRefusedError"):
        model.generate([ask("knife")])
    assert model.poster.stats.retries == 1


@pytest.mark.parametrize("status, hint", [(400, "HTTP 400: injected 400"), (401, "api_key_env"), (404, "base_url")])
def test_client_errors_are_not_retried(status, hint):
    with FakeOpenAIServer(fault=lambda e, b, a: Fault(status=status)) as server:
        with pytest.raises(UserError, match=hint):
            chat_model(server).generate([ask("knife")])
    assert len(server.received) == 1


def test_a_failure_stops_the_others_and_keeps_what_finished():
    def fail_onion(endpoint, body, attempt):
        return Fault(status=400) if "onion" in prompt_text(endpoint, body) else Fault(delay=0.05)

    with FakeOpenAIServer(fault=fail_onion) as server:
        model = chat_model(server, "num_concurrent=1")
        reported = []
        with pytest.raises(UserError, match="HTTP 400"):
            model.generate([ask(w) for w in WORDS], on_result=lambda i, a: reported.append((i, a)))
    assert reported == [(0, "knife"), (1, "plate")]  # onion is WORDS[2]; the queued rest was never sent
    assert len(server.received) == 3


def test_settings_the_api_cannot_express_fail_before_anything_is_sent():
    with FakeOpenAIServer() as server:
        for settings, fragment in [({"num_beams": 3}, "num_beams=3"), ({"repetition_penalty": 1.2}, "repetition"),
                                   ({"no_repeat_ngram_size": 2}, "no_repeat_ngram_size")]:
            with pytest.raises(UserError, match=fragment):
                chat_model(server).generate([ask("knife"), ask("plate", **settings)])
        with pytest.raises(UserError, match="apply-chat-template"):
            chat_model(server, name="openai-completions").generate(
                [GenerationRequest("q", "p", messages=(ChatMessage("user", "p"),))])
    assert server.received == []


def _solid(color):
    from PIL import Image

    return Image.new("RGB", (8, 6), color)


def _decode(url: str):
    from PIL import Image

    header, data = url.split(",", 1)
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    return header, image.convert("RGB").getpixel((3, 3))


NAMES = {(255, 0, 0): "red", (0, 255, 0): "green", (0, 0, 255): "blue"}


def _name(pixel):
    return min(NAMES, key=lambda c: sum((a - b) ** 2 for a, b in zip(c, pixel)))


def name_the_images(endpoint, body):
    parts = body["messages"][-1]["content"]
    if isinstance(parts, str):
        return "no images"
    return " ".join(NAMES[_name(_decode(p["image_url"]["url"])[1])] for p in parts if p["type"] == "image_url")


@pytest.mark.parametrize("image_format, mime", [("png", "data:image/png;base64"), ("jpeg", "data:image/jpeg;base64")])
def test_images_arrive_as_data_urls_in_order(image_format, mime):
    request = GenerationRequest("q", "first <image> then <image> and <image> =>", GenerationSettings(stop=()),
                                images=("d#0", "d#1", "d#2"))
    images = [[_solid("blue"), _solid("red"), _solid("green")]]
    with FakeOpenAIServer(answer=name_the_images) as server:
        model = chat_model(server, f"image_format={image_format}")
        assert model.generate([request], images=images) == ["blue red green"]
        parts = server.bodies()[0]["messages"][0]["content"]
        assert [p["type"] for p in parts] == ["text", "image_url", "text", "image_url", "text", "image_url", "text"]
        assert parts[0]["text"] == "first " and parts[-1]["text"] == " =>"
        header, pixel = _decode(parts[1]["image_url"]["url"])
        assert header == mime and (pixel == (0, 0, 255) if image_format == "png" else _name(pixel) == (0, 0, 255))

        text_only = chat_model(server, "images=false")
        assert text_only.capabilities.images and not text_only.capabilities.reads_images
        assert text_only.generate([request]) == ["no images"]
        assert server.bodies()[-1]["messages"][0]["content"] == "first then and =>"

        with pytest.raises(UserError, match="at most 2"):
            chat_model(server, "max_images=2").generate([request], images=images)
    assert model.fingerprint()["image_format"] == image_format


# -- through the command line: the response store, resuming, the key, offline ---------------------------------------


def _run(capsys, tmp_path, server, *extra, model="openai-chat", args=""):
    tasks = tmp_path / "my_tasks"
    if not tasks.exists():
        make_user_tasks(tmp_path)
    return run_cli(capsys, "--model", model, "--model-args", f"base_url={server.base_url},model=x,{FAST}{args}",
                   "--tasks", "echo_task", "--include-path", str(tasks), "--no-progress",
                   "--cache-dir", str(tmp_path / "store"), *extra)


def test_run_end_to_end_through_the_response_store(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MY_SERVER_KEY", "sk-test-NOT-TO-BE-STORED")
    with FakeOpenAIServer() as server:
        rc, out, err = _run(capsys, tmp_path, server, "--output-path", str(tmp_path / "out"),
                            args=",api_key_env=MY_SERVER_KEY")
        assert rc == 0, err
        assert len(server.received) == len(WORDS)
        assert {r.headers["Authorization"] for r in server.received} == {"Bearer sk-test-NOT-TO-BE-STORED"}
        rc, _, err = _run(capsys, tmp_path, server, "--output-path", str(tmp_path / "again"),
                          args=",api_key_env=MY_SERVER_KEY")
        assert rc == 0, err
        assert len(server.received) == len(WORDS)  # every answer came from the store
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["tasks"]["echo_task"]["metrics"]["exact_match"]["mean"] == pytest.approx(100.0)
    assert results["model"]["fingerprint"] == {"name": "openai-chat", "server": f"127.0.0.1:{server.port}/v1",
                                               "endpoint": "chat/completions", "model": "x", "images": True,
                                               "image_format": "png"}
    assert results["cache"]["misses"] == len(WORDS)
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["cache"]["hits"] == len(WORDS) and again["cache"]["misses"] == 0
    assert (tmp_path / "out" / "samples.jsonl").read_text() == (tmp_path / "again" / "samples.jsonl").read_text()
    first = next(b for b in server.bodies() if prompt_text("chat", b).endswith("word: knife =>"))
    assert first["messages"] == [{"role": "user", "content": "Repeat the word.\nword: plate => plate\n"
                                                             "word: onion => onion\nword: knife =>"}]
    assert first["max_tokens"] == 4 and first["stop"] == ["\n"]
    for path in [*(tmp_path / "out").iterdir(), *(tmp_path / "store").rglob("*")]:
        if path.is_file():
            assert b"NOT-TO-BE-STORED" not in path.read_bytes(), path


def test_an_interrupted_run_resumes_with_the_unanswered_requests(tmp_path, capsys):
    broken = {"on": True}

    def fail_onion(endpoint, body, attempt):
        onion = prompt_text(endpoint, body).endswith("word: onion =>")
        return Fault(status=400) if broken["on"] and onion else None

    with FakeOpenAIServer(fault=fail_onion) as server:  # one server: its host and port are part of the answers' identity
        rc, _, err = _run(capsys, tmp_path, server, args=",num_concurrent=1")
        problems = [line for line in err.strip().splitlines() if not re.match(r"\d\d:\d\d:\d\d INFO ", line)]
        assert rc == 2 and "HTTP 400" in err and len(problems) == 1  # one error line after the INFO stage lines
        assert len(server.received) == 3  # knife, plate answered and stored; onion failed; the rest never sent
        broken["on"] = False
        rc, _, err = _run(capsys, tmp_path, server, "--output-path", str(tmp_path / "out"), args=",num_concurrent=1")
        assert rc == 0, err
    resumed = server.bodies()[3:]
    assert [prompt_text("chat", b).rsplit("word: ", 1)[1] for b in resumed] == [f"{w} =>" for w in WORDS[2:]]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert (results["cache"]["hits"], results["cache"]["misses"]) == (2, 4)
    assert results["tasks"]["echo_task"]["metrics"]["exact_match"]["mean"] == pytest.approx(100.0)


@pytest.fixture
def online(monkeypatch):
    """No offline variable set now, and those a run with --offline sets are removed afterwards."""
    import huggingface_hub.constants as hub

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "MMCOMP_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "0")  # recorded as absent before, so restored as absent
        monkeypatch.delenv(var)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", hub.HF_HUB_OFFLINE)


@pytest.fixture
def no_network(monkeypatch):
    attempts: list[str] = []

    def blocked(*args, **kwargs):
        attempts.append(repr(args[1:]))
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", blocked)
    monkeypatch.setattr(socket, "getaddrinfo", blocked)
    return attempts


def test_offline_refuses_a_remote_server_in_one_line_and_touches_no_network(tmp_path, capsys, monkeypatch, online,
                                                                            no_network):
    tasks = make_user_tasks(tmp_path)
    common = ["--tasks", "echo_task", "--include-path", str(tasks), "--no-progress", "--no-cache"]
    rc, _, err = run_cli(capsys, "--model", "openai-chat", "--model-args", "model=gpt-4o", *common, "--offline")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "offline run: base_url https://api.openai.com/v1 is not on this machine" in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, _, err = run_cli(capsys, "--model", "openai-completions", "--model-args",
                         "base_url=http://models.internal:8000/v1,model=m", *common)
    assert rc == 2 and "models.internal" in err
    assert no_network == []


def test_offline_allows_a_server_on_this_machine(tmp_path, capsys, monkeypatch, online):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")  # loopback requests never use a proxy
    with FakeOpenAIServer() as server:
        rc, _, err = _run(capsys, tmp_path, server, "--offline")
        assert rc == 0, err
        assert len(server.received) == len(WORDS)


@pytest.mark.parametrize("args, fragment", [
    ("model=x,num_concurrent=0", "num_concurrent=0"),
    ("model=x,base_url=ftp://host/v1", "not an http(s) URL"),
    ("model=x,image_format=gif", "image_format='gif'"),
    ("model=x,api_key=sk-123", "unknown model argument 'api_key' for 'openai-chat' (did you mean 'api_key_env'?)"),
    ("model=x,max_retries=-1", "max_retries=-1"),
    ("base_url=http://127.0.0.1:1/v1", "needs --model-args model="),
])
def test_bad_arguments_are_one_line_before_anything_runs(tmp_path, capsys, args, fragment):
    tasks = make_user_tasks(tmp_path)
    rc, _, err = run_cli(capsys, "--model", "openai-chat", "--model-args", args, "--tasks", "echo_task",
                         "--include-path", str(tasks), "--no-progress", "--no-cache")
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_the_fingerprint_names_the_server_and_model_but_not_the_key(monkeypatch, online):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    a = create_model("openai-chat", "base_url=http://127.0.0.1:8000/v1,model=m")
    assert a.fingerprint() == {"name": "openai-chat", "server": "127.0.0.1:8000/v1", "endpoint": "chat/completions",
                               "model": "m", "images": True, "image_format": "png"}
    assert create_model("openai-chat", "base_url=http://127.0.0.1:8000/v1/,model=m").fingerprint() == a.fingerprint()
    assert create_model("openai-chat", "base_url=http://127.0.0.1:8001/v1,model=m").fingerprint() != a.fingerprint()
    assert create_model("openai-completions", "base_url=https://api.example.com/v1,model=m").fingerprint() == {
        "name": "openai-completions", "server": "api.example.com:443/v1", "endpoint": "completions", "model": "m"}
    assert "sk-secret" not in json.dumps(a.fingerprint())
    # gateways route models by path under one model name (TGI's "tgi"): the path is part of the identity
    tgi = "base_url=https://api-inference.huggingface.co/models/{}/v1,model=tgi"
    assert create_model("openai-chat", tgi.format("meta-llama/Meta-Llama-3-8B-Instruct")).fingerprint() != \
        create_model("openai-chat", tgi.format("Qwen/Qwen2.5-7B-Instruct")).fingerprint()
    assert "user:pw" not in json.dumps(create_model("openai-chat", "base_url=http://user:pw@127.0.0.1:8000/v1,model=m")
                                       .fingerprint())
    # lm-eval's habit of naming the endpoint in base_url
    full = create_model("openai-completions", "base_url=http://127.0.0.1:8000/v1/completions,model=m")
    assert full.server.url == "http://127.0.0.1:8000/v1/completions"
    assert create_model("openai-chat", "base_url=http://127.0.0.1:8000/v1/chat/completions,model=m").server.url == \
        "http://127.0.0.1:8000/v1/chat/completions"
    with pytest.raises(UserError, match="names the /completions endpoint; this model uses /chat/completions"):
        create_model("openai-chat", "base_url=http://127.0.0.1:8000/v1/completions,model=m")


# -- a real model behind the API -----------------------------------------------------------------------------------


def test_completions_answers_equal_the_hf_adapter_behind_the_server(tiny_llama_dir, tmp_path):
    """The hf adapter serves /v1/completions: the API path must change nothing about prompts, stops or answers."""
    import mmcomp_eval

    hf = create_model("hf", f"pretrained={tiny_llama_dir},batch_size=1")
    lock = threading.Lock()

    def serve(endpoint, body):
        settings = GenerationSettings(max_new_tokens=body["max_tokens"], stop=tuple(body.get("stop", ())))
        assert body["temperature"] == 0.0 and body["n"] == 1
        with lock:
            return hf.generate([GenerationRequest("r", body["prompt"], settings)])[0]

    tasks = make_user_tasks(tmp_path)
    common = dict(tasks=["echo_task"], include_paths=[tasks], no_cache=True, progress=False, shots=2)
    direct = mmcomp_eval.evaluate(hf, **common, output_path=tmp_path / "hf")
    with FakeOpenAIServer(answer=serve) as server:
        served = mmcomp_eval.evaluate("openai-completions", model_args=f"base_url={server.base_url},model=tiny",
                                      **common, output_path=tmp_path / "api")
    assert len(server.received) == len(WORDS)
    rows = [[json.loads(line)["prediction"] for line in (tmp_path / d / "samples.jsonl").read_text().splitlines()]
            for d in ("hf", "api")]
    assert rows[0] == rows[1] and any(rows[0])
    assert served["tasks"]["echo_task"]["metrics"] == direct["tasks"]["echo_task"]["metrics"]
    assert echo_last_word("completions", {"prompt": "word: pan =>"}) == " pan\nword: extra"


IMAGE_TASK = """
task: keyframes_task
dataset: {{name: jsonl, options: {{files: {{test: test.jsonl, train: train.jsonl}}}}}}
target_field: trg_narration
answer_kind: narration
prompt: {{template: compact_idefics.jinja, instruction: Predict the next narration.}}
fewshot: {{sampler: first, k: 1}}
generation: {{max_new_tokens: 8, stop: ["\\\\n"]}}
metrics: [exact_match]
media: {{frames_root: {media}, resize: 32}}
"""


def test_keyframes_reach_the_server_in_prompt_order(tmp_path, capsys):
    """The whole media path: frames on disk -> keyframes -> data URLs in the prompt's order -> the server."""
    from PIL import Image

    from mmcomp_eval.evaluation.prepare import ModelPlan, RunOptions, load_media, prepare
    from mmcomp_eval.media import synthetic as S
    from mmcomp_eval.models.openai_api import OpenAIChat
    from mmcomp_eval.tasks.index import TaskIndex

    videos = ["P01_01", "P02_01"]
    for k, video in enumerate(videos):
        S.write_frames(tmp_path / "media", video, 80, video_index=k + 1)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    S.write_jsonl(tasks / "test.jsonl", S.compact_docs(3, videos, prefix="t"))
    S.write_jsonl(tasks / "train.jsonl", S.compact_docs(2, videos, prefix="p"))
    (tasks / "keyframes_task.yaml").write_text(IMAGE_TASK.format(media=tmp_path / "media"))
    seen: dict[str, list[bytes]] = {}

    def record(endpoint, body):
        parts = body["messages"][0]["content"]
        text = "".join(p["text"] for p in parts if p["type"] == "text")
        seen[text] = [Image.open(io.BytesIO(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))).tobytes()
                      for p in parts if p["type"] == "image_url"]
        return "take knife"

    with FakeOpenAIServer(answer=record) as server:
        rc, _, err = run_cli(capsys, "--model", "openai-chat", "--model-args", f"base_url={server.base_url},model=v",
                             "--tasks", "keyframes_task", "--include-path", str(tasks), "--no-progress", "--no-cache")
        assert rc == 0, err
    index = TaskIndex.build((tasks,))
    prepared = prepare(index.resolve(["keyframes_task"])[0], ModelPlan("openai-chat", OpenAIChat.capabilities),
                       RunOptions(include_paths=(tasks,), progress=False), index)
    load_media(prepared, progress=False)
    call = prepared.output.requests(prepared, 0)
    assert len(seen) == len(call.requests) == 3
    for i, request in enumerate(call.requests):
        expected = [im.tobytes() for im in call.extra["images"][i]]
        assert len(expected) == 6  # 3 keyframes for the shot, 3 for the query
        assert seen[request.prompt.replace("<image>", "")] == expected
