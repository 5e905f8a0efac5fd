"""``python -m lowbit ...`` is the ``lowbit`` command."""

import sys

from lowbit.cli import run

if __name__ == "__main__":
    sys.exit(run())
