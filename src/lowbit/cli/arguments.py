"""Small argument helpers shared by the parser and the sub-commands that add their own flags (kept apart
from parser.py, which imports those sub-commands to register them)."""

from __future__ import annotations

import argparse
import os
import stat

from lowbit.errors import ConfigError


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


def check_input_file(path: str, what: str) -> None:
    """``path`` must be a regular file: reading a FIFO or a device could block forever, a folder is a mistake."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"cannot read {what} file {path}: it does not exist") from None
    except OSError as error:
        raise ConfigError(f"cannot read {what} file {path}: {error.strerror}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{what} {path} is a folder, not a TOML file")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{what} {path} is not a regular file (a pipe or a device); give a TOML file")
