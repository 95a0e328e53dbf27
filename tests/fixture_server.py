"""Replays an engine's recorded stream and /metrics formats on 127.0.0.1, so `bench run` can go
its full path against engines that cannot run here (SGLang, TensorRT-LLM, Ollama, vLLM on GPU).

    python tests/fixture_server.py --engine sglang --port 8000 [--itl-ms 2] [--log PATH]

It answers at the paths the engine's backend declares (backends/<engine>.py): each generate
path streams tests/fixtures/engines/<engine>_<api>.{sse,ndjson} one event (SSE) or line
(NDJSON) at a time, --itl-ms apart; the metrics path serves <engine>_metrics.txt; readiness,
version and profiler paths answer 200. Every request body it gets is appended to --log as
one JSON line ({"path", "body"}), so tests can check the dialect the harness spoke.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backends import load_backend  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
API_FILE = {"completions": "completions", "chat": "chat", "native": "generate"}


def units(engine: str, api: str) -> tuple[list[bytes], str]:
    """The stream split into what the engine sends at once, and its content type."""
    stem = FIXTURES / f"{engine}_{API_FILE[api]}"
    if stem.with_suffix(".ndjson").is_file():
        lines = stem.with_suffix(".ndjson").read_bytes().splitlines(keepends=True)
        return lines, "application/x-ndjson"
    events = stem.with_suffix(".sse").read_bytes().split(b"\n\n")
    return [e + b"\n\n" for e in events if e.strip()], "text/event-stream"


def build_app(engine: str, itl_s: float, log_path: Path | None, llm_api_options: Path | None = None) -> web.Application:
    backend = load_backend(engine)

    def note(path: str, body) -> None:
        if log_path:
            with open(log_path, "a") as f:
                f.write(json.dumps({"path": path, "body": body}) + "\n")

    def streamer(api: str):
        chunks, content_type = units(engine, api)

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

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "data": [{"id": "smollm2", "object": "model"}]})

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": f"{engine}-fixture", "build_info": f"{engine}-fixture"})

    async def profile(request: web.Request) -> web.Response:
        note(request.path, None)
        return web.Response(text="ok")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=(FIXTURES / f"{engine}_metrics.txt").read_text(), content_type="text/plain")

    app = web.Application()
    for api, path in backend.paths.items():
        if any((FIXTURES / f"{engine}_{API_FILE[api]}{ext}").is_file() for ext in (".sse", ".ndjson")):
            app.router.add_post(path, streamer(api))
    for path in {*backend.ready_paths, "/v1/models"} - {backend.version_path}:
        app.router.add_get(path, ok)
    if backend.version_path:
        app.router.add_get(backend.version_path, version)
    # trtllm-serve mounts /prometheus/metrics only with return_perf_metrics: true in its options file
    trtllm_without_page = engine == "trtllm" and not (
        llm_api_options and "return_perf_metrics: true" in llm_api_options.read_text())
    if backend.metrics_path and not trtllm_without_page:
        app.router.add_get(backend.metrics_path, metrics)
    for path in backend.profile_paths or ():
        app.router.add_post(path, profile)
    if engine == "ollama":  # what `ollama pull` asks of the server
        async def pull(request: web.Request) -> web.Response:
            note(request.path, await request.json())
            return web.json_response({"status": "success"})
        app.router.add_post("/api/pull", pull)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--extra_llm_api_options", type=Path, default=None)  # trtllm-serve's YAML options
    args = parser.parse_args()
    print(f"PORT {args.port}", flush=True)
    web.run_app(build_app(args.engine, args.itl_ms / 1000, args.log, args.extra_llm_api_options), host="127.0.0.1", port=args.port,
                print=None, access_log=None)


if __name__ == "__main__":
    main()
