"""Host counters from /proc: a real process tree burning CPU, and the memory-bandwidth ceiling."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from harness.engine.telemetry.host import CLOCK_TICKS_PER_S, HostSampler, memory_bandwidth_ceiling, process_tree

BUSY_CHILD = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
IDLE = "import time; time.sleep(60)"


@pytest.fixture
def spawn():
    procs = []

    def start(code: str) -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-c", code]))
        return procs[-1]

    yield start
    for proc in procs:  # each child and whatever it started, by pid
        for pid in process_tree(proc.pid) if proc.poll() is None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(5)


def _engine_rows(sampler: HostSampler, wait_s: float) -> dict:
    sampler.sample(time.perf_counter_ns())
    time.sleep(wait_s)
    return {name: value for source, name, value in sampler.sample(time.perf_counter_ns()) if source == "engine_process"}


def test_cpu_percent_follows_the_whole_process_tree(spawn):
    busy_parent = spawn(BUSY_CHILD)  # the parent sleeps in wait(); its child spins
    idle = spawn(IDLE)
    time.sleep(0.3)  # let the child start
    busy = _engine_rows(HostSampler(busy_parent.pid), 1.0)
    quiet = _engine_rows(HostSampler(idle.pid), 0.5)
    assert busy["num_processes"] == 2 and quiet["num_processes"] == 1
    # One spinning core is 100; the machine is shared, so allow for being descheduled.
    assert 40 < busy["cpu_percent"] < 130
    assert quiet["cpu_percent"] < 10
    assert busy["rss_bytes"] > quiet["rss_bytes"] > 1_000_000  # two interpreters vs one


def test_cpu_time_of_exited_children_still_counts(spawn):
    # The child burns 0.5 s of CPU and exits before the second look; the parent reaped it.
    burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass"
    parent = spawn(
        f"import subprocess, sys, time; time.sleep(0.3); subprocess.run([sys.executable, '-c', '{burn}']);"
        " time.sleep(60)"
    )
    time.sleep(0.1)
    before = sum(ticks for ticks, _ in process_tree(parent.pid).values())
    deadline = time.monotonic() + 10
    while True:
        tree = process_tree(parent.pid)
        after = sum(ticks for ticks, _ in tree.values())
        if len(tree) == 1 and (after - before) / CLOCK_TICKS_PER_S >= 0.45 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(tree) == 1
    assert (after - before) / CLOCK_TICKS_PER_S >= 0.45


def test_host_series_and_a_missing_engine_pid():
    sampler = HostSampler(engine_pid=None)
    sampler.sample(time.perf_counter_ns())
    time.sleep(0.2)
    rows = {(source, name): value for source, name, value in sampler.sample(time.perf_counter_ns())}
    assert 0 <= rows["host", "cpu_percent"] <= 100 * os.cpu_count() * 1.1
    assert rows["host", "memory_used_bytes"] > 0
    assert not any(source == "engine_process" for source, _ in rows)
    assert "no engine pid" in sampler.not_sampled["engine_process"]


def test_engine_exit_is_reported_and_sampling_goes_on(spawn):
    proc = spawn("pass")
    proc.wait(10)
    sampler = HostSampler(proc.pid)
    rows = sampler.sample(time.perf_counter_ns())
    assert {source for source, _, _ in rows} == {"host"}
    assert f"engine process {proc.pid} exited" in sampler.not_sampled["engine_process"]


def test_memory_bandwidth_ceiling_is_a_memory_figure():
    # DRAM on anything this runs on: well above 1 GB/s, well below 1 TB/s per socket.
    assert 1e9 < memory_bandwidth_ceiling() < 1e12
