"""A small OpenAI-compatible HTTP server on 127.0.0.1 for the API adapter's tests.

It speaks the two endpoints the adapter uses (``/v1/chat/completions`` and
``/v1/completions``, no streaming) with the request and answer shapes of
OpenAI's API, and lets a test decide, per request, what the answer text is
and which faults to inject (an HTTP status, a ``Retry-After`` header, a
delay). It records every request it received, with its headers and arrival
time, and the most requests it ever had in flight at once. Its threads are
daemons and every test bounds its delays, so a failing test cannot hang.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


@dataclass(frozen=True)
class Fault:
    """What the server does instead of (or before) answering one request."""

    status: int | None = None      # answer with this HTTP error instead of a completion
    delay: float = 0.0             # seconds to wait before answering (or failing)
    retry_after: str | None = None  # a Retry-After header on the error
    body: str | None = None        # the raw error body (default: OpenAI's {"error": {"message": ...}})


@dataclass
class Received:
    endpoint: str  # "chat" or "completions"
    body: dict
    headers: dict
    at: float      # time.monotonic() on arrival


def prompt_text(endpoint: str, body: dict) -> str:
    """The text a request asks about: the completion prompt, or the last user turn's text parts."""
    if endpoint == "completions":
        return body["prompt"]
    content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")


def echo_last_word(endpoint: str, body: dict) -> str:
    """The echo task's right answer (the word before the final ``=>``), with a space and more text after a newline."""
    word = prompt_text(endpoint, body).rsplit("word: ", 1)[-1].removesuffix("=>").strip()
    return f" {word}\nword: extra"


@dataclass
class FakeOpenAIServer:
    """``answer(endpoint, body) -> text``; ``fault(endpoint, body, attempt) -> Fault | None`` (attempt counts from 1
    per distinct request body)."""

    answer: Callable[[str, dict], str] = echo_last_word
    fault: Callable[[str, dict, int], Fault | None] = lambda endpoint, body, attempt: None
    received: list[Received] = field(default_factory=list)
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._attempts: dict[str, int] = {}
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def bodies(self, endpoint: str | None = None) -> list[dict]:
        with self._lock:
            return [r.body for r in self.received if endpoint in (None, r.endpoint)]

    def _enter(self, endpoint: str, body: dict, headers: dict) -> int:
        key = json.dumps(body, sort_keys=True)
        with self._lock:
            self.received.append(Received(endpoint, body, headers, time.monotonic()))
            self._attempts[key] = attempt = self._attempts.get(key, 0) + 1
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        return attempt

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def respond(self, endpoint: str, body: dict, headers: dict) -> tuple[int, dict[str, str], bytes]:
        attempt = self._enter(endpoint, body, headers)
        try:
            fault = self.fault(endpoint, body, attempt)
            if fault is not None and fault.delay:
                time.sleep(fault.delay)
            if fault is not None and fault.status is not None:
                extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
                text = fault.body if fault.body is not None else json.dumps(
                    {"error": {"message": f"injected {fault.status}", "type": "test"}})
                return fault.status, extra, text.encode()
            return 200, {}, json.dumps(_completion(endpoint, body, self.answer(endpoint, body))).encode()
        finally:
            self._leave()


def _completion(endpoint: str, body: dict, text: str) -> dict[str, Any]:
    if endpoint == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
        kind = "text_completion"
    return {"id": "cmpl-test", "object": kind, "created": 0, "model": body.get("model"), "choices": [choice],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


def _handler(server: FakeOpenAIServer):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  (http.server's naming)
            endpoint = ENDPOINTS.get(self.path)
            if endpoint is None:
                return self._send(404, {}, json.dumps({"error": {"message": f"no route {self.path}"}}).encode())
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, headers, payload = server.respond(endpoint, body, dict(self.headers))
            self._send(status, headers, payload)

        def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and left

        def log_message(self, *args):  # keep test output clean
            pass

    return Handler
