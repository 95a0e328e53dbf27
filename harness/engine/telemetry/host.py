"""Host counters for engines that run on the CPU (native, llama.cpp, vLLM CPU), read from /proc.

Series (source `engine_process`: the engine's process and all its descendants; source `host`):
  cpu_percent      top-style: 100 = one core busy, so it can exceed 100 (up to 100 x cores)
  rss_bytes        resident memory of the process tree (engine_process only)
  num_processes    processes in the tree (engine_process only)
  memory_used_bytes  MemTotal - MemAvailable (host only)

Plus one figure per run, `memory_bandwidth_ceiling()`: how fast this machine streams memory
through a numpy matrix-vector product, the same access pattern as a decode step reading its
weights. Bytes read per second by a CPU engine divided by this is its bandwidth utilisation.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.engine.telemetry.timeline import Unavailable

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _read_stat(pid: int) -> tuple[int, int, int]:
    """(ppid, cpu ticks, rss pages) of one process. CPU ticks include reaped children
    (cutime + cstime), so the tree's total keeps counting a worker after it exits."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parens
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[1]), utime + stime + cutime + cstime, int(fields[21])


def process_tree(root_pid: int) -> dict[int, tuple[int, int]]:
    """{pid: (cpu ticks, rss pages)} for root_pid and every descendant."""
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = _read_stat(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue  # exited while we looked
    if root_pid not in stats:
        raise ProcessLookupError(root_pid)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        tree[pid] = stats[pid][1:]
        todo.extend(children.get(pid, []))
    return tree


def host_cpu_ticks() -> int:
    """Busy ticks of all cores since boot (/proc/stat, everything but idle and iowait)."""
    fields = Path("/proc/stat").read_text().split()[1:9]  # the "cpu" line: all cores together
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields)
    return user + nice + system + irq + softirq + steal


def host_memory_used_bytes() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) * 1024


class HostSampler:
    """Host CPU and memory, and the engine's process tree when its pid is known."""

    def __init__(self, engine_pid: int | None):
        if not Path("/proc/stat").exists():
            raise Unavailable("no /proc on this system (host counters need Linux)")
        self.engine_pid = engine_pid
        self.not_sampled: dict[str, str] = {}
        if engine_pid is None:
            self.not_sampled["engine_process"] = "no engine pid: the harness did not start the engine"
        self._last: tuple[int, int, int] | None = None  # (ns, host ticks, engine ticks)

    def sample(self, now_ns: int) -> list[tuple[str, str, float]]:
        rows = [("host", "memory_used_bytes", host_memory_used_bytes())]
        host_ticks, engine_ticks = host_cpu_ticks(), None
        if self.engine_pid is not None:
            try:
                tree = process_tree(self.engine_pid)
            except ProcessLookupError:
                self.not_sampled["engine_process"] = f"engine process {self.engine_pid} exited during the run"
                self.engine_pid = None
            else:
                engine_ticks = sum(ticks for ticks, _ in tree.values())
                rows += [
                    ("engine_process", "rss_bytes", sum(rss for _, rss in tree.values()) * PAGE_BYTES),
                    ("engine_process", "num_processes", len(tree)),
                ]
        if self._last is not None:
            last_ns, last_host, last_engine = self._last
            tick_s = (now_ns - last_ns) / 1e9 * CLOCK_TICKS_PER_S  # ticks in this interval on one core
            rows.append(("host", "cpu_percent", 100.0 * (host_ticks - last_host) / tick_s))
            if engine_ticks is not None and last_engine is not None:
                rows.append(("engine_process", "cpu_percent", 100.0 * (engine_ticks - last_engine) / tick_s))
        self._last = (now_ns, host_ticks, engine_ticks)
        return rows

    def close(self) -> None:
        pass


def memory_bandwidth_ceiling() -> float:
    """Bytes/s this machine streams through a float32 matrix-vector product over 256 MiB.

    The same measurement as the native engine's decode roofline (benchmarks/engine.py), so
    the two agree on what "100 % of bandwidth" means. Measured once per run, after the load
    (the engine idle), in about a second.
    """
    from native_engine.blas import measure_read_bandwidth_gbs  # numpy: only when needed

    return measure_read_bandwidth_gbs() * 1e9
