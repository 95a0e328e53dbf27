"""The data-parallel router: one OpenAI-compatible port in front of N engine replicas (aiohttp proxy).

Generation requests go to the replica the policy (routing_policy.py) picks; /v1/models, /tokenize and
/detokenize go to any replica that is up. A replica is down from the moment a request to it fails at
the connection, until its /health answers again (probed every HEALTH_INTERVAL_S). A request that
could not reach its replica at all is sent to another; one whose replica failed while answering gets
a 502 (or, mid-stream, an SSE error event) naming the replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from native_engine.content_encoding import ContentEncodingError, decoded_body
from native_engine.draining_runner import SHUTDOWN_GRACE_S, DrainingRunner
from native_engine.router_metrics import RouterMetrics
from native_engine.routing_policy import Policy, prompt_text

log = logging.getLogger("native_engine.router")
HEALTH_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 2.0
# A busy replica may answer /health late (its engine thread holds the GIL between steps): down only
# after this many slow or failed probes in a row; a refused connection (nothing listens) counts at once.
DOWN_AFTER_FAILED_PROBES = 3
MAX_BODY_BYTES = 4 * 2**20
PASSED_HEADERS = ("Content-Type", "Retry-After", "Cache-Control")


@dataclass
class Replica:
    id: str
    url: str
    up: bool = True
    in_flight: int = 0
    failed_probes: int = 0


class ReplicaFailed(Exception):
    def __init__(self, replica: Replica, exc: Exception, reached: bool):
        super().__init__(f"replica {replica.id} ({replica.url}) failed: {type(exc).__name__}: {exc}")
        self.replica, self.reached = replica, reached  # reached: the replica may have started on it


class Router:
    def __init__(self, replica_urls: list[str], policy: Policy, replica_ids: list[str] | None = None) -> None:
        ids = replica_ids or [str(i) for i in range(len(replica_urls))]
        self.replicas = {i: Replica(i, url.rstrip("/")) for i, url in zip(ids, replica_urls)}
        self.policy = policy
        self.metrics = RouterMetrics()
        self.http: aiohttp.ClientSession | None = None
        for r in self.replicas.values():  # every replica's series exists from the start, at 0
            self.metrics.up.labels(r.id).set(1)
            self.metrics.requests.labels(r.id)
            self.metrics.in_flight.labels(r.id)

    def up_ids(self) -> set[str]:
        return {r.id for r in self.replicas.values() if r.up}

    def mark(self, replica: Replica, up: bool, why: str = "") -> None:
        if replica.up == up:
            return
        replica.up = up
        self.metrics.up.labels(replica.id).set(int(up))
        if up:
            log.warning("router: replica %s (%s) is up again", replica.id, replica.url)
        else:
            log.error("router: replica %s (%s) is down: %s", replica.id, replica.url, why)
            self.policy.replica_lost(replica.id)

    async def watch_health(self) -> None:
        while True:
            await asyncio.gather(*(self.probe(r) for r in self.replicas.values()))
            self.policy.evict()
            await asyncio.sleep(HEALTH_INTERVAL_S)

    async def probe(self, replica: Replica) -> None:
        try:
            async with self.http.get(replica.url + "/health", timeout=aiohttp.ClientTimeout(HEALTH_TIMEOUT_S)) as resp:
                failure = None if resp.status == 200 else f"/health answered {resp.status}"
        except aiohttp.ClientConnectorError as exc:
            replica.failed_probes = DOWN_AFTER_FAILED_PROBES
            failure = f"/health: {exc}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            failure = f"/health: {type(exc).__name__}: {exc}"
        replica.failed_probes = replica.failed_probes + 1 if failure else 0
        if failure is None or replica.failed_probes >= DOWN_AFTER_FAILED_PROBES:
            self.mark(replica, failure is None, failure or "")

    # ---- generation ----------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        raw = await read_body(request)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None  # the replica answers malformed bodies with its own 400
        text = prompt_text(body) if isinstance(body, dict) else ""
        tried = set()
        while True:
            up = self.up_ids() - tried
            if not up:
                return error_response(503, "no engine replica is up; see the router's log", "ServiceUnavailableError")
            decision = self.policy.choose(text, {r.id: r.in_flight for r in self.replicas.values()}, up)
            self.metrics.decisions.labels(self.policy.name, decision.reason).inc()
            if self.policy.name == "cache_aware":
                self.metrics.prefix_match.observe(decision.matched_chars)
            replica = self.replicas[decision.replica]
            try:
                return await self.forward(request, replica, raw)
            except ReplicaFailed as exc:
                self.metrics.failures.labels(replica.id, "mid_response" if exc.reached else "connect").inc()
                self.mark(replica, False, str(exc))
                if exc.reached:
                    return error_response(502, f"{exc}; the request was lost with it", "BadGatewayError")
                tried.add(replica.id)  # it never reached the replica: safe to send elsewhere

    async def forward(
        self, request: web.Request, replica: Replica, raw: bytes, seen: Callable[[bytes], None] | None = None
    ) -> web.StreamResponse:
        """seen (disaggregation.py): called with the answer's body, or each run of whole SSE events, as passed on."""
        self.metrics.requests.labels(replica.id).inc()
        replica.in_flight += 1
        self.metrics.in_flight.labels(replica.id).inc()
        try:
            headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
            try:
                upstream = await self.http.post(replica.url + request.path, data=raw, headers=headers)
            except aiohttp.ClientConnectorError as exc:
                raise ReplicaFailed(replica, exc, reached=False) from None
            except aiohttp.ClientError as exc:  # it took the request, then went away before answering
                raise ReplicaFailed(replica, exc, reached=True) from None
            async with upstream:
                passed = {k: upstream.headers[k] for k in PASSED_HEADERS if k in upstream.headers}
                if not upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
                    try:
                        payload = await upstream.read()
                    except aiohttp.ClientError as exc:
                        raise ReplicaFailed(replica, exc, reached=True) from None
                    if seen is not None:
                        seen(payload)
                    return web.Response(status=upstream.status, body=payload, headers=passed)
                response = web.StreamResponse(status=upstream.status, headers=passed)
                await response.prepare(request)
                pending = b""
                while True:
                    try:  # only reading the replica is its failure; a failed write is the client's
                        chunk = await upstream.content.readany()
                    except aiohttp.ClientError as exc:
                        failed = ReplicaFailed(replica, exc, reached=True)
                        self.metrics.failures.labels(replica.id, "mid_stream").inc()
                        self.mark(replica, False, str(failed))
                        event = {
                            "error": {
                                "message": f"{failed}; the stream was cut off",
                                "type": "BadGatewayError",
                                "param": None,
                                "code": 502,
                            }
                        }
                        await response.write(b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n")
                        break
                    if not chunk:
                        break
                    whole, sep, pending = (pending + chunk).rpartition(b"\n\n")
                    if sep:  # only whole events: a cut-off one would read as malformed JSON
                        if seen is not None:
                            seen(whole)
                        await response.write(whole + sep)
                await response.write_eof()
                return response
        finally:
            replica.in_flight -= 1
            self.metrics.in_flight.labels(replica.id).dec()

    # ---- everything else ------------------------------------------------------------------------
    async def to_any(self, request: web.Request) -> web.Response:
        for replica in sorted(self.replicas.values(), key=lambda r: (not r.up, r.id)):
            try:
                async with self.http.request(
                    request.method,
                    replica.url + request.path,
                    data=await read_body(request),
                    headers={"Content-Type": request.headers.get("Content-Type", "")},
                ) as up:
                    return web.Response(
                        status=up.status,
                        body=await up.read(),
                        headers={k: up.headers[k] for k in PASSED_HEADERS if k in up.headers},
                    )
            except aiohttp.ClientError as exc:
                self.mark(replica, False, f"{request.path}: {type(exc).__name__}: {exc}")
        return error_response(503, "no engine replica is up; see the router's log", "ServiceUnavailableError")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.up_ids() else 503)

    async def list_replicas(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "policy": self.policy.name,
                "replicas": [
                    {"id": r.id, "url": r.url, "up": r.up, "in_flight": r.in_flight} for r in self.replicas.values()
                ],
            }
        )

    async def render_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def build_app(self, generate=None, list_replicas=None) -> web.Application:
        """The router's endpoints; a coordinator over the same machinery (disaggregation) brings its own
        generation and replica listing."""
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[answer_bad_encoding])
        app.cleanup_ctx.append(self._lifetime)
        for path in ("/v1/completions", "/v1/chat/completions"):
            app.router.add_post(path, generate or self.generate)
        for path in ("/tokenize", "/detokenize"):
            app.router.add_post(path, self.to_any)
        app.router.add_get("/v1/models", self.to_any)
        app.router.add_get("/health", self.health)
        app.router.add_get("/replicas", list_replicas or self.list_replicas)
        app.router.add_get("/metrics", self.render_metrics)
        return app

    async def _lifetime(self, app):
        # No total timeout: a long generation is fine. Connections are not pooled per replica past the
        # request, so a dead replica's stale keep-alive connection is not reused.
        self.http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
        )
        watcher = asyncio.create_task(self.watch_health())
        yield
        watcher.cancel()
        await self.http.close()


