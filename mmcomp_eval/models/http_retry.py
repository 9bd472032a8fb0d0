"""POST a JSON body and read a JSON answer, retrying what a busy server may fail transiently.

Served models fail in two ways. Some failures say nothing about the request
(429 rate limits, 5xx overloads, a timeout, a connection refused while a
local server restarts): sending the very same request again later is the
remedy, so they are retried with exponential backoff and jitter, honouring a
``Retry-After`` header, each wait capped. Other failures are about the request
or the account (400 bad field, 401 key, 404 model): retrying cannot help, so
they end the run at once with the server's own message.

Only the standard library is used (``urllib``): no new dependency for an
adapter whose work is waiting on a socket. Each call opens its own
connection, so threads share an opener safely.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mmcomp_eval.errors import UserError

log = logging.getLogger(__name__)

#: HTTP statuses below 500 that mean "try again later" (request timeout, rate limit); every 5xx does too
RETRYABLE_STATUS = frozenset({408, 429})
#: longest piece of a server's error body quoted in an error line
QUOTE_CHARS = 300


class Cancelled(Exception):
    """Another request of the same call failed; this one stopped waiting instead of retrying."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently one request is retried."""

    #: retries after the first attempt (0: fail on the first transient error)
    max_retries: int = 5
    #: seconds of the first wait; each further retry doubles it
    backoff_base: float = 1.0
    #: no single wait is longer than this (``Retry-After`` included)
    backoff_max: float = 60.0
    #: seconds one attempt may take (connecting and reading the whole answer)
    timeout: float = 120.0

    def problem(self) -> str | None:
        """What is wrong with these values, as ``field=value: why``; None when usable."""
        if self.max_retries < 0:
            return f"max_retries={self.max_retries}: must be 0 or more"
        if self.backoff_base < 0 or self.backoff_max < 0:
            return "backoff_base and backoff_max must be 0 or more seconds"
        if not self.timeout > 0:
            return f"timeout={self.timeout}: must be more than 0 seconds"
        return None

    def wait(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first).

        "Equal jitter": half of the exponential step is fixed and half random,
        so clients that failed together spread out without any of them
        retrying at once. A server's ``Retry-After`` is a floor, still capped.
        """
        step = min(self.backoff_max, self.backoff_base * 2 ** (retry - 1))
        wait = step / 2 + rng.uniform(0, step / 2)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.backoff_max))
        return wait


@dataclass
class RetryStats:
    """What retrying cost a run (thread-safe counters)."""

    retries: int = 0
    waited_s: float = 0.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, wait: float) -> None:
        with self._lock:
            self.retries += 1
            self.waited_s += wait


class JsonPoster:
    """POSTs JSON to one server with a :class:`RetryPolicy`; ``who`` names the model in messages."""

    def __init__(self, who: str, policy: RetryPolicy, headers: Mapping[str, str], use_proxies: bool):
        self.who = who
        self.policy = policy
        self.headers = {"Content-Type": "application/json", "Accept": "application/json", **headers}
        # a server on this machine is reached directly, whatever HTTP(S)_PROXY says
        handlers = [] if use_proxies else [urllib.request.ProxyHandler({})]
        self.opener = urllib.request.build_opener(*handlers)
        self.stats = RetryStats()
        self._rng = random.Random()  # jitter only spreads retries out; it never changes an answer
        self._rng_lock = threading.Lock()

    def post(self, url: str, body: Mapping[str, Any], cancelled: threading.Event,
             headers: Mapping[str, str] | None = None) -> Any:
        """The decoded JSON answer; a :class:`UserError` once retrying cannot help or is used up.

        ``cancelled`` set (another request of the call failed, or the run is
        stopping) ends the wait between retries with :class:`Cancelled`.
        """
        data = json.dumps(body).encode()
        headers = {**self.headers, **(headers or {})}
        retry = 0
        while True:
            if cancelled.is_set():
                raise Cancelled()
            outcome, retry_after = self._attempt(url, data, headers)
            if not isinstance(outcome, _Transient):
                return outcome
            if retry >= self.policy.max_retries:
                raise UserError(f"{self.who}: {url} failed {retry + 1} times, last with {outcome.reason}; "
                                "the server is overloaded or down: rerun later (answers so far are kept), "
                                "or raise max_retries/timeout")
            retry += 1
            with self._rng_lock:
                wait = self.policy.wait(retry, retry_after, self._rng)
            self.stats.add(wait)
            log.warning("%s: %s from %s; retry %d/%d in %.1f s", self.who, outcome.reason, url, retry,
                        self.policy.max_retries, wait)
            if cancelled.wait(wait):
                raise Cancelled()

    def _attempt(self, url: str, data: bytes, headers: Mapping[str, str]) -> tuple[Any, float | None]:
        """(decoded answer, None), or (:class:`_Transient`, Retry-After seconds) for a failure worth retrying."""
        request = urllib.request.Request(url, data=data, headers=dict(headers), method="POST")
        try:
            with self.opener.open(request, timeout=self.policy.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = _server_message(exc)
            if exc.code in RETRYABLE_STATUS or exc.code >= 500:
                return _Transient(f"HTTP {exc.code}{detail and ': ' + detail}"), _retry_after(exc.headers)
            raise UserError(f"{self.who}: {url} answered HTTP {exc.code}{detail and ': ' + detail}"
                            f"{_hint(exc.code)}") from None
        except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets, TLS: the network, not us
            reason = getattr(exc, "reason", None) or exc
            return _Transient(f"{type(reason).__name__} ({reason})"), None
        try:
            return json.loads(payload), None
        except ValueError:
            raise UserError(f"{self.who}: {url} answered with something that is not JSON: "
                            f"{payload[:QUOTE_CHARS]!r}; is base_url an OpenAI-compatible server?") from None


@dataclass(frozen=True)
class _Transient:
    reason: str


def _server_message(exc: urllib.error.HTTPError) -> str:
    """The server's error text: OpenAI's ``{"error": {"message": ...}}`` when it is that, else the raw body."""
    try:
        raw = exc.read().decode("utf-8", "replace")
    except Exception:  # noqa: BLE001  (a body that cannot be read leaves the status code to speak)
        return ""
    try:
        obj = json.loads(raw)
        message = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(message, dict):
            message = message.get("message", message)
        raw = str(message)
    except ValueError:
        pass
    raw = " ".join(raw.split())
    return raw[:QUOTE_CHARS] + ("..." if len(raw) > QUOTE_CHARS else "")


def _retry_after(headers) -> float | None:
    """``Retry-After`` in seconds (the HTTP-date form is ignored: the backoff applies instead)."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


#: what to do about the statuses a misconfigured client gets
_HINTS = {
    401: " -- set the API key in the environment variable named by api_key_env (default OPENAI_API_KEY)",
    403: " -- the API key lacks access to this model or endpoint",
    404: " -- check base_url (it usually ends in /v1) and the model name the server knows",
}


def _hint(status: int) -> str:
    return _HINTS.get(status, "")
