"""Fixtures shared by several test files."""
import pytest

from native_engine.blas import set_blas_threads


@pytest.fixture
def one_blas_thread():
    """The 2 shared cores of CI: one BLAS thread avoids spin-waits on a descheduled partner."""
    before = set_blas_threads(1)
    yield
    if before is not None:
        set_blas_threads(before)
