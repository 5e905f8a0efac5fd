"""Small argument helpers shared by the parser and the sub-commands that add their own flags (kept apart
from parser.py, which imports those sub-commands to register them)."""

from __future__ import annotations

import argparse


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_verbosity(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """-q / -v, accepted before and after the command name (the command's own flags win)."""
    default = {"default": False} if top else {"default": argparse.SUPPRESS}
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors (no progress bars)", **default)
    parser.add_argument("-v", "--verbose", action="count", help="more detail on stderr",
                        default=0 if top else argparse.SUPPRESS)  # fmt: skip
