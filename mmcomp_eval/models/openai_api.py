"""Models behind an OpenAI-compatible HTTP API (``--model openai-chat`` / ``openai-completions``).

Anything that speaks OpenAI's protocol works: OpenAI itself, vLLM's and
SGLang's servers (``vllm serve``), llama.cpp's ``llama-server``, TGI, Ollama,
LM Studio. Requests go to ``<base_url>/chat/completions`` (``openai-chat``:
the prompt, or the chat turns of ``--apply-chat-template``, as messages;
images as base64 data URLs, in prompt order) or ``<base_url>/completions``
(``openai-completions``: the prompt text as is, text only).

Like every adapter, its answers go through the response store: each answer is
reported the moment its HTTP response arrives (``reports_each_result``), so a
run killed half way, or stopped by a server that gave up, resumes with the
requests still unanswered. ``num_concurrent`` requests are in flight at once
(threads: the work is waiting on sockets); failures a server may recover
from (429, 5xx, timeouts, refused connections) are retried with exponential
backoff and jitter (``models/http_retry.py``), others stop the run at once
with the server's message.

The API key is read from the environment variable named by ``api_key_env``
(default ``OPENAI_API_KEY``) when a request is sent; it is never a model
argument, so it never reaches ``results.json``, and it is not part of the
answers' identity (the fingerprint: server host and port, endpoint, model).

Offline runs (``--offline``, ``HF_HUB_OFFLINE=1``, ...) refuse any server
that is not on this machine, before anything is sent: offline means no
network. A server on the loopback interface (``localhost``, ``127.0.0.1``,
``::1``) is allowed, since serving a local model with ``vllm serve`` or
``llama-server`` and evaluating it offline is a common setup; loopback
requests never go through a proxy.
"""

from __future__ import annotations

import base64
import io
import ipaddress
import logging
import os
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mmcomp_eval.api.model import Model, ModelCapabilities, ProgressCallback, ResultCallback
from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
from mmcomp_eval.config.model_args import ArgumentOptions
from mmcomp_eval.errors import UserError
from mmcomp_eval.models.decoding import clean, refuse_unsupported
from mmcomp_eval.models.http_retry import Cancelled, JsonPoster, RetryPolicy
from mmcomp_eval.models.registry import MODELS
from mmcomp_eval.models.vlm import interleave, strip_placeholders
from mmcomp_eval.paths import is_offline
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    from PIL import Image

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: the endpoints under the API root, longest first (a base_url ending in one of them is taken as that endpoint)
ENDPOINT_PATHS = ("chat/completions", "completions")
#: the most stop sequences OpenAI's API accepts; the answer is cut at every stop string locally anyway
API_MAX_STOP = 4
#: seeds are sent as signed 64-bit integers, which every server's JSON parser takes
SEED_MASK = (1 << 63) - 1
#: ``image_format`` -> (PIL format, MIME type); PNG is lossless, JPEG smaller
IMAGE_FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg")}


@dataclass(frozen=True)
class ApiOptions(ArgumentOptions):
    """Model arguments of both endpoints: where the server is and how to talk to it."""

    #: the API root; requests go to ``<base_url>/chat/completions`` or ``<base_url>/completions``
    base_url: str = DEFAULT_BASE_URL
    #: the environment variable holding the API key (unset: no Authorization header is sent)
    api_key_env: str = "OPENAI_API_KEY"
    #: requests in flight at once
    num_concurrent: int = 8
    #: retries of a request after a transient failure (429, 5xx, timeout, refused connection)
    max_retries: int = 5
    #: seconds one attempt may take
    timeout: float = 120.0
    #: seconds of the first backoff; each retry doubles it, with jitter
    backoff_base: float = 1.0
    #: the longest single wait between retries, in seconds
    backoff_max: float = 60.0
    #: set by ``--offline``: only a server on this machine may be used
    offline: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.num_concurrent, bool) or self.num_concurrent < 1:
            raise UserError(f"model argument num_concurrent={self.num_concurrent!r} must be at least 1")
        problem = self.retry_policy().problem()
        if problem:
            raise UserError(f"model argument {problem}")
        if not self.api_key_env or not self.api_key_env.replace("_", "").isalnum():
            raise UserError(f"model argument api_key_env={self.api_key_env!r} must name an environment variable "
                            "(the key itself never goes into model arguments, which results.json records)")

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_retries, self.backoff_base, self.backoff_max, self.timeout)



