"""Fixtures shared by several test files."""

import pytest

from native_engine.blas import set_blas_threads


@pytest.fixture(scope="session", autouse=True)
def no_user_client_capacity_file(tmp_path_factory):
    """Module-scoped fixtures (a shared `bench run`) start before any function's own file below is set: their runs
    record into a file of the session's, never the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENCH_CLIENT_CAPACITY_FILE", str(tmp_path_factory.mktemp("capacity") / "client_capacity.json"))
        yield


@pytest.fixture(autouse=True)
def own_client_capacity_file(tmp_path_factory, monkeypatch):
    """Runs record their client's capacity (harness.client.capacity): a test's go to a file of its own, never
    to the user's cache, and no earlier run's measurement sizes a test's `workers: auto`."""
    path = tmp_path_factory.mktemp("capacity") / "client_capacity.json"
    monkeypatch.setenv("BENCH_CLIENT_CAPACITY_FILE", str(path))
    return path


@pytest.fixture
def one_blas_thread():
    """The 2 shared cores of CI: one BLAS thread avoids spin-waits on a descheduled partner."""
    before = set_blas_threads(1)
    yield
    if before is not None:
        set_blas_threads(before)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """The default tiny GGUF (seed 0): a real file the engine loads in milliseconds, for tests of the serving
    machinery rather than of the model."""
    from native_engine.tiny_gguf import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf", seed=0)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    from native_engine.llm_engine import LoadedModel

    return LoadedModel.load(str(tiny_path))
