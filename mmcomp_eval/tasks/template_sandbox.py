"""A Jinja sandbox that also bounds how much a template may build.

Jinja's own sandbox stops a template from reaching Python internals, but not
from exhausting memory: ``{{ 'a' * 10**9 }}`` is a gigabyte, and doubling a
string in a loop or a recursive macro gets there in 30 steps. Here every way
a template can make a value grow is checked *before* the value is built,
against ``max_chars`` (the task's ``prompt.max_chars``):

* the operators ``*``, ``**``, ``+``, ``%`` and ``~`` (string/list
  repetition, big powers, concatenation, printf-style widths);
* calls of methods that pad, repeat or splice (``ljust``, ``zfill``,
  ``replace``, ``join``, ``format`` widths, ``int.to_bytes``, ...) and
  filters that do (``center``, ``indent``, ``replace``, ``join``,
  ``format``, ``wordwrap``, ``tojson``, ``batch``, ``slice``);
* every value printed with ``{{ }}``, every list or mapping handed to a
  filter (``string``, ``pprint``, ... print them), and every joined output
  buffer (templates, macros, ``{% set %}`` blocks);
* the number of loop iterations and calls per render (``MAX_STEPS``), so
  nested loops and recursive macros end.

Sizes are estimated as characters (a list counts its elements' sizes), so a
refused value is one that would print as more than the limit. Limits raise
:class:`TemplateLimitError`; the caller names the template and document.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.visitor import NodeTransformer

#: loop iterations plus calls in one render: few-shot templates use hundreds
MAX_STEPS = 1_000_000
#: integers beyond this many bits are refused (about 3,000 digits; Python prints at most 4,300)
MAX_INT_BITS = 10_000

_PERCENT = re.compile(r"%(?:\((?P<key>[^)]*)\))?[#0 +-]*(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?[hlL]?"
                      r"(?P<conv>[%a-zA-Z])")
_SPEC_NUMBER = re.compile(r"\d+")


class TemplateLimitError(SecurityError):
    """A template tried to build more than its limits allow."""


def size(value: Any, limit: int) -> int:
    """Characters ``value`` would print as (roughly), counting no further than just past ``limit``."""
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, (str, bytes, bytearray)):
            total += len(v)
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 1
        elif isinstance(v, float):
            total += 24
        elif isinstance(v, dict):
            total += 2 + 2 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(v)
            stack.extend(v)
        elif isinstance(v, range):
            total += len(v)
        else:
            total += 64  # macros, namespaces, undefined: printed short
    return total


class _BoundLoopsAndConcat(NodeTransformer):
    """Route every ``for`` iterable and every ``~`` through the environment's bounded helpers."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.EnvironmentAttribute("counted"), [node.iter], [], None, None,
                               lineno=node.iter.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("join_text"), [nodes.List(node.nodes, lineno=node.lineno)],
                          [], None, None, lineno=node.lineno)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable sandbox whose renders stay within ``max_chars`` and ``MAX_STEPS``."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *args: Any, max_chars: int, **kwargs: Any):
        super().__init__(*args, finalize=self._printable, **kwargs)
        self.max_chars = max_chars
        self.steps = 0
        self.globals.pop("lipsum", None)  # lipsum(10**9) builds a gigabyte, and no prompt needs filler
        for name, func in list(self.filters.items()):
            self.filters[name] = self._bounded_filter(name, func, _FILTER_ESTIMATES.get(name))

    def begin(self) -> None:
        """Start counting steps for a new render."""
        self.steps = 0

    # -- checks

    def _refuse_over(self, estimate: int, what: str) -> None:
        if estimate > self.max_chars:
            raise TemplateLimitError(f"{what} would build more than {self.max_chars:,} characters, the limit "
                                     "(prompt.max_chars in the task file; raise it if a prompt really is that long)")

    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateLimitError(f"more than {MAX_STEPS:,} loop iterations and calls in one render "
                                     "(nested loops, or recursion without end?)")

    def _printable(self, value: Any) -> Any:
        self._refuse_over(size(value, self.max_chars), "printing a value")
        return value

    # -- operators, output buffers, loops

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        limit = self.max_chars
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                self._refuse_over(size(seq, limit) * n if n > 0 and seq else 0, "'*' repetition")
            elif isinstance(left, int) and isinstance(right, int):
                self._refuse_big_bits(left.bit_length() + right.bit_length(), "'*'")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                self._refuse_big_bits(right * left.bit_length(), "'**'")
        elif operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                self._refuse_over(size(left, limit) + size(right, limit), "'+'")
        elif operator == "%" and isinstance(left, str):
            self._refuse_over(_percent_size(left, right, limit), "'%' formatting")
        return super().call_binop(context, operator, left, right)

    def _refuse_big_bits(self, bits: int, what: str) -> None:
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(f"{what} would give an integer of about {bits:,} bits; templates may use "
                                     f"integers of up to {MAX_INT_BITS:,} bits")

    def concat(self, pieces: Iterable[str]) -> str:  # type: ignore[override]
        """Join an output buffer, refusing before the join once it passes the limit."""
        parts, total = [], 0
        for p in pieces:
            total += len(p)
            if total > self.max_chars:
                raise TemplateLimitError(f"the output passed {self.max_chars:,} characters, the limit "
                                         "(prompt.max_chars in the task file; raise it if a prompt really is "
                                         "that long)")
            parts.append(p)
        return "".join(parts)

    def join_text(self, values: list) -> str:
        """``a ~ b``: like Jinja's ``str_join``, with the result's size checked first."""
        self._refuse_over(sum(size(v, self.max_chars) for v in values), "'~'")
        return "".join(map(str, values))

    def counted(self, iterable: Any) -> Any:
        """A ``for`` loop's iterable, each iteration counted as a step."""
        for item in iterable:
            self._step()
            yield item

    def _parse(self, source, name, filename):
        return _BoundLoopsAndConcat().visit(super()._parse(source, name, filename))

    # -- calls

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
        __self._step()
        name = getattr(__obj, "__name__", "")
        estimate = _METHOD_ESTIMATES.get(name)
        if estimate is not None and isinstance(getattr(__obj, "__self__", None), (str, bytes, int)):
            if name == "join" and args:
                args = (list(args[0]), *args[1:])  # materialise once: sized, then joined
            __self._refuse_over(estimate(__obj.__self__, __self.max_chars, *args, **kwargs), f"{name}()")
        return super().call(__context, __obj, *args, **kwargs)

    def _bounded_filter(self, name: str, func: Callable, estimate: Callable | None) -> Callable:
        """``func`` counted as a step, refusing a container that prints too long, and ``estimate``d if given.

        Strings are not sized on the way in: they already exist, and a long
        document field passed to ``truncate`` is fine. Lists and mappings are,
        because printing one whose items are shared repeats them.
        """
        value_at = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0

        @functools.wraps(func)
        def bounded(*args, **kwargs):
            self._step()
            if len(args) > value_at:
                value = args[value_at]
                if name == "join":
                    value = list(value)  # materialise once: sized, then joined
                    args = (*args[:value_at], value, *args[value_at + 1:])
                if isinstance(value, (list, tuple, dict, set, frozenset)):
                    self._refuse_over(size(value, self.max_chars), f"filter {name}")
                if estimate is not None:
                    self._refuse_over(estimate(self.max_chars, *args[value_at:], **kwargs), f"filter {name}")
            return func(*args, **kwargs)

        return bounded

    def wrap_str_format(self, value: Any):
        """``str.format``/``format_map`` through a formatter that sizes each field before formatting it."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"
        env = self

        def bounded_format(*args, **kwargs):
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one positional argument")
                args, kwargs = (), args[0]
            return type(fmt)(_BoundedFormatter(env).vformat(fmt, args, kwargs))

        return functools.update_wrapper(bounded_format, value)


class _BoundedFormatter(SandboxedFormatter):
    _env: BoundedSandbox

    def __init__(self, env: BoundedSandbox):
        super().__init__(env)
        self._total = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        env = self._env
        widest = max((int(n) for n in _SPEC_NUMBER.findall(format_spec)), default=0)
        self._total += max(widest, size(value, env.max_chars))
        env._refuse_over(self._total, "str.format()")
        return super().format_field(value, format_spec)


def _percent_size(fmt: str, args: Any, limit: int) -> int:
    """Characters ``fmt % args`` would produce: widths, precisions and the values' sizes."""
    positional = list(args) if isinstance(args, tuple) else [args]
    total, i = len(fmt), 0
    for m in _PERCENT.finditer(fmt):
        if m["conv"] == "%":
            continue
        widths = []
        for part in ("width", "prec"):
            if m[part] == "*":
                widths.append(positional[i] if i < len(positional) and isinstance(positional[i], int) else 0)
                i += 1
            elif m[part]:
                widths.append(int(m[part]))
        if m["key"] is not None and isinstance(args, dict):
            value = args.get(m["key"])
        else:
            value = positional[i] if i < len(positional) else None
            i += 1
        total += max([*widths, size(value, limit)])
        if total > limit:
            break
    return total


