"""The import structure docs/architecture.md describes: no cycles, and ``api`` at the bottom.

Read from the source with ``ast`` rather than by importing, so that an import
hidden in a function that no test calls still counts. Imports under
``if TYPE_CHECKING:`` never run and are left out: they only name types.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mmcomp_eval"


@dataclass(frozen=True)
class Import:
    importer: str  # a module, e.g. "mmcomp_eval.tasks.index"
    imported: str  # a module or package, e.g. "mmcomp_eval.config.task_config"
    deferred: bool  # inside a function: runs when it is called, not when the importer loads
    where: str  # file:line, for messages

    @property
    def units(self) -> tuple[str, str]:
        return unit(self.importer), unit(self.imported)


def unit(module: str) -> str:
    """The package (``tasks``) or top-level module (``errors``) a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mmcomp_eval"


def module_files() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def package_imports() -> list[Import]:
    modules = module_files()
    return [imp for module, path in modules.items() for imp in _scan(module, path, set(modules))]


def _scan(module: str, path: Path, modules: set[str]) -> list[Import]:
    found: list[Import] = []
    is_package = path.name == "__init__.py"
    where = path.relative_to(PACKAGE.parent)

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, deferred)
                continue
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package holding this module
                    anchor = module.split(".")[:len(module.split(".")) - child.level + is_package]
                    base = ".".join([*anchor, *([child.module] if child.module else [])])
                # "from pkg import sub" imports the submodule pkg.sub when there is one
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
            else:
                visit(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
                continue
            found.extend(Import(module, n, deferred, f"{where}:{child.lineno}") for n in names
                         if n.split(".")[0] == "mmcomp_eval" and n != module)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


IMPORTS = package_imports()


def _cycle(edges: list[tuple[str, str]]) -> list[str] | None:
    """One cycle of the directed graph, in import order (a imports b imports ... a), or None."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str] | None:
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done and (found := walk(nxt, path)):
                return found
        path.pop()
        done.add(node)
        return None

    return next((c for n in sorted(graph) if n not in done and (c := walk(n, []))), None)


def test_the_scan_sees_the_imports_it_should():
    """Guards the parser itself: a few imports known to exist, eager and deferred."""
    seen = {(i.importer, i.imported, i.deferred) for i in IMPORTS}
    assert ("mmcomp_eval.tasks.index", "mmcomp_eval.config.task_config", False) in seen
    assert ("mmcomp_eval.models", "mmcomp_eval.models.hf", False) in seen  # "from mmcomp_eval.models import hf"
    assert ("mmcomp_eval.cli.run", "mmcomp_eval.tasks.loaders", True) in seen  # inside cmd_validate
    # api/model.py names TaskConfig under TYPE_CHECKING only
    assert not any(i.importer == "mmcomp_eval.api.model" and unit(i.imported) == "config" for i in IMPORTS)


def test_no_module_imports_itself_back_when_it_loads():
    """A cycle of module-level imports means one module runs while another is half-initialised."""
    cycle = _cycle([(i.importer, i.imported) for i in IMPORTS if not i.deferred])
    assert cycle is None, " -> ".join(cycle)


def test_packages_form_layers_even_counting_imports_inside_functions():
    """Package A uses B and B uses A (even lazily) means the two are one unit split in two."""
    edges = [i.units for i in IMPORTS if i.units[0] != i.units[1]]
    cycle = _cycle(edges)
    if cycle:
        steps = zip(cycle, cycle[1:])
        detail = [next(i.where for i in IMPORTS if i.units == step) for step in steps]
        raise AssertionError(f"package cycle {' -> '.join(cycle)} (imports at {', '.join(detail)})")


def test_api_imports_nothing_from_the_rest_of_the_package():
    """Every other package builds on the contracts in api/; api depending on one of them would knot the layers."""
    outside = [f"{i.where} imports {i.imported}" for i in IMPORTS if unit(i.importer) == "api" and unit(i.imported) != "api"]
    assert outside == []
