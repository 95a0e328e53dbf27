"""An engine's start-up cost (Q13 of the README's questions): run.json's `startup` block.

For an engine bench launches:
- `launch_to_ready_s`: from starting its process until it answered its readiness probe and any work the
  backend does before load (Ollama's model pull) was done; polled every 0.25 s, so up to that much late.
- `engine_build_s`: the engine-build step the engine's own log reports (TensorRT-LLM builds a TensorRT engine
  from a checkpoint at start-up); absent for engines that build none.
- `first_request`: the engine's first request, the one that pays for lazy initialisation (kernels compiled,
  buffers allocated, caches cold): its TTFT and end-to-end latency, and the run's median TTFT beside them.
  Recorded by the run that sent it; a sweep's later points carry the same block, naming that run.
An engine bench did not launch gets no block: its start was not seen.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from harness.results.schema import FirstRequest, Startup


def launch_startup(ready_s: float, backend, log_path: Path) -> Startup:
    """The block as known once the engine is ready: launch to ready, and the engine build where it has one."""
    try:
        log_text = log_path.read_text(errors="replace")
    except OSError:
        log_text = ""
    startup = Startup(launch_to_ready_s=round(ready_s, 3))
    build_s = backend.engine_build_s(log_text)
    if build_s is not None:  # set only then: run.json leaves the key out for an engine that builds none
        startup.engine_build_s = build_s
    return startup


def first_request(records, run_name: str) -> FirstRequest | None:
    """The earliest-sent request of a run (warm-up ones included: the engine's first may be one), or None
    when none was sent."""
    sent = [r for r in records if r.actual_send_s is not None]
    if not sent:
        return None
    first = min(sent, key=lambda r: r.actual_send_s)
    ttfts = [r.token_times_s[0] - r.actual_send_s for r in sent if r.ok and r.token_times_s]
    return FirstRequest(
        run=run_name,
        ok=first.ok,
        ttft_ms=_ms(first.token_times_s[0] - first.actual_send_s) if first.token_times_s else None,
        e2e_ms=_ms(first.end_s - first.actual_send_s) if first.end_s is not None else None,
        run_median_ttft_ms=_ms(statistics.median(ttfts)) if ttfts else None,
    )


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def startup_text(startup: Startup | None) -> str:
    """One line for reports and `bench select`: "ready 3.2 s after launch; first request TTFT 210 ms (median
    95 ms), E2E 900 ms"; "not launched by bench" without a block."""
    if startup is None:
        return "not launched by bench"
    parts = [f"ready {startup.launch_to_ready_s:.1f} s after launch"]
    if startup.engine_build_s is not None:
        parts.append(f"engine build {startup.engine_build_s:.0f} s")
    first = startup.first_request
    if first is not None and first.ttft_ms is not None:
        median = first.run_median_ttft_ms
        parts.append(
            f"first request TTFT {first.ttft_ms:.0f} ms"
            + (f" (run median {median:.0f} ms)" if median is not None else "")
            + (f", E2E {first.e2e_ms:.0f} ms" if first.e2e_ms is not None else "")
        )
    elif first is not None:
        parts.append("first request failed")
    return "; ".join(parts)