async def read_body(request: web.Request) -> bytes:
    """The body with its Content-Encoding undone (this app runs without aiohttp's decoding); a body that is not
    what the header says raises ContentEncodingError, which answer_bad_encoding turns into a 400 naming it."""
    return decoded_body(await request.read(), request.headers.get("Content-Encoding", ""), request.client_max_size)


@web.middleware
async def answer_bad_encoding(request: web.Request, handler):
    try:
        return await handler(request)
    except ContentEncodingError as exc:
        err_type = "RequestEntityTooLarge" if exc.status == 413 else "BadRequestError"
        return error_response(exc.status, str(exc), err_type, exc.param)


def error_response(status: int, message: str, err_type: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": err_type, "param": param, "code": status}}, status=status
    )


async def start_router(
    router: Router, host: str = "127.0.0.1", port: int = 0, shutdown_grace_s: float = SHUTDOWN_GRACE_S
) -> tuple[web.AppRunner, int]:
    """Serve in the running loop; returns the runner (await runner.cleanup() to stop) and the bound port.
    runner.cleanup() stops listening, gives the requests in flight shutdown_grace_s, then cancels the rest
    (closing each one's connection to its replica, which aborts it there): native_engine/draining_runner.py."""
    runner = DrainingRunner(
        router.build_app(), grace_s=shutdown_grace_s, handler_cancellation=True, auto_decompress=False, access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]
