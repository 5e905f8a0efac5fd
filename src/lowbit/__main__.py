"""``python -m lowbit ...`` is the ``lowbit`` command."""

import sys

from lowbit.cli import main

if __name__ == "__main__":
    sys.exit(main())
