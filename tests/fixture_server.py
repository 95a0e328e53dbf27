"""Replays an engine's recorded stream and /metrics formats on 127.0.0.1, so `bench run` can go
its full path against engines that cannot run here (SGLang, TensorRT-LLM, Ollama, vLLM on GPU).

    python tests/fixture_server.py --engine sglang --port 8000 [--itl-ms 2] [--log PATH]

It answers at the paths the real engine serves (ROUTES below, each from the engine's own server source
or docs, cited), never at the paths backends/<engine>.py declares: a wrong path in a backend then fails
here as it would against the engine. Each generate path streams tests/fixtures/engines/<engine>_<file>
.{sse,ndjson} one event (SSE) or line (NDJSON) at a time, --itl-ms apart; the metrics path serves
<engine>_metrics.txt; readiness, version and profiler paths answer 200. Every request body it gets is
appended to --log as one JSON line ({"path", "body"}), so tests can check the dialect the harness spoke.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

FIXTURES = Path(__file__).parent / "fixtures" / "engines"


@dataclass(frozen=True)
class Routes:
    """What one engine's HTTP server answers. streams: POST path -> the capture it replays (<engine>_<file>)."""

    source: str  # where the routes are defined upstream
    streams: dict[str, str]
    ready: tuple[str, ...]  # GET paths answering 200 once the model is loaded
    version: tuple[str, ...] = ()
    metrics: str | None = None  # the Prometheus text page
    profile: tuple[str, ...] = ()  # POST start and stop
    extra_posts: tuple[str, ...] = ()  # answered with {"status": "success"}


OPENAI = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
ROUTES = {
    "vllm": Routes(
        "vllm/entrypoints/openai/api_server.py (routes listed at start-up: /health, /ping, /v1/models, "
        "/version, /v1/completions, /v1/chat/completions, /metrics; /start_profile, /stop_profile "
        "with a profiler configured)",
        OPENAI,
        ("/health", "/ping", "/v1/models"),
        ("/version",),
        "/metrics",
        ("/start_profile", "/stop_profile"),
    ),
    "sglang": Routes(
        "python/sglang/srt/entrypoints/http_server.py (/generate, /v1/*, /health, /health_generate, "
        "/get_model_info, /server_info and its old name /get_server_info, /metrics with "
        "--enable-metrics, /start_profile, /stop_profile)",
        {**OPENAI, "/generate": "generate"},
        ("/health", "/health_generate", "/v1/models", "/get_model_info"),
        ("/server_info", "/get_server_info"),
        "/metrics",
        ("/start_profile", "/stop_profile"),
    ),
    # /metrics there is a JSON list of iteration stats, not Prometheus text (docs/source/commands/trtllm-serve.rst)
    "trtllm": Routes(
        "tensorrt_llm/serve/openai_server.py and docs/source/commands/trtllm-serve.rst (/v1/models, "
        "/v1/completions, /v1/chat/completions, /health, /metrics, /version; /prometheus/metrics "
        "mounted with return_perf_metrics)",
        OPENAI,
        ("/health", "/v1/models"),
        ("/version",),
        "/prometheus/metrics",
    ),
    "ollama": Routes(
        "docs/api.md (POST /api/generate, /api/chat, /api/pull; GET /api/version, /api/tags, /api/ps)",
        {"/api/generate": "completions", "/api/chat": "chat"},
        ("/api/version", "/api/tags", "/api/ps"),
        ("/api/version",),
        extra_posts=("/api/pull",),
    ),
    "llamacpp": Routes(
        "tools/server/server.cpp and tools/server/README.md (/health, /v1/health, /props, /metrics "
        "with --metrics, /models, /v1/models, /completion(s), /v1/completions, /chat/completions, "
        "/v1/chat/completions)",
        {"/completion": "completions", "/completions": "completions", "/chat/completions": "chat", **OPENAI},
        ("/health", "/v1/health", "/models", "/v1/models"),
        ("/props",),
        "/metrics",
    ),
}


def units(engine: str, capture: str) -> tuple[list[bytes], str]:
    """The stream split into what the engine sends at once, and its content type."""
    stem = FIXTURES / f"{engine}_{capture}"
    if stem.with_suffix(".ndjson").is_file():
        lines = stem.with_suffix(".ndjson").read_bytes().splitlines(keepends=True)
        return lines, "application/x-ndjson"
    events = stem.with_suffix(".sse").read_bytes().split(b"\n\n")
    return [e + b"\n\n" for e in events if e.strip()], "text/event-stream"


def build_app(engine: str, itl_s: float, log_path: Path | None, llm_api_options: Path | None = None) -> web.Application:
    def note(path: str, body) -> None:
        if log_path:
            with open(log_path, "a") as f:
                f.write(json.dumps({"path": path, "body": body}) + "\n")

    def streamer(capture: str):
        chunks, content_type = units(engine, capture)

        async def handler(request: web.Request) -> web.StreamResponse:
            note(request.path, await request.json())
            resp = web.StreamResponse(headers={"Content-Type": content_type})
            await resp.prepare(request)
            for chunk in chunks:
                await asyncio.sleep(itl_s)
                await resp.write(chunk)
            await resp.write_eof()
            return resp

        return handler

    def unrecorded(capture: str):
        async def handler(request: web.Request) -> web.Response:
            return web.Response(status=501, text=f"no capture tests/fixtures/engines/{engine}_{capture}.sse recorded")

        return handler

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "data": [{"id": "smollm2", "object": "model"}]})

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": f"{engine}-fixture", "build_info": f"{engine}-fixture"})

    async def profile(request: web.Request) -> web.Response:
        note(request.path, None)
        return web.Response(text="ok")

    async def success(request: web.Request) -> web.Response:
        note(request.path, await request.json())
        return web.json_response({"status": "success"})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=(FIXTURES / f"{engine}_metrics.txt").read_text(), content_type="text/plain")

    routes = ROUTES[engine]
    app = web.Application()
    for path, capture in routes.streams.items():
        recorded = any((FIXTURES / f"{engine}_{capture}{ext}").is_file() for ext in (".sse", ".ndjson"))
        app.router.add_post(path, streamer(capture) if recorded else unrecorded(capture))
    for path in set(routes.ready) - set(routes.version):
        app.router.add_get(path, ok)
    for path in routes.version:
        app.router.add_get(path, version)
    # trtllm-serve mounts /prometheus/metrics only with return_perf_metrics: true in its options file
    trtllm_without_page = engine == "trtllm" and not (
        llm_api_options and "return_perf_metrics: true" in llm_api_options.read_text()
    )
    if routes.metrics and not trtllm_without_page:
        app.router.add_get(routes.metrics, metrics)
    for path in routes.profile:
        app.router.add_post(path, profile)
    for path in routes.extra_posts:  # e.g. what `ollama pull` asks of the server
        app.router.add_post(path, success)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", required=True, choices=sorted(ROUTES))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--extra_llm_api_options", type=Path, default=None)  # trtllm-serve's YAML options
    args = parser.parse_args()
    print(f"PORT {args.port}", flush=True)
    web.run_app(
        build_app(args.engine, args.itl_ms / 1000, args.log, args.extra_llm_api_options),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
