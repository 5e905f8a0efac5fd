"""The ``lowbit`` command: ``lowbit {train,test,transform,stats-to-config,formats,export,report} ...``.

Thin: it parses, merges options (default < TOML < command line), prints the effective configuration and
calls :mod:`lowbit.pipeline`. Any error a user can cause ends the command with ONE line on stderr and exit
status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from lowbit.errors import LowbitError

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    from lowbit.cli.parser import UsageError, build_parser

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        return int(args.command_function(args) or 0)
    except UsageError as error:
        return _fail(str(error), debug, error)
    except LowbitError as error:
        return _fail(str(error), debug, error)
    except (OSError, ImportError) as error:  # a missing file / folder, an extra that is not installed
        return _fail(f"{type(error).__name__}: {error}", debug, error)
    except KeyboardInterrupt:
        print("lowbit: interrupted", file=sys.stderr)
        return 130


def _fail(message: str, debug: bool, error: BaseException) -> int:
    if debug:
        raise error
    first_line = " ".join(message.split()) if message else type(error).__name__
    print(f"lowbit: error: {first_line}", file=sys.stderr)
    return EXIT_USAGE


def is_rank_zero() -> bool:
    """False in the extra processes a multi-process (DDP) run starts: they print nothing."""
    return all(os.environ.get(name, "0") == "0" for name in ("LOCAL_RANK", "NODE_RANK"))


__all__ = ["EXIT_USAGE", "is_rank_zero", "main"]
