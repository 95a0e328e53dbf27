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


def _tree_cpu_s(pid: int) -> float:
    """The CPU seconds a process and its children have used, read from /proc as the kernel counts them."""
    ticks = 0
    for each in process_tree(pid):
        with open(f"/proc/{each}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLOCK_TICKS_PER_S


def test_cpu_percent_follows_the_whole_process_tree(spawn):
    """The sampler's cpu_percent is the tree's: the spinning child counts (not only its sleeping parent), as much
    as the kernel says it ran in the window, however busy the machine is (four spinners beside it give it ~40%)."""
    busy_parent = spawn(BUSY_CHILD)  # the parent sleeps in wait(); its child spins
    idle = spawn(IDLE)
    deadline = time.monotonic() + 30
    while len(process_tree(busy_parent.pid)) < 2 and time.monotonic() < deadline:  # the child has started
        time.sleep(0.05)
    cpu_before_s, started = _tree_cpu_s(busy_parent.pid), time.perf_counter()
    busy = _engine_rows(HostSampler(busy_parent.pid), 1.0)
    ran_percent = 100 * (_tree_cpu_s(busy_parent.pid) - cpu_before_s) / (time.perf_counter() - started)
    quiet = _engine_rows(HostSampler(idle.pid), 0.5)
    assert busy["num_processes"] == 2 and quiet["num_processes"] == 1
    assert ran_percent > 1  # the child did spin in the window
    # the kernel's ticks (10 ms) over a ~1 s window, read a moment before and after the sampler's two looks
    assert abs(busy["cpu_percent"] - ran_percent) < 10 + 0.1 * ran_percent, (busy["cpu_percent"], ran_percent)
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
