import os
import sys

from hypothesis import HealthCheck, settings

# Make tests/format_cases.py importable as a plain module from any test directory.
sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile(
    "lowbit",
    deadline=None,
    max_examples=int(os.environ.get("LOWBIT_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.load_profile("lowbit")
