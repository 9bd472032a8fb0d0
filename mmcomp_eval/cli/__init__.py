"""The command line: argument parsing only; each subcommand calls into the library."""

from mmcomp_eval.cli.main import main

__all__ = ["main"]
