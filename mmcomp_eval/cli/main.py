"""Command line entry point.

``mmcomp-eval --model M --tasks T`` runs an evaluation (the ``run``
subcommand is implied when the first argument is an option); other
subcommands build data, list registries and validate task files. Every
:class:`UserError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from mmcomp_eval.version import __version__
from mmcomp_eval.errors import UserError

SUBCOMMANDS = ("run", "data", "ls", "validate", "perturb", "retrieval", "retrieval-report", "compare")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="mmcomp-eval",
        description="Evaluate compositional generalisation of (multimodal) language models.",
    )
    parser.add_argument("--version", action="version", version=f"mmcomp-eval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from mmcomp_eval.cli import compare as cli_compare
    from mmcomp_eval.cli import data as cli_data
    from mmcomp_eval.cli import perturb as cli_perturb
    from mmcomp_eval.cli import retrieval as cli_retrieval
    from mmcomp_eval.cli import run as cli_run

    cli_run.add_parsers(sub)
    cli_data.add_parser(sub)
    cli_perturb.add_parser(sub)
    cli_retrieval.add_parsers(sub)
    cli_compare.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"mmcomp-eval: error: {exc}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        print("mmcomp-eval: interrupted", file=sys.stderr)
        return 130
