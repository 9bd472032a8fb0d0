"""User-facing errors.

Every mistake a user can make (a bad path, a malformed row, an unknown task)
is raised as :class:`UserError` with one line that names the culprit and the
fix. The CLI prints that line and exits with code 2; anything else is a bug in
mmcomp-eval and keeps its traceback so it can be reported.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A problem with the user's input, reported as one line (exit code 2)."""

    exit_code = 2

    def __init__(self, message: str):
        # Collapse to one line: the CLI contract is a single line per error.
        super().__init__(" ".join(str(message).split()))


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
