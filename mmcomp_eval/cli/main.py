"""Command line entry point.

``mmcomp-eval --model M --tasks T`` runs an evaluation (the ``run``
subcommand is implied when the first argument is an option); other
subcommands build data, list registries, validate task files and export
tasks to lm-evaluation-harness. Every :class:`UserError`, and every mistake
argparse finds in the command line, becomes one line on stderr and exit
code 2; an unknown flag gets the closest known one as a suggestion.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import sys

from mmcomp_eval.version import __version__
from mmcomp_eval.errors import UserError

SUBCOMMANDS = ("run", "data", "ls", "validate", "perturb", "retrieval", "retrieval-report", "compare", "export")


class CommandLineError(Exception):
    """What argparse would print with the usage text and exit on; turned into one line by :func:`main`."""

    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser = parser


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors come back to :func:`main` instead of exiting (subparsers inherit it)."""

    def error(self, message: str):
        raise CommandLineError(self, message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        allow_abbrev=False,
        prog="mmcomp-eval",
        description="Evaluate compositional generalisation of (multimodal) language models.",
    )
    parser.add_argument("--version", action="version", version=f"mmcomp-eval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from mmcomp_eval.cli import compare as cli_compare
    from mmcomp_eval.cli import data as cli_data
    from mmcomp_eval.cli import export as cli_export
    from mmcomp_eval.cli import perturb as cli_perturb
    from mmcomp_eval.cli import retrieval as cli_retrieval
    from mmcomp_eval.cli import run as cli_run

    cli_run.add_parsers(sub)
    cli_data.add_parser(sub)
    cli_perturb.add_parser(sub)
    cli_retrieval.add_parsers(sub)
    cli_compare.add_parser(sub)
    cli_export.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]
    parser = build_parser()
    handler, logger = None, logging.getLogger("mmcomp_eval")
    level = logger.level
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            raise UserError(unknown_arguments(parser, argv, extra))
        if hasattr(args, "verbosity"):  # commands that report their stages (run)
            handler = log_to_stderr(args.verbosity)
        return int(args.func(args) or 0)
    except CommandLineError as exc:
        print(f"mmcomp-eval: error: {' '.join(str(exc).split())}; see `{exc.parser.prog} --help`", file=sys.stderr)
        return UserError.exit_code
    except UserError as exc:
        print(f"mmcomp-eval: error: {exc}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        print("mmcomp-eval: interrupted", file=sys.stderr)
        return 130
    finally:
        if handler is not None:
            logger.removeHandler(handler)
            logger.setLevel(level)


def unknown_arguments(parser: argparse.ArgumentParser, argv: list[str], extra: list[str]) -> str:
    """One line for arguments no parser took: the first unknown flag and the closest known one."""
    command = _subcommand(parser, argv)
    flag = next((e.split("=", 1)[0] for e in extra if e.startswith("-")), None)
    where = f"`mmcomp-eval {command.prog.split()[-1]} --help`" if command else "`mmcomp-eval --help`"
    if flag is None:
        return f"unexpected argument {extra[0]!r}; see {where}"
    known = [s for a in (command or parser)._actions for s in a.option_strings if s.startswith("--")]
    return f"unrecognized argument '{flag}'{did_you_mean_flag(flag, known)}; see {where}"


def _subcommand(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and argv and argv[0] in action.choices:
            return action.choices[argv[0]]
    return None


def did_you_mean_flag(flag: str, known: list[str]) -> str:
    """`` (did you mean '--x'?)``; '-' and '_' count as the same (lm-eval writes ``--num_fewshot``)."""
    def canon(s: str) -> str:
        return s.lower().replace("_", "-")

    by_canon: dict[str, str] = {}
    for k in known:
        by_canon.setdefault(canon(k), k)
    close = difflib.get_close_matches(canon(flag), list(by_canon), n=1, cutoff=0.6)
    if not close:
        return ""
    # among the spellings of the closest flag, the one written like the user's
    same_style = [k for k in known if canon(k) == close[0] and (("_" in k) == ("_" in flag))]
    return f" (did you mean '{same_style[0] if same_style else by_canon[close[0]]}'?)"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (tests swap it between calls)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def log_to_stderr(level: str) -> logging.Handler:
    """mmcomp-eval's own log lines (a line per stage at INFO) on stderr for one command; the handler to remove.

    Only the command line does this: as a library (``mmcomp_eval.evaluate``)
    mmcomp-eval leaves logging to its caller, like any library. Other
    libraries' loggers are left alone.
    """
    logger = logging.getLogger("mmcomp_eval")
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