def _replace_size(s, old, new, count=-1) -> int:
    if not isinstance(s, (str, bytes)) or not isinstance(old, type(s)) or not isinstance(new, type(s)):
        return 0
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(len(new) - len(old), 0)


def _join_size(sep, items, limit) -> int:
    items = list(items) if isinstance(items, (list, tuple)) else []
    return len(sep) * max(len(items) - 1, 0) + sum(size(x, limit) for x in items)


def _translate_size(s, table, limit) -> int:
    values = table.values() if isinstance(table, dict) else table if isinstance(table, (list, tuple)) else ()
    longest = max((size(v, limit) for v in values if not isinstance(v, int)), default=1)
    return len(s) * max(longest, 1)


def _pad_size(s, limit, width=0, *_, **__) -> int:
    return max(len(s), width if isinstance(width, int) else 0)


#: str/bytes/int methods whose result can outgrow their arguments: (owner, limit, *args) -> estimated size
_METHOD_ESTIMATES: dict[str, Callable[..., int]] = {
    "replace": lambda s, limit, old="", new="", count=-1, **_: _replace_size(s, old, new, count),
    "join": lambda s, limit, items=(), **_: _join_size(s, items, limit),
    "expandtabs": lambda s, limit, tabsize=8, **_: len(s) + s.count("\t" if isinstance(s, str) else b"\t")
    * (tabsize if isinstance(tabsize, int) else 8),
    "translate": lambda s, limit, table=None, *rest, **_: _translate_size(s, table, limit),
    "ljust": _pad_size, "rjust": _pad_size, "center": _pad_size, "zfill": _pad_size,
    "to_bytes": lambda n, limit, length=1, *_, **__: length if isinstance(length, int) else 0,
}


