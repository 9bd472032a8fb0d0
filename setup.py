"""Build step: copy the top-level ``tasks/`` and ``prompts/`` into the wheel.

The design keeps the built-in task YAML and prompt templates at the top of
the repository, where users read and copy them; setuptools only ships files
inside a package. So building a wheel copies both folders to
``mmcomp_eval/_builtin/`` (``mmcomp_eval.paths.builtin_dir`` finds them there).
Nothing is copied for an editable install or a source checkout: those read the
top-level folders directly, which stay the one place they are edited.
Everything else about the package is declared in ``pyproject.toml``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUILTIN_FOLDERS = ("tasks", "prompts")  # the names mmcomp_eval.paths.builtin_dir is asked for


class BuildPyWithBuiltins(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        shipped = Path(self.build_lib, "mmcomp_eval", "_builtin")
        shutil.rmtree(shipped, ignore_errors=True)  # a task deleted since an earlier build must not ship
        for folder in BUILTIN_FOLDERS:
            src_root = Path(folder)
            for src in sorted(src_root.rglob("*")):
                rel = src.relative_to(src_root)
                if not src.is_file() or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
                    continue
                dest = shipped / folder / rel
                self.mkpath(str(dest.parent))
                self.copy_file(str(src), str(dest))


setup(cmdclass={"build_py": BuildPyWithBuiltins})
