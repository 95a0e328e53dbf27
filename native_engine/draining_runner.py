"""An aiohttp runner whose stop is bounded by its grace: stop listening, give the requests in flight the grace,
cancel the rest, close.

aiohttp's own shutdown waits `shutdown_timeout` for each connection's handler, then cancels it and waits
up to `shutdown_timeout` again (rounded up to a whole second past 5 s); a streaming handler does not read
its request body, so that cancel did not reach it and a stream still going at the grace's end ran on to the
second timeout: `bench serve --shutdown-grace-s 5` took 10.0 s to stop, 51.5 s at the default 25 s (issue 37).
Here the runner keeps the app's handler tasks itself, waits for them once for the grace, then cancels them.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

# After SIGTERM: how long the requests in flight may still run (`bench serve --shutdown-grace-s`). Under the
# 30 s Kubernetes gives a pod before SIGKILL, as Dynamo's and llm-d's graceful-shutdown guides size their drains.
SHUTDOWN_GRACE_S = 25.0
# A cancelled handler only runs its `finally` (the engine's: abort the request, a call into its inbox), so
# this is ample; it bounds a handler that swallows the cancel, and aiohttp's own wait for what is left.
CANCELLED_HANDLERS_WAIT_S = 1.0
IN_FLIGHT_KEY = web.AppKey("handlers_in_flight", set)


@web.middleware
async def track_in_flight(request: web.Request, handler):
    """Each request's handler task, in the app's set while it runs."""
    in_flight = request.app[IN_FLIGHT_KEY]
    task = asyncio.current_task()
    in_flight.add(task)
    try:
        return await handler(request)
    finally:
        in_flight.discard(task)


async def drain(in_flight: set[asyncio.Task], grace_s: float) -> None:
    """Let the handlers run for up to grace_s, then cancel the rest and wait (briefly) for them to end."""
    if in_flight:
        await asyncio.wait(set(in_flight), timeout=grace_s)
    left = [task for task in in_flight if not task.done()]
    for task in left:
        task.cancel()
    if left:
        await asyncio.wait(left, timeout=CANCELLED_HANDLERS_WAIT_S)


class DrainingRunner(web.AppRunner):
    """`await runner.cleanup()` stops listening and closes idle connections at once (aiohttp), gives the
    requests in flight `grace_s` to finish, cancels the rest (each handler's `finally` runs: the engine
    aborts its request, its client sees the stream cut), then runs the app's cleanup. The whole stop takes
    at most grace_s + 2 x CANCELLED_HANDLERS_WAIT_S, plus the app's own cleanup."""

    def __init__(self, app: web.Application, *, grace_s: float, **kwargs):
        app[IN_FLIGHT_KEY] = set()
        app.middlewares.append(track_in_flight)
        super().__init__(app, shutdown_timeout=CANCELLED_HANDLERS_WAIT_S, **kwargs)
        self.grace_s = grace_s

    async def shutdown(self) -> None:
        """aiohttp's cleanup() calls this once the sites stopped listening, before its own wait."""
        await super().shutdown()
        await drain(self.app[IN_FLIGHT_KEY], self.grace_s)
