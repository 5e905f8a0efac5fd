import os
import sys

from hypothesis import HealthCheck, settings

# Tests run the eager path unless they ask for a backend (tests/test_backend.py compiles every format once);
# compiling each of the thousands of specs the suite builds would take far longer than the tests.
os.environ.setdefault("LOWBIT_BACKEND", "eager")

# Make tests/format_cases.py and tests/helpers.py importable as plain modules from any test directory.
sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile(
    "lowbit",
    deadline=None,
    max_examples=int(os.environ.get("LOWBIT_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
    database=None,  # no replay of examples stored by earlier runs: every run draws the same examples
)
settings.load_profile("lowbit")
