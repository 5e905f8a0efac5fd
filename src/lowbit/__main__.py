"""``python -m lowbit ...`` is the ``lowbit`` command."""

import sys

if __name__ == "__main__":
    try:
        from lowbit.cli import run
    except KeyboardInterrupt:  # a Ctrl-C while the command's modules load, before its own handler is in place
        print("lowbit: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(run())