def _indent_size(limit, s, width=4, *_, **__) -> int:
    n = size(s, limit)
    if n > limit:
        return n
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    return n + (str(s).count("\n") + 1) * pad


def _wordwrap_size(limit, s, width=79, *rest, wrapstring=None, **_) -> int:
    if wrapstring is None and len(rest) > 1:  # (break_long_words, wrapstring, ...)
        wrapstring = rest[1]
    n = size(s, limit)
    lines = n // max(width if isinstance(width, int) else 1, 1) + 1
    return n + lines * max(len(wrapstring) if isinstance(wrapstring, str) else 0, 1)


def _tojson_size(limit, value, indent=None, **_) -> int:
    return size(value, limit) * (1 + (indent if isinstance(indent, int) else len(str(indent or ""))))


#: filters whose result can outgrow their input: (limit, value, *args, **kwargs) -> estimated size
_FILTER_ESTIMATES: dict[str, Callable[..., int]] = {
    "replace": lambda limit, s, old="", new="", count=None, **_: size(s, limit) if size(s, limit) > limit else
    _replace_size(str(s), str(old), str(new), -1 if count is None else count),
    "join": lambda limit, items, d="", *_, **__: _join_size(str(d), items, limit),
    "format": lambda limit, s, *args, **kwargs: _percent_size(str(s), kwargs or args, limit),
    "indent": _indent_size,
    "center": lambda limit, s, width=80, **_: max(size(s, limit), width if isinstance(width, int) else 0),
    "wordwrap": _wordwrap_size,
    "tojson": _tojson_size,
    # lists of references, but a list of a billion references is 8 GB
    "batch": lambda limit, value, linecount=1, *_, **__: size(value, limit) + max(linecount, 0),
    "slice": lambda limit, value, slices=1, *_, **__: size(value, limit) + max(slices, 0),
}
