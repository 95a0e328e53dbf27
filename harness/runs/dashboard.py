"""How a run's LiveFrames are shown: a rich Live block redrawn in place on a terminal (Dashboard), or one plain line
every so often where stdout is no terminal or CI=true (PlainLines). Each frame is numbered, so a test (and a reader
of a CI log) can count the refreshes."""

from __future__ import annotations

import os

from rich.console import Console
from rich.live import Live
from rich.text import Text

from harness.metrics.live import GpuState, LiveFrame, Percentiles


def wants_plain_lines(console: Console) -> bool:
    """No terminal to redraw in place (a pipe, a file, a CI log): plain lines instead of a redrawn table."""
    return not console.is_terminal or os.environ.get("CI", "").lower() in ("true", "1")


def _ms(p: Percentiles) -> str:
    return " / ".join("-" if v is None else f"{v:,.1f}" for v in (p.p50, p.p90, p.p99))


def _share(value: float | None, none: str = "no SLO") -> str:
    return none if value is None else f"{100 * value:.1f}%"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _gpu(gpu: GpuState) -> str:
    busy = "-" if gpu.util_pct is None else f"{gpu.util_pct:.0f}%"
    power = "-" if gpu.power_w is None else f"{gpu.power_w:,.0f} W"
    return f"{busy}, {_share(gpu.sm_active, '-')}, {power} ({gpu.gpus} GPU{'s' if gpu.gpus > 1 else ''})"


def _engine(frame: LiveFrame) -> str:
    e = frame.engine
    if e is None:
        return ""
    return (
        f" engine run {_count(e.running)} wait {_count(e.waiting)} kv {_share(e.kv_usage_fraction, '-')} "
        f"prefix hits {_share(e.prefix_cache_hit_rate, '-')}"
    )


def _lag(frame: LiveFrame) -> str:
    return "-" if frame.send_lag_p99_ms is None else f"{frame.send_lag_p99_ms:.1f} ms"


def frame_text(frame: LiveFrame, number: int, title: str) -> Text:
    """One frame as aligned lines of text, and the client-bound warning under them when the window shows one. Text,
    not a rich Table: a table's column measuring cost ~10 ms a frame on the client's loop at 256 streams."""
    kind = "final (the summary's figures)" if frame.final else f"frame {number}"
    cap = f" of {frame.concurrency}" if frame.concurrency else ""
    window = "steady window" if frame.final else "last window"
    rows = (
        ("due / planned", f"{frame.due} / {frame.planned}"),
        ("completed / failed", f"{frame.completed} / {frame.failed}"),
        ("in flight", f"{frame.in_flight}{cap}"),
        (f"req/s, output tok/s ({window})", f"{frame.requests_per_s:.2f}, {frame.output_tokens_per_s:,.1f}"),
        ("TTFT p50 / p90 / p99 (ms)", _ms(frame.ttft_ms)),
        ("ITL p50 / p90 / p99 (ms)", _ms(frame.itl_ms)),
        ("TPOT p50 / p90 / p99 (ms)", _ms(frame.tpot_ms)),
        ("within SLOs so far", _share(frame.slo_attainment)),
        ("send lag p99", _lag(frame)),
    )
    if frame.engine is not None:
        rows += (
            ("engine running / waiting", f"{_count(frame.engine.running)} / {_count(frame.engine.waiting)}"),
            (
                "engine KV in use, prefix hits",
                f"{_share(frame.engine.kv_usage_fraction, '-')}, {_share(frame.engine.prefix_cache_hit_rate, '-')}",
            ),
        )
    if frame.gpu is not None:
        rows += (("GPU busy, SM active, power", _gpu(frame.gpu)),)
    text = Text(no_wrap=True, overflow="crop")  # the lines fit; word-wrapping them was half a redraw
    text.append(f"{title}  {kind}  t={frame.elapsed_s:.1f} s\n", style="bold")
    for label, value in rows:
        text.append(f"  {label:<36}{value:>26}\n")
    if frame.client_bound:
        text.append(f"client-bound: {'; '.join(frame.client_bound)}\n", style="yellow")
    return text


def frame_line(frame: LiveFrame, number: int, title: str) -> str:
    """One frame as one line, for logs."""
    kind = "final" if frame.final else f"frame {number}"
    bound = f" CLIENT-BOUND ({'; '.join(frame.client_bound)})" if frame.client_bound else ""
    return (
        f"{title} {kind} t={frame.elapsed_s:.1f}s due {frame.due}/{frame.planned} done {frame.completed} "
        f"failed {frame.failed} in-flight {frame.in_flight} {frame.requests_per_s:.2f} req/s "
        f"{frame.output_tokens_per_s:.1f} tok/s ttft ms {_ms(frame.ttft_ms)} itl ms {_ms(frame.itl_ms)} "
        f"tpot ms {_ms(frame.tpot_ms)} slo {_share(frame.slo_attainment)} lag p99 {_lag(frame)}{_engine(frame)}"
        + (f" gpu {_gpu(frame.gpu)}" if frame.gpu is not None else "")
        + bound
    )


class Dashboard:
    """A rich Live block on `console`, redrawn by each show(): the caller sets the rate, no thread of its own."""

    def __init__(self, console: Console, title: str) -> None:
        self.console, self.title, self.frames = console, title, 0
        self._live = Live(console=console, auto_refresh=False, transient=False)

    def start(self) -> None:
        self._live.start()

    def show(self, frame: LiveFrame) -> None:
        self.frames += 1
        self._live.update(frame_text(frame, self.frames, self.title), refresh=True)

    def stop(self, final: LiveFrame | None) -> None:
        if final is not None:  # drawn once, by stop()'s own last refresh
            self.frames += 1
            self._live.update(frame_text(final, self.frames, self.title), refresh=False)
        self._live.stop()


class PlainLines:
    """One line per show(); the caller shows a frame every `every_s` (harness/runs/live.py)."""

    def __init__(self, console: Console, title: str) -> None:
        self.console, self.title, self.frames = console, title, 0

    def start(self) -> None:
        pass

    def show(self, frame: LiveFrame) -> None:
        self.frames += 1
        self.console.print(frame_line(frame, self.frames, self.title), markup=False, highlight=False, soft_wrap=True)

    def stop(self, final: LiveFrame | None) -> None:
        if final is not None:
            self.show(final)
