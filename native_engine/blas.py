"""The BLAS under numpy: its thread count, and the read bandwidth a decode step is bound by."""

from __future__ import annotations

import time

import numpy as np


def set_blas_threads(n_threads: int) -> int | None:
    """Set OpenBLAS's thread count at run time; returns the previous count, None when no OpenBLAS is found.

    On a machine whose cores are shared with a server and a load generator, OpenBLAS threads
    that spin-wait for a descheduled partner make matmuls many times slower; one thread avoids that.
    """
    import ctypes

    try:  # the OpenBLAS numpy loaded, wherever its wheel put it (Linux only)
        with open("/proc/self/maps") as maps:
            libraries = {line.split()[-1] for line in maps if "openblas" in line.split()[-1].lower()}
    except OSError:
        return None
    for library in sorted(libraries):
        lib = ctypes.CDLL(library)
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", ""):
                setter, getter = f"{prefix}_set_num_threads{suffix}", f"{prefix}_get_num_threads{suffix}"
                if hasattr(lib, setter) and hasattr(lib, getter):
                    previous = int(getattr(lib, getter)())
                    getattr(lib, setter)(int(n_threads))
                    return previous
    return None


def measure_read_bandwidth_gbs(n_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Best observed GB/s of a matrix-vector product over an fp32 matrix of n_bytes (the decode roofline). The
    matrix holds one value: a product's speed does not depend on it, and drawing 64M random floats took 1.0-3.3 s of the
    measurement's 1.1-3.5 s here (each native `bench run` measures once), filling them 0.04-0.22 s."""
    cols = 1024
    rows = max(1, n_bytes // (4 * cols))
    matrix = np.full((rows, cols), 0.5, dtype=np.float32)
    vector = np.ones((1, rows), dtype=np.float32)
    best_s = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        vector @ matrix
        best_s = min(best_s, time.perf_counter() - start)
    return matrix.nbytes / best_s / 1e9
