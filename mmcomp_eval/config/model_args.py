"""Parsing of ``--model-args`` strings.

Two spellings are accepted, so that simple cases stay short on a command line
while anything JSON can express stays possible:

* a JSON object, recognised by its leading ``{``::

      --model-args '{"pretrained": "x", "stop": ["\\n", "."]}'

* comma-separated ``key=value`` pairs::

      --model-args 'pretrained=/models/llama,dtype=bfloat16,batch_size=16'

  Commas split pairs only at the top level: a comma inside double quotes,
  single quotes or brackets belongs to the value (``stop=["\\n","."]``,
  ``name="a,b"``). Whitespace around keys and values is ignored. Each value
  is read as JSON when it is valid JSON -- numbers, ``true``/``false``,
  ``null``, lists, objects and double-quoted strings (with JSON escapes, so
  ``stop="\\n"`` is a newline) -- and kept as a plain string otherwise
  (``dtype=float16``, ``pretrained=/a/b``). A single-quoted value is taken
  literally, without escapes, like in a shell (``sep='a,b'``).

Keys must be Python identifiers and appear once. Anything else is a
:class:`~mmcomp_eval.errors.UserError` that quotes the offending piece.

:func:`coerce_kwargs` then checks the parsed keys against an adapter's
``__init__`` so that a typo is reported with a suggestion instead of as a
``TypeError`` deep inside model loading. Adapters that take shared options
as ``**options`` name their dataclass in an ``options_type`` attribute
(``models/local.py``); its fields are accepted and coerced like parameters.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable
from typing import Any

from mmcomp_eval.errors import UserError, did_you_mean

_CLOSERS = {"[": "]", "{": "}"}


def parse_model_args(text: str | None, flag: str = "--model-args") -> dict[str, Any]:
    """Parse a ``--model-args`` string (see the module docstring); ``flag`` names the option in errors.

    ``--gen-kwargs`` is read by the same rules.
    """
    if text is None or not text.strip():
        return {}
    text = text.strip()
    if text.startswith("{"):
        return _parse_json_object(text, flag)
    args: dict[str, Any] = {}
    pieces = _split_top_level(text, flag)
    for index, piece in enumerate(pieces):
        if not piece.strip():
            if index == len(pieces) - 1 and index > 0:
                continue  # a trailing comma is harmless
            raise UserError(f"{flag} '{text}': empty argument between commas")
        key, value = _parse_pair(piece, flag)
        if key in args:
            raise UserError(f"{flag}: duplicate key '{key}' in '{piece.strip()}'")
        args[key] = value
    return args


def _parse_json_object(text: str, flag: str) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise UserError(f"{flag}: duplicate key '{key}' in JSON object")
            out[key] = value
        return out

    try:
        obj = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        near = text[max(0, exc.pos - 10) : exc.pos + 10]
        raise UserError(f"{flag}: invalid JSON ({exc.msg} at char {exc.pos}, near '{near}')") from None
    if not isinstance(obj, dict):
        raise UserError(f"{flag}: JSON must be an object of key: value pairs")
    for key in obj:
        _check_key(key, text, flag)
    return obj


def _split_top_level(text: str, flag: str) -> list[str]:
    """Split on commas that are outside quotes and brackets."""
    pieces: list[str] = []
    start = 0
    quote: str | None = None
    stack: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1  # skip the escaped character, e.g. \" inside a JSON string
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
        elif ch in "]}":
            if not stack or stack.pop() != ch:
                raise UserError(f"{flag}: unbalanced '{ch}' in '{_piece_at(text, start)}'")
        elif ch == "," and not stack:
            pieces.append(text[start:i])
            start = i + 1
        i += 1
    if quote:
        raise UserError(f"{flag}: unterminated {quote} quote in '{text[start:].strip()}'")
    if stack:
        raise UserError(f"{flag}: missing '{stack[-1]}' in '{text[start:].strip()}'")
    pieces.append(text[start:])
    return pieces


def _piece_at(text: str, start: int) -> str:
    rest = text[start:]
    return rest.split(",", 1)[0].strip() if rest else text


def _parse_pair(piece: str, flag: str) -> tuple[str, Any]:
    if "=" not in piece:
        raise UserError(f"{flag}: '{piece.strip()}' is not key=value")
    key, raw = piece.split("=", 1)
    key = key.strip()
    _check_key(key, piece.strip(), flag)
    return key, _parse_value(raw.strip(), piece.strip(), flag)


def _check_key(key: Any, piece: str, flag: str) -> None:
    if not isinstance(key, str) or not key.isidentifier():
        raise UserError(f"{flag}: bad key '{key}' in '{piece}' (keys are identifiers like batch_size)")


class _Int(int):
    """An int that remembers how it was written, for string parameters (revision=1e5)."""

    raw: str


class _Float(float):
    raw: str


def _keep_raw(value: Any, raw: str) -> Any:
    kind = {int: _Int, float: _Float}.get(type(value))
    if kind is None:
        return value
    out = kind(value)
    out.raw = raw
    return out


def _parse_value(raw: str, piece: str, flag: str) -> Any:
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        return raw[1:-1]
    try:
        return _keep_raw(json.loads(raw), raw)
    except json.JSONDecodeError:
        pass
    if raw and raw[0] in "\"[{":
        # Looks like JSON but is not: guessing would hide the typo.
        raise UserError(f"{flag}: value in '{piece}' is not valid JSON")
    return raw


# ---------------------------------------------------------------------------


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def coerce_kwargs(target: Callable[..., Any], args: dict[str, Any]) -> dict[str, Any]:
    """Check ``args`` against ``target``'s signature and coerce simple types.

    Unknown keys get a did-you-mean; missing required arguments are named.
    Strings are converted where the annotation asks for ``bool``/``int``/
    ``float`` so that lm-eval habits (``trust_remote_code=True``) work.
    A target with an ``options_type`` dataclass also accepts its fields
    (they reach it through ``**options``).
    """
    owner = getattr(target, "name", None) or getattr(target, "__name__", "model")
    params, hints, takes_any = _accepted(target)
    out: dict[str, Any] = {}
    for key, value in args.items():
        if key not in params:
            if takes_any:
                out[key] = value
                continue
            raise UserError(
                f"unknown model argument '{key}' for '{owner}'{did_you_mean(key, params)}; "
                f"accepted: {', '.join(sorted(params))}"
            )
        out[key] = _coerce(key, value, hints.get(key), owner)
    missing = [name for name, required in params.items() if required and name not in out]
    if missing:
        raise UserError(f"model '{owner}' needs --model-args {missing[0]}=...")
    return out


def accepted_arguments(target: Callable[..., Any]) -> frozenset[str]:
    """The model argument names ``target`` takes (its parameters and its ``options_type`` fields)."""
    return frozenset(_accepted(target)[0])


def _accepted(target: Callable[..., Any]) -> tuple[dict[str, bool], dict[str, Any], bool]:
    """(name -> required, type hints, whether any other name is accepted too) of ``target``'s arguments."""
    sig = inspect.signature(target)
    params = {
        name: p.default is p.empty
        for name, p in sig.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    hints = _type_hints(target)
    options = getattr(target, "options_type", None)
    if dataclasses.is_dataclass(options):  # **options takes exactly these fields
        for f in dataclasses.fields(options):
            params.setdefault(f.name, f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        hints = {**_type_hints(options), **hints}
        takes_any = False
    return params, hints, takes_any


def _type_hints(target: Callable[..., Any]) -> dict[str, Any]:
    fn = target.__init__ if inspect.isclass(target) and not dataclasses.is_dataclass(target) else target
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: skip coercion, keep checking names
        return {}


def _coerce(key: str, value: Any, hint: Any, owner: str) -> Any:
    wanted, optional = _scalar_types(hint)
    if not wanted:
        return value
    if value is None:
        if optional:
            return value
    elif isinstance(value, bool):
        if bool in wanted:
            return value
    elif hasattr(value, "raw") and str in wanted and not {int, float} & set(wanted):
        return value.raw  # a string parameter keeps the text as typed: revision=1e5 stays '1e5'
    elif type(value) in (_Int, _Float) and type(value).__mro__[1] in wanted:
        return type(value).__mro__[1](value)
    elif type(value) in wanted:
        return value
    elif bool in wanted and str(value).lower() in _TRUE | _FALSE:
        return str(value).lower() in _TRUE
    else:
        for kind in (int, float):
            if kind in wanted and isinstance(value, (int, float, str)):
                try:
                    converted = kind(value)
                except ValueError:
                    continue
                if converted == float(value):
                    return converted
        if str in wanted and isinstance(value, (int, float)):
            return str(value)
    names = "/".join(t.__name__ for t in wanted)
    raise UserError(f"model argument {key}={value!r} for '{owner}' must be {names}")


def _scalar_types(hint: Any) -> tuple[list[type], bool]:
    """The scalar types an annotation admits and whether it admits None.

    An annotation with any other type in it (lists, classes) yields no
    types, meaning 'do not check': the adapter validates those itself.
    """
    if hint is None or hint is Any:
        return [], True
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = typing.get_args(hint) if union else (hint,)
    if any(m not in (bool, int, float, str, type(None)) for m in members):
        return [], True
    return [m for m in members if m is not type(None)], type(None) in members


class ArgumentOptions:
    """Base of an adapter's options dataclass: built from ``--model-args`` with one-line errors for unknown names.

    The adapters' option types (local weights, vLLM engines, API servers)
    share nothing but this rule, so it lives here rather than in any of them.
    """

    @classmethod
    def from_arguments(cls, owner: str, args: typing.Mapping[str, Any]) -> Any:
        """Options from keyword arguments; an unknown name is a one-line error with a suggestion."""
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        for key in args:
            if key not in names:
                raise UserError(f"unknown model argument '{key}' for '{owner}'{did_you_mean(key, names)}")
        return cls(**args)
