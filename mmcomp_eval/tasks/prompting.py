"""Rendering prompts from Jinja templates in a sandbox.

A template is a whole prompt: it sees ``instruction``, ``shots`` (the
few-shot documents' fields, in order) and ``doc`` (the query). It must also
define two macros, ``input(doc)`` and ``answer(doc)``, so that the same file
can be rendered as chat turns (system = instruction, one user/assistant pair
per shot, the query as the last user turn) when a model is prompted through
its tokenizer's chat template.

Templates call ``image(doc, i)`` to place the keyframe of clip ``i``; the
call emits ``<image>`` and records which image goes there, so images always
travel in prompt order. Undefined variables are errors (strict undefined),
the sandbox blocks attribute access to Python internals and bounds what a
template may build (``mmcomp_eval.tasks.template_sandbox``), and every failure
while rendering -- a limit, ``{{ 1/0 }}``, a syntax error in an included
file -- is one line naming the template file, its line and the document.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.loaders import split_template_path

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.request import ChatMessage
from mmcomp_eval.errors import UserError
from mmcomp_eval.config.task_config import DEFAULT_MAX_PROMPT_CHARS
from mmcomp_eval.tasks.template_sandbox import BoundedSandbox, TemplateLimitError
from mmcomp_eval.textfiles import read_text

IMAGE_PLACEHOLDER = "<image>"


@dataclass(frozen=True)
class ImageRef:
    """The keyframe of clip ``clip`` of document ``doc_id``, resolved by the media layer."""

    doc_id: str
    clip: int


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    messages: tuple[ChatMessage, ...] | None
    images: tuple[ImageRef, ...]


class _Utf8Loader(jinja2.FileSystemLoader):
    """Templates next to the task's template; a non-UTF-8 byte is a one-line error naming file and line."""

    def get_source(self, environment, template):
        try:
            return super().get_source(environment, template)
        except UnicodeDecodeError:
            read_text(Path(self.searchpath[0], *split_template_path(template)))  # raises the UserError
            raise


class PromptTemplate:
    def __init__(self, path: Path, *, max_chars: int = DEFAULT_MAX_PROMPT_CHARS):
        self.path = Path(path)
        self._env = BoundedSandbox(
            loader=_Utf8Loader(str(self.path.parent)),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=False,
            max_chars=max_chars,
        )
        try:
            self._template = self._env.get_template(self.path.name)
        except jinja2.TemplateSyntaxError as exc:
            raise UserError(f"{self.path}:{exc.lineno}: template syntax error: {exc.message}") from None

    @property
    def source(self) -> str:
        return read_text(self.path)

    def render(self, doc: Document, shots: Sequence[Document], instruction: str, *,
               chat: bool = False) -> RenderedPrompt:
        images: list[ImageRef] = []
        doc_fields, shot_fields = dict(doc.fields), [dict(s.fields) for s in shots]
        # Templates see plain dicts; map each back to its document's id (the
        # task's id_field, not necessarily a field called "id").
        owner = {id(f): d.id for f, d in zip([doc_fields, *shot_fields], [doc, *shots])}

        def image(d, i: int) -> str:
            if id(d) not in owner:
                raise UserError(f"{self.path}: image() takes `doc` or a shot from `shots`, got {type(d).__name__}")
            images.append(ImageRef(owner[id(d)], int(i)))
            return IMAGE_PLACEHOLDER

        ctx = {"doc": doc_fields, "shots": shot_fields, "instruction": instruction, "image": image}
        self._env.begin()
        try:
            text = self._template.render(ctx)
            in_text_order = tuple(images)
            messages = self._chat(ctx) if chat else None
        except Exception as exc:  # noqa: BLE001 -- any failure inside a user's template is the user's to fix
            raise self._render_error(exc, doc.id) from None
        return RenderedPrompt(text.strip(), messages, in_text_order)

    def _render_error(self, exc: Exception, doc_id: str) -> UserError:
        """One line for an exception raised while rendering: template file and line, document, fix."""
        if isinstance(exc, UserError):
            return exc
        where = self._template_line(exc)
        during = f"while rendering document {doc_id}"
        if isinstance(exc, jinja2.TemplateSyntaxError):  # in an {% include %}d file, compiled only now
            return UserError(f"{exc.filename or where}:{exc.lineno}: template syntax error: {exc.message} "
                             f"(included from {self.path.name})")
        if isinstance(exc, jinja2.UndefinedError):
            return UserError(f"{where}: {exc.message} {during}; "
                             "check the template's variable names against the document fields")
        if isinstance(exc, TemplateLimitError):
            return UserError(f"{where}: {during}, {exc}")
        if isinstance(exc, jinja2.exceptions.SecurityError):
            return UserError(f"{where}: template tried an unsafe operation ({exc}) {during}")
        if isinstance(exc, jinja2.TemplateNotFound):  # include/import of a file outside the template's folder
            return UserError(f"{where}: template '{exc.name}' not found next to {self.path.name}")
        if isinstance(exc, RecursionError):
            return UserError(f"{where}: the template includes or calls itself without end {during}")
        return UserError(f"{where}: {during}, {type(exc).__name__}: {exc}; fix the template")

    def _template_line(self, exc: Exception) -> str:
        """``file:line`` of the innermost template frame (Jinja rewrites tracebacks to template lines)."""
        folder = str(self.path.parent)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(folder)
                  and not f.filename.endswith(".py")]
        return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else str(self.path)

    def _chat(self, ctx: dict):
        """The turns, from the very field dicts of ``ctx``: ``image()`` knows documents by those objects."""
        module = self._template.make_module(ctx)
        if not hasattr(module, "input") or not hasattr(module, "answer"):
            raise UserError(f"{self.path}: chat prompting needs macros 'input(doc)' and 'answer(doc)' in the template")
        messages = [ChatMessage("system", ctx["instruction"])] if ctx["instruction"] else []
        for s in ctx["shots"]:
            messages.append(ChatMessage("user", str(module.input(s)).strip()))
            messages.append(ChatMessage("assistant", str(module.answer(s)).strip()))
        messages.append(ChatMessage("user", str(module.input(ctx["doc"])).strip()))
        return tuple(messages)

    def answer(self, doc: Document) -> str:
        """The template's rendering of a document's answer (used to check templates)."""
        fields = dict(doc.fields)
        self._env.begin()
        try:
            module = self._template.make_module({"image": lambda d, i: IMAGE_PLACEHOLDER, "doc": fields,
                                                 "shots": [], "instruction": ""})
            return str(module.answer(dict(doc.fields))).strip()
        except Exception as exc:  # noqa: BLE001 -- as in render()
            raise self._render_error(exc, doc.id) from None