@dataclass(frozen=True)
class ChatOptions(ApiOptions):
    """:class:`ApiOptions` plus what a vision model behind the chat endpoint is sent."""

    #: false: the prompts' image placeholders are removed and no image is sent (a VLM run text-only)
    images: bool = True
    #: most images one request may carry (unset: no limit known; the server may still refuse)
    max_images: int | None = None
    #: how images are encoded into their data URLs: ``png`` (lossless) or ``jpeg`` (quality 95, smaller)
    image_format: str = "png"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.image_format not in IMAGE_FORMATS:
            raise UserError(f"model argument image_format={self.image_format!r} is not one of "
                            f"{', '.join(IMAGE_FORMATS)}")
        if self.max_images is not None and (isinstance(self.max_images, bool) or self.max_images < 1):
            raise UserError(f"model argument max_images={self.max_images!r} must be at least 1")


@dataclass(frozen=True)
class Server:
    """Where one endpoint of a server is, and whether it is on this machine."""

    base_url: str
    url: str
    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, base_url: str, path: str) -> Server:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"model argument base_url={base_url!r} is not an http(s) URL like "
                            "http://127.0.0.1:8000/v1 or https://api.openai.com/v1")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise UserError(f"model argument base_url={base_url!r} has a bad port") from None
        base = base_url.rstrip("/")
        given = next((p for p in ENDPOINT_PATHS if base.endswith("/" + p)), None)
        if given is not None:  # lm-eval's habit: base_url names the endpoint itself
            if given != path:
                raise UserError(f"model argument base_url={base_url!r} names the /{given} endpoint; this model "
                                f"uses /{path}: give the API root (ending in /v1) or pick the other openai-* model")
            base = base[: -len(path) - 1]
        return cls(base, f"{base}/{path}", parts.scheme, parts.hostname.lower(), port)

    @property
    def loopback(self) -> bool:
        """On this machine, judged from the name alone (resolving a name would itself use the network)."""
        if self.host == "localhost" or self.host.endswith(".localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def address(self) -> str:
        """``host:port/path``: the server's identity in fingerprints.

        The path is part of it (gateways route different models by path under
        one model name, e.g. TGI's ``tgi``); user info, query and fragment
        are not (they may hold credentials).
        """
        host = f"[{self.host}]" if ":" in self.host else self.host
        path = urllib.parse.urlsplit(self.base_url).path.rstrip("/")
        return f"{host}:{self.port}{path}"

    def check_allowed(self, offline: bool) -> None:
        if offline and not self.loopback:
            raise UserError(f"offline run: base_url {self.base_url} is not on this machine; "
                            "offline only a local server (http://127.0.0.1:PORT/v1) may be used, "
                            "or drop --offline / HF_HUB_OFFLINE")


def unsupported(settings: GenerationSettings) -> str | None:
    """Which generation setting the OpenAI API cannot express, as ``field=value``; None when all can be sent."""
    if settings.num_beams > 1:
        return f"num_beams={settings.num_beams} (the API has no beam search)"
    if settings.repetition_penalty != 1.0:
        return (f"repetition_penalty={settings.repetition_penalty} (the API has only frequency/presence "
                "penalties, which are not the same)")
    if settings.no_repeat_ngram_size:
        return f"no_repeat_ngram_size={settings.no_repeat_ngram_size} (the API has no n-gram blocking)"
    return None


def sampling_fields(request: GenerationRequest) -> dict[str, Any]:
    """The request body's decoding fields for one request (see the README's mapping table).

    Greedy decoding is ``temperature: 0``. Sampling sends the temperature,
    ``top_p``, ``top_k`` when it limits anything (vLLM, SGLang, llama.cpp and
    TGI take it; OpenAI's own API rejects it, so run those with
    ``--gen-kwargs top_k=0``) and a per-request ``seed``: the same
    :meth:`GenerationRequest.sampling_seed` the local adapters draw from, so
    a server that honours seeds samples each request reproducibly.
    """
    s = request.settings
    fields: dict[str, Any] = {"max_tokens": s.max_new_tokens, "n": 1}
    if s.stop:
        fields["stop"] = list(s.stop[:API_MAX_STOP])
    if not s.do_sample:
        fields["temperature"] = 0.0
        return fields
    fields["temperature"] = s.temperature
    fields["top_p"] = s.top_p
    if s.top_k:
        fields["top_k"] = s.top_k
    fields["seed"] = request.sampling_seed() & SEED_MASK
    return fields


def chat_messages(request: GenerationRequest, image_urls: Sequence[str] | None) -> list[dict[str, Any]]:
    """The ``messages`` of a chat request: the prompt as one user turn, or the request's chat turns.

    ``image_urls`` (None: images are not sent) replace the ``<image>``
    placeholders in order, across turns: a turn with images becomes a list of
    ``text`` and ``image_url`` parts, one without stays a plain string.
    """
    turns = [("user", request.prompt)] if request.messages is None else [(m.role, m.content)
                                                                         for m in request.messages]
    if image_urls is None:
        return [{"role": role, "content": strip_placeholders(text)} for role, text in turns]
    wanted = sum(text.count(IMAGE_PLACEHOLDER) for _, text in turns)
    if wanted != len(image_urls):
        raise UserError(f"request {request.request_id}: the prompt holds {wanted} {IMAGE_PLACEHOLDER} "
                        f"placeholders but {len(image_urls)} images were given")
    messages, used = [], 0
    for role, text in turns:
        n = text.count(IMAGE_PLACEHOLDER)
        if not n:
            messages.append({"role": role, "content": text})
            continue
        if role != "user":
            raise UserError(f"request {request.request_id}: an image in a {role} turn; the OpenAI chat format "
                            "takes images in user turns only")
        parts = [{"type": "text", "text": piece} if isinstance(piece, str) else
                 {"type": "image_url", "image_url": {"url": piece.url}}
                 for piece in interleave(text, [_Url(u) for u in image_urls[used:used + n]])]
        messages.append({"role": role, "content": parts})
        used += n
    return messages


@dataclass(frozen=True)
class _Url:
    """An image's data URL, kept apart from the text pieces ``interleave`` returns."""

    url: str


def image_data_url(image: Image.Image, image_format: str) -> str:
    """``data:image/png;base64,...``: the image itself inside the request (no file server needed)."""
    pil_format, mime = IMAGE_FORMATS[image_format]
    buffer = io.BytesIO()
    image.save(buffer, format=pil_format, **({"quality": 95} if pil_format == "JPEG" else {}))
    return f"data:{mime};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


class OpenAIModel(Model):
    """The shared machinery of both endpoints: options, the server, concurrency, answers in request order."""

    #: the path under ``base_url``
    path: ClassVar[str]
    options_type: ClassVar[type[ApiOptions]] = ApiOptions
    options: ApiOptions

    def __init__(self, model: str, **options: Any):
        if not model:
            raise UserError(f"model '{self.name}' needs --model-args model=NAME (the model the server serves)")
        self.model = model
        self.options = self.options_type.from_arguments(self.name, options)
        self.server = Server.parse(self.options.base_url, self.path)
        self.server.check_allowed(_offline(options))
        self.capabilities = self._capabilities(self.options)
        self.poster = JsonPoster(self.name, self.options.retry_policy(), {}, use_proxies=not self.server.loopback)

    @classmethod
    def capabilities_for(cls, args: Mapping[str, Any]) -> ModelCapabilities:
        """Checks the arguments and the offline rule too: a run that cannot reach its server fails before any work."""
        options = cls.options_type.from_arguments(cls.name, {k: v for k, v in args.items() if k != "model"})
        Server.parse(options.base_url, cls.path).check_allowed(_offline(args))
        return cls._capabilities(options)

    @classmethod
    def _capabilities(cls, options: ApiOptions) -> ModelCapabilities:
        return cls.capabilities

    # -- generation ------------------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest], progress: ProgressCallback | None = None,
                 on_result: ResultCallback | None = None, images: Sequence | None = None) -> list[str]:
        """Answers in request order, reported through ``on_result`` in the order they arrive."""
        refuse_unsupported(self.name, requests, unsupported)
        for request in requests:
            self._check(request, images is not None and self.capabilities.reads_images)
        results = [""] * len(requests)
        cancelled = threading.Event()
        pool = ThreadPoolExecutor(max_workers=self.options.num_concurrent, thread_name_prefix=self.name)
        futures = {pool.submit(self._answer, r, images, i, cancelled): i for i, r in enumerate(requests)}
        failure: BaseException | None = None
        try:
            for future in as_completed(futures):
                i = futures[future]
                try:
                    text = future.result()
                except (Cancelled, CancelledError):
                    continue
                except Exception as exc:  # noqa: BLE001  (the first failure is raised once the others stopped)
                    if failure is None:
                        failure = exc
                        cancelled.set()
                        for other in futures:
                            other.cancel()
                    continue
                results[i] = text
                if on_result:
                    on_result(i, text)  # answers that finish after a failure are still kept
                if progress:
                    progress(1)
        finally:
            cancelled.set()  # also on KeyboardInterrupt: queued requests are dropped, not sent
            pool.shutdown(wait=True, cancel_futures=True)
        if failure is not None:
            raise failure
        if self.poster.stats.retries:
            log.info("%s: %d retries, %.1f s spent waiting", self.name, self.poster.stats.retries,
                     self.poster.stats.waited_s)
        return results

    def _check(self, request: GenerationRequest, with_images: bool) -> None:
        """Problems found before anything is sent."""
        if request.images and not self.capabilities.images:
            raise UserError(f"model '{self.name}' is text-only but request {request.request_id} has images")

    def _answer(self, request: GenerationRequest, images: Sequence | None, i: int, cancelled: threading.Event) -> str:
        """One answer; a failure stops the call's other requests at once (not when the main thread notices)."""
        try:
            return self._ask(request, images, i, cancelled)
        except Cancelled:
            raise
        except BaseException:
            cancelled.set()
            raise

    def _ask(self, request: GenerationRequest, images: Sequence | None, i: int, cancelled: threading.Event) -> str:
        if cancelled.is_set():
            raise Cancelled()
        body = {"model": self.model, **self._prompt_fields(request, images, i), **sampling_fields(request)}
        key = os.environ.get(self.options.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        answer = self.poster.post(self.server.url, body, cancelled, headers)
        return clean(self._text(answer), request.settings.stop)

    def _prompt_fields(self, request: GenerationRequest, images: Sequence | None, i: int) -> dict[str, Any]:
        raise NotImplementedError

    def _text(self, answer: Any) -> str:
        raise NotImplementedError

    def _malformed(self, answer: Any, where: str) -> UserError:
        return UserError(f"{self.name}: {self.server.url} answered without {where}: {str(answer)[:200]}")

    # -- identity --------------------------------------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        """What decides the answers: the server, the endpoint and the model it serves (never the key)."""
        return {"name": self.name, "server": self.server.address, "endpoint": self.path, "model": self.model}


@MODELS.register("openai-chat", aliases=("local-chat-completions", "openai-chat-completions"))
class OpenAIChat(OpenAIModel):
    """``<base_url>/chat/completions``: prompts as messages, images as data URLs.

    Takes ``model`` and every :class:`ChatOptions` field.
    """

    name = "openai-chat"
    #: with the default arguments; :meth:`_capabilities` says what an instance with others has
    capabilities = ModelCapabilities(generate=True, images=True, reads_images=True, reports_each_result=True)
    path = "chat/completions"
    options_type = ChatOptions
    options: ChatOptions

    @classmethod
    def _capabilities(cls, options: ChatOptions) -> ModelCapabilities:
        return ModelCapabilities(generate=True, images=True, reads_images=options.images,
                                 max_images=options.max_images if options.images else None,
                                 reports_each_result=True)

    def _check(self, request: GenerationRequest, with_images: bool) -> None:
        limit = self.capabilities.max_images
        if with_images and limit is not None and len(request.images) > limit:
            raise UserError(f"request {request.request_id} has {len(request.images)} images; model "
                            f"'{self.name}' takes at most {limit} (max_images)")
        if not self.capabilities.reads_images:
            return
        if request.images and not with_images:
            raise UserError(f"model '{self.name}' got prompts with images but no image data; give the task "
                            "a media section, or run the model with images=false")

    def _prompt_fields(self, request: GenerationRequest, images: Sequence | None, i: int) -> dict[str, Any]:
        urls = None
        if self.capabilities.reads_images:
            urls = [image_data_url(im, self.options.image_format) for im in images[i]] if images is not None else []
        return {"messages": chat_messages(request, urls)}

    def _text(self, answer: Any) -> str:
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise self._malformed(answer, "choices[0].message.content") from None
        return content or ""  # null content: the model said nothing

    def fingerprint(self) -> dict[str, Any]:
        fp = {**super().fingerprint(), "images": self.capabilities.reads_images}
        if self.capabilities.reads_images:
            fp["image_format"] = self.options.image_format  # JPEG changes the pixels the model sees
        return fp


@MODELS.register("openai-completions", aliases=("local-completions",))
class OpenAICompletions(OpenAIModel):
    """``<base_url>/completions``: the prompt text exactly as rendered, text only.

    Takes ``model`` and every :class:`ApiOptions` field.
    """

    name = "openai-completions"
    capabilities = ModelCapabilities(generate=True, reports_each_result=True)
    path = "completions"

    def _check(self, request: GenerationRequest, with_images: bool) -> None:
        super()._check(request, with_images)
        if request.messages is not None:
            raise UserError(f"model '{self.name}' sends plain text, but --apply-chat-template made chat turns "
                            "(the server's template is unknown here); drop the option or use openai-chat")

    def _prompt_fields(self, request: GenerationRequest, images: Sequence | None, i: int) -> dict[str, Any]:
        return {"prompt": request.prompt}

    def _text(self, answer: Any) -> str:
        try:
            text = answer["choices"][0]["text"]
        except (KeyError, IndexError, TypeError):
            raise self._malformed(answer, "choices[0].text") from None
        return text or ""


def _offline(args: Mapping[str, Any]) -> bool:
    return bool(args.get("offline")) or is_offline()
