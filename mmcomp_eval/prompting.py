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
and the sandbox blocks attribute access to Python internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.request import ChatMessage
from mmcomp_eval.errors import UserError

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


class PromptTemplate:
    def __init__(self, path: Path):
        self.path = Path(path)
        env = ImmutableSandboxedEnvironment(
            loader=jinja2.FileSystemLoader(str(self.path.parent)),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=False,
        )
        try:
            self._template = env.get_template(self.path.name)
        except jinja2.TemplateSyntaxError as exc:
            raise UserError(f"{self.path}:{exc.lineno}: template syntax error: {exc.message}") from None

    @property
    def source(self) -> str:
        return self.path.read_text(encoding="utf-8")

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
        try:
            text = self._template.render(ctx)
            in_text_order = tuple(images)
            messages = self._chat(ctx) if chat else None
        except jinja2.UndefinedError as exc:
            raise UserError(f"{self.path}: {exc.message} while rendering document {doc.id}; "
                            "check the template's variable names against the document fields") from None
        except jinja2.exceptions.SecurityError as exc:
            raise UserError(f"{self.path}: template tried an unsafe operation ({exc})") from None
        except jinja2.TemplateNotFound as exc:  # include/import of a file outside the template's folder
            raise UserError(f"{self.path}: template '{exc.name}' not found next to {self.path.name}") from None
        except OverflowError as exc:  # the sandbox's cap on range()
            raise UserError(f"{self.path}: {exc} while rendering document {doc.id}") from None
        return RenderedPrompt(text.strip(), messages, in_text_order)

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
        module = self._template.make_module({"image": lambda d, i: IMAGE_PLACEHOLDER, "doc": fields,
                                             "shots": [], "instruction": ""})
        return str(module.answer(dict(doc.fields))).strip()
