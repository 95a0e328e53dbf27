"""The live page (`--live-port`): a web page on 127.0.0.1 whose plotly charts grow with each LiveFrame of a run,
pushed to the browser over server-sent events; readable from another machine through `ssh -L`.

The server runs its own event loop in a daemon thread (SideServer), so a browser's requests never wait on (or delay)
the client's loop; a frame crosses over as one JSON line (push, thread-safe). plotly.js is served from the plotly
package, so the page needs no internet. A browser that connects late gets the frames so far first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

from aiohttp import web

from harness.metrics.live import LiveFrame
from harness.runs.side_server import SideServer

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>bench: live</title><script src="/plotly.js"></script>
<style>body{font-family:sans-serif;margin:1em} .chart{height:300px} #status{color:#555}</style></head>
<body><h2 id="title">waiting for a run</h2><div id="status">no frame yet</div>
<div id="ttft" class="chart"></div><div id="rates" class="chart"></div><div id="counts" class="chart"></div>
<script>
window.liveFrames = 0;  // frames drawn (the final one included), read by tests
const lines = (names) => names.map(n => ({x: [], y: [], name: n, mode: 'lines+markers'}));
const layout = (title, unit) => ({title: {text: title}, xaxis: {title: {text: 's since t0'}},
  yaxis: {title: {text: unit}}, margin: {t: 40}});
Plotly.newPlot('ttft', lines(['TTFT p50', 'TTFT p90', 'TTFT p99', 'ITL p50', 'ITL p99']),
  layout('latency over the last window', 'ms'));
Plotly.newPlot('rates', lines(['req/s', 'output tok/s / 100']), layout('throughput over the last window', 'per s'));
Plotly.newPlot('counts', lines(['completed', 'failed', 'in flight']), layout('requests', 'requests'));
const source = new EventSource('/events');
source.onmessage = (event) => {
  const f = JSON.parse(event.data), t = [f.elapsed_s];
  Plotly.extendTraces('ttft', {x: [t, t, t, t, t], y: [[f.ttft_ms.p50], [f.ttft_ms.p90], [f.ttft_ms.p99],
    [f.itl_ms.p50], [f.itl_ms.p99]]}, [0, 1, 2, 3, 4]);
  Plotly.extendTraces('rates', {x: [t, t], y: [[f.requests_per_s], [f.output_tokens_per_s / 100]]}, [0, 1]);
  Plotly.extendTraces('counts', {x: [t, t, t], y: [[f.completed], [f.failed], [f.in_flight]]}, [0, 1, 2]);
  window.liveFrames += 1;
  document.getElementById('title').textContent = f.run;
  document.getElementById('status').textContent = (f.final ? 'final (the summary\\'s figures)' : 'frame ' +
    window.liveFrames) + ': ' + f.completed + ' completed, ' + f.failed + ' failed of ' + f.planned;
};
</script></body></html>
"""


class LivePage:
    """The page and its event stream on host:port (port 0: a free one, in `.port`), kept up until the process ends."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.frames_pushed = 0
        self._history: list[str] = []  # every frame so far, as sent, for a browser that connects late
        self._listeners: set[asyncio.Queue] = set()
        app = web.Application()
        app.router.add_get("/", _page)
        app.router.add_get("/plotly.js", self._plotly)
        app.router.add_get("/events", self._events)
        app.router.add_get("/favicon.ico", _no_icon)  # asked by every browser
        self._server = SideServer(app, port, host)
        self.port = self._server.port
        self.url = f"http://{host}:{self.port}/"

    async def _plotly(self, request: web.Request) -> web.Response:
        from plotly.offline import get_plotlyjs  # the package's own copy: the page works offline

        return web.Response(text=get_plotlyjs(), content_type="application/javascript")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        queue: asyncio.Queue = asyncio.Queue()
        for line in self._history:
            queue.put_nowait(line)
        self._listeners.add(queue)
        try:
            while True:
                await response.write(f"data: {await queue.get()}\n\n".encode())
        except ConnectionResetError:  # the browser went away
            return response
        finally:
            self._listeners.discard(queue)

    def push(self, run: str, frame: LiveFrame) -> None:
        """A frame of `run`, to every browser connected and the history (from any thread)."""
        line = json.dumps({"run": run, **dataclasses.asdict(frame)})
        self.frames_pushed += 1
        self._server.loop.call_soon_threadsafe(self._send, line)

    def _send(self, line: str) -> None:
        self._history.append(line)
        for queue in self._listeners:
            queue.put_nowait(line)

    def close(self) -> None:
        self._server.close()


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def _no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)
