import pytest

from lowbit.native import build, kernels


@pytest.fixture
def several_threads():
    """Every native kernel splits its work over threads from 2^14 elements (their own thresholds are millions
    of elements), so the threaded code runs on the tests' small tensors."""
    if build.ensure() is None:
        pytest.skip(f"no native library: {build.error()}")
    with kernels.threads_from(1 << 14):
        yield
