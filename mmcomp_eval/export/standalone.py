"""One self-contained Python file from modules written to stand alone (an "amalgamation").

lm-eval loads a task's ``!function utils.x`` from the file ``utils.py`` next
to the task YAML, by path, without adding its folder to ``sys.path``: helper
modules beside it cannot be imported, and mmcomp-eval need not be installed
where lm-eval runs. So the export writes one file holding the very source of
a few modules of ours, in order. Those modules import only the standard
library (or third-party packages, lazily inside functions) and names from
modules earlier in the list, by plain ``from mmcomp_eval.x import a, b``
lines, which are dropped here because the names are then defined above them.
Anything else (an ``import mmcomp_eval``, an alias, an import of a module not
earlier in the list, the same top-level name defined twice) is a bug in
those modules and raises ``RuntimeError``.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Sequence
from pathlib import Path


def amalgamate(modules: Sequence[str], header: str) -> str:
    """The source of ``modules`` (dotted names) as one module, after ``header`` (comment lines)."""
    parts = [header.rstrip("\n"), "", "from __future__ import annotations", ""]
    defined: dict[str, str] = {}
    for position, name in enumerate(modules):
        path = Path(importlib.import_module(name).__file__)
        parts.append(_standalone_source(name, path, set(modules[:position]), defined))
    text = "\n".join(parts).rstrip("\n") + "\n"
    compile(text, "utils.py", "exec")
    return text


def _standalone_source(name: str, path: Path, earlier: set[str], defined: dict[str, str]) -> str:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines()
    drop: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mmcomp_eval" for a in node.names):
            raise RuntimeError(f"{path}:{node.lineno}: `import mmcomp_eval...` cannot be inlined; use `from ... import`")
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mmcomp_eval":
            if node not in tree.body or node.module not in earlier or any(a.asname for a in node.names):
                raise RuntimeError(f"{path}:{node.lineno}: imports {node.module}, which is not inlined before it "
                                   "(or imports it inside a function, or renames a name)")
            drop.update(range(node.lineno, node.end_lineno + 1))
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            drop.update(range(node.lineno, node.end_lineno + 1))
    docstring = ast.get_docstring(tree)
    first = tree.body[0] if tree.body else None
    if docstring is not None and first is not None:
        drop.update(range(first.lineno, first.end_lineno + 1))
    for node in tree.body:
        for top in _top_level_names(node):
            if top in defined:
                raise RuntimeError(f"{path}:{node.lineno}: '{top}' is also defined by {defined[top]}")
            defined[top] = name
    kept = [line for number, line in enumerate(lines, 1) if number not in drop]
    banner = [f"# {'-' * 76}", f"# {name} ({name.replace('.', '/')}.py)"]
    banner += [f"#   {line}".rstrip() for line in (docstring or "").splitlines()]
    banner.append(f"# {'-' * 76}")
    return "\n".join([*banner, *_trim_blank(kept), "", ""])


def _top_level_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _trim_blank(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines
