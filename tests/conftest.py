import os
import sys

# Under pytest-xdist (`make test` runs a worker per core) each worker takes its share of the cores for torch's
# OpenMP threads, so that spinning threads do not outnumber the cores: oversubscribed, a GEMM-heavy test ran 4x
# slower. Set before torch is imported, so the CLI subprocesses the tests start inherit it; tests about thread
# splits set their own counts.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))

from hypothesis import HealthCheck, settings  # noqa: E402

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


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _process_state_is_restored():
    """Every test leaves the process as it found it (the backend, torch's default dtype): under pytest-xdist
    each worker runs a different sequence of tests, and a test that leaks a setting changes the next one's."""
    from lowbit import backend

    before = (backend._state["backend"], torch.get_default_dtype())
    yield
    after = (backend._state["backend"], torch.get_default_dtype())
    assert after == before or after == ("eager", before[1]) and before[0] is None, (
        f"the test changed the process's backend / default dtype: {before} -> {after}")
