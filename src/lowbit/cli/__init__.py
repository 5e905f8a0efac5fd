"""The ``lowbit`` command: ``lowbit {train,test,transform,report,export,formats,stats-to-config} ...``.

Thin: it parses, merges options (default < TOML < command line), prints the effective configuration and
calls :mod:`lowbit.pipeline`. Any error ends the command with ONE line on stderr (``--debug`` shows the
traceback instead) and an exit status that says whose problem it is:

- 2: usage or configuration errors (bad flags, bad TOML, bad values, unknown names: fix the command);
- 1: runtime failures (a model producing NaN, an export or a file write failing, a missing extra, a bug);
- 130: interrupted (Ctrl-C).

``-q`` keeps only warnings and errors on stderr (and no progress bars); ``-v`` adds details.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from lowbit.errors import ConfigError, FormatError, LowbitError, UsageError

EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        from lowbit.cli.parser import build_parser

        args = build_parser().parse_args(argv)
        _check_environment()
        with _messages(args):
            return int(args.command_function(args) or 0)
    except KeyboardInterrupt:
        print("lowbit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UsageError, ConfigError, FormatError) as error:
        return _fail(str(error), debug, error, EXIT_USAGE)
    except LowbitError as error:
        return _fail(str(error), debug, error, EXIT_FAILURE)
    except (OSError, ImportError) as error:  # a file that cannot be written, an extra that is not installed
        return _fail(f"{type(error).__name__}: {error}", debug, error, EXIT_FAILURE)
    except Exception as error:  # a bug: still one line, the traceback behind --debug
        return _fail(f"internal error {type(error).__name__}: {error} (run with --debug for the traceback)", debug,
                     error, EXIT_FAILURE)  # fmt: skip


def _check_environment() -> None:
    """The environment variables that choose how lowbit computes, checked before any work: a bad value is a
    configuration error (one line, exit 2) even where the command would not have quantized anything."""
    if os.environ.get("LOWBIT_BACKEND") is not None:
        from lowbit.backend import get_backend

        get_backend()  # ConfigError naming the variable, its value and the legal ones


def run() -> int:
    """The ``lowbit`` program (console script and ``python -m lowbit``): ``main`` with Ctrl-C recorded as it
    arrives. A Ctrl-C always ends in the one line and status 130, even where a dependency's import swallowed
    the KeyboardInterrupt (a bare ``except``) or saw it pass through C code (Python would then end the process
    by the signal at exit), and one that comes while the interpreter shuts down is ignored (Python puts the
    default action back there, which killed the process whatever ``main`` had answered). ``main`` itself,
    called from Python, leaves the caller's handlers alone."""
    signal.signal(signal.SIGINT, _record_interrupt)
    status = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _interrupt["seen"]:
        return status
    if status != EXIT_INTERRUPTED:
        print("lowbit: interrupted", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)  # no exit handlers after a Ctrl-C: the user asked to stop


_interrupt = {"seen": False}
_REDELIVERY_SECONDS = 0.02


def _record_interrupt(signum: int, frame: FrameType | None) -> None:
    """Raise KeyboardInterrupt where it is safe. Inside an import it is not: torch's import calls back into
    Python from C++ (``torch._C._autograd_init`` imports modules), and an exception raised there goes through
    C++ that cannot pass it on, which aborts the process (status -6). So a Ctrl-C that lands inside an import
    is sent again a moment later, until it arrives outside one."""
    _interrupt["seen"] = True
    if _inside_import(frame):
        timer = threading.Timer(_REDELIVERY_SECONDS, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    raise KeyboardInterrupt


def _inside_import(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _fail(message: str, debug: bool, error: BaseException, status: int) -> int:
    if debug:
        raise error
    if _interrupt["seen"]:  # the failure of an import a Ctrl-C cut short: report the interrupt instead
        print("lowbit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    first_line = " ".join(message.split()) if message else type(error).__name__
    print(f"lowbit: error: {first_line}", file=sys.stderr)
    return status


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        label = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"lowbit: {label}{record.getMessage()}"


class _messages:
    """The ``lowbit`` logger on stderr at the level -q / -v ask for, for the duration of one command."""

    def __init__(self, args) -> None:
        quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", 0)
        self.level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
        if quiet:
            args.progress = False  # no progress bars either

    def __enter__(self) -> None:
        self.logger = logging.getLogger("lowbit")
        self.handler = logging.StreamHandler(sys.stderr)  # the stderr of now (tests capture it)
        self.handler.setFormatter(_Format())
        self.saved = (self.logger.level, self.logger.propagate)
        self.logger.addHandler(self.handler)
        self.logger.setLevel(self.level)
        self.logger.propagate = False

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.saved[0])
        self.logger.propagate = self.saved[1]


def is_rank_zero() -> bool:
    """False in the extra processes a multi-process (DDP) run starts: they print nothing."""
    return all(os.environ.get(name, "0") == "0" for name in ("LOCAL_RANK", "NODE_RANK"))


__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_USAGE", "is_rank_zero", "main"]
