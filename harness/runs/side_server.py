"""An aiohttp app served on 127.0.0.1 from an event loop of its own, in a daemon thread (SideServer): what the live
views serve (the live page, the Prometheus endpoint) never waits on the client's loop, nor makes it wait. One thread
for every request, not one per request: a scrape a second costs the client no thread start."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class SideServer:
    """`app` on host:port (port 0: a free one, in `.port`) until close(); a port that cannot be bound raises OSError
    here, in the caller's thread."""

    def __init__(self, app: web.Application, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)  # an open event stream holds close() no longer
        started: list = []  # the bound port, or the error binding it raised
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(port, started, ready), daemon=True)
        self.thread.start()
        ready.wait()
        if isinstance(started[0], Exception):
            self.thread.join(timeout=10)
            raise started[0]
        self.port = started[0]

    def _serve(self, port: int, started: list, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, port)
            self.loop.run_until_complete(site.start())
            started.append(site._server.sockets[0].getsockname()[1])
        except OSError as e:
            started.append(e)
            ready.set()
            self.loop.run_until_complete(self._runner.cleanup())
            self.loop.close()
            return
        ready.set()
        self.loop.run_forever()
        self.loop.close()

    def close(self) -> None:
        """Stops serving; a request still open (an event stream) ends here."""

        async def stop():
            await self._runner.cleanup()
            streams = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in streams:
                task.cancel()
            await asyncio.gather(*streams, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
