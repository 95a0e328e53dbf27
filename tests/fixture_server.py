"""Replays an engine's recorded stream and /metrics formats on 127.0.0.1, so `bench run` can go
its full path against engines that cannot run here (SGLang, TensorRT-LLM, Ollama, vLLM on GPU).

    python tests/fixture_server.py --engine sglang --port 8000 [--itl-ms 2] [--log PATH]

It answers at the paths the real engine serves (ROUTES below, each from the engine's own server source
or docs, cited), never at the paths backends/<engine>.py declares: a wrong path in a backend then fails
here as it would against the engine. Each generate path streams tests/fixtures/engines/<engine>_<file>
.{sse,ndjson} one event (SSE) or line (NDJSON) at a time, --itl-ms apart; the metrics path serves
<engine>_metrics.txt; readiness, version and profiler paths answer 200. Every request body it gets is
appended to --log as one JSON line ({"path", "body"}), so tests can check the dialect the harness spoke.

`--engine vllm --multimodal` serves the chat path as vLLM serving Qwen2-VL-7B-Instruct does (SmolLM2 has no vision,
so image prompts are tested here): each `image_url` content part must hold a base64 data URL of an image (vLLM's
MediaConnector._load_data_url, vllm-project/vllm vllm/multimodal/utils.py, commit 2e094595: split at ",", then ";",
base64 only, then the bytes opened as an image; here a PNG whose rows inflate to its IHDR's size, or a JPEG with a
frame header), else 400 in vLLM's error shape. The stream is vllm_chat_image.sse (vLLM's chat chunk format, as
vllm_chat.sse recorded it, naming the vision model; 8 tokens, its usage the text prompt's 37 tokens), with the final
usage's prompt_tokens raised by each image's tokens as Qwen2-VL counts them (qwen2_vl_image_tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import math
import struct
import zlib
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


VISION_MODEL = "Qwen/Qwen2-VL-7B-Instruct"
VISION_MARKERS = 2  # <|vision_start|> and <|vision_end|> around each image's pads in Qwen2-VL's chat template


def qwen2_vl_image_tokens(width: int, height: int) -> int:
    """An image's tokens in Qwen2-VL: smart_resize rounds each side to a multiple of 28 (patch 14 x merge 2) and keeps
    the area within [56 * 56, 28 * 28 * 1280] (the processor's min_pixels and max_pixels), then one token per 28 x 28
    (2 x 2 patches merged); plus its two markers (huggingface/transformers
    src/transformers/models/qwen2_vl/image_processing_qwen2_vl.py, commit 009f6376: smart_resize, grid_h * grid_w
    patches, merge_size 2). 512 x 512 -> 504 x 504 -> 18 x 18 = 324 pads + 2."""
    factor, min_pixels, max_pixels = 28, 56 * 56, 28 * 28 * 1280
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar, w_bar = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return (h_bar // factor) * (w_bar // factor) + VISION_MARKERS


def decoded_image(url) -> tuple[str, int, int]:
    """(mime, width, height) of a data URL's image; ValueError saying what is wrong, as vLLM refuses it."""
    if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
        raise ValueError("image_url.url must be a data URL (data:image/png;base64,...) on this replay")
    spec, data = url[5:].split(",", 1)
    media_type, _, data_type = spec.partition(";")
    if data_type != "base64":
        raise ValueError("Only base64 data URLs are supported for now.")
    try:
        raw = base64.b64decode(data, validate=True)
    except binascii.Error as error:
        raise ValueError(f"the data URL is not base64: {error}") from None
    if raw.startswith(b"\x89PNG\r\n\x1a\n") and raw[12:16] == b"IHDR":
        width, height, depth, colour = struct.unpack(">IIBB", raw[16:26])
        channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour)
        idat = b"".join(_png_chunks(raw, b"IDAT"))
        if depth != 8 or channels is None or len(zlib.decompress(idat)) != height * (1 + width * channels):
            raise ValueError("cannot identify image file: its PNG rows do not match its header")
        return media_type, width, height
    if raw.startswith(b"\xff\xd8"):
        at = 2
        while at + 9 <= len(raw) and raw[at] == 0xFF:
            marker = raw[at + 1]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", raw[at + 5 : at + 9])
                return media_type, width, height
            at += 2 + struct.unpack(">H", raw[at + 2 : at + 4])[0]
    raise ValueError("cannot identify image file")


def _png_chunks(raw: bytes, kind: bytes):
    at = 8
    while at + 8 <= len(raw):
        length = struct.unpack(">I", raw[at : at + 4])[0]
        if raw[at + 4 : at + 8] == kind:
            yield raw[at + 8 : at + 8 + length]
        at += 12 + length


def image_tokens(body: dict) -> int:
    """The image tokens of a chat request's image_url parts; ValueError naming the part that is not an image."""
    tokens = 0
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") == "image_url":
                try:
                    _, width, height = decoded_image((part.get("image_url") or {}).get("url"))
                except ValueError as error:
                    raise ValueError(f"messages[{i}].content[{j}]: {error}") from None
                tokens += qwen2_vl_image_tokens(width, height)
    return tokens


def with_prompt_tokens(chunk: bytes, extra: int) -> bytes:
    """An SSE event with its usage's prompt_tokens and total_tokens raised by `extra` (others as they are)."""
    if b'"usage"' not in chunk:
        return chunk
    event = json.loads(chunk.removeprefix(b"data: "))
    event["usage"]["prompt_tokens"] += extra
    event["usage"]["total_tokens"] += extra
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def units(engine: str, capture: str) -> tuple[list[bytes], str]:
    """The stream split into what the engine sends at once, and its content type."""
    stem = FIXTURES / f"{engine}_{capture}"
    if stem.with_suffix(".ndjson").is_file():
        lines = stem.with_suffix(".ndjson").read_bytes().splitlines(keepends=True)
        return lines, "application/x-ndjson"
    events = stem.with_suffix(".sse").read_bytes().split(b"\n\n")
    return [e + b"\n\n" for e in events if e.strip()], "text/event-stream"


def build_app(
    engine: str,
    itl_s: float,
    log_path: Path | None,
    llm_api_options: Path | None = None,
    multimodal: bool = False,
) -> web.Application:
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

    def vision_streamer():
        chunks, content_type = units(engine, "chat_image")

        async def handler(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            note(request.path, body)
            try:
                extra = image_tokens(body)
            except ValueError as error:  # vLLM's ErrorResponse shape
                error_body = {"object": "error", "message": str(error), "type": "BadRequestError", "code": 400}
                return web.json_response({**error_body, "param": None}, status=400)
            resp = web.StreamResponse(headers={"Content-Type": content_type})
            await resp.prepare(request)
            for chunk in chunks:
                await asyncio.sleep(itl_s)
                await resp.write(with_prompt_tokens(chunk, extra))
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
        if multimodal and capture == "chat":
            app.router.add_post(path, vision_streamer())
            continue
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
    parser.add_argument("--multimodal", action="store_true")  # vllm: the chat path takes images (Qwen2-VL)
    args = parser.parse_args()
    if args.multimodal and args.engine != "vllm":
        parser.error("--multimodal replays vLLM's vision chat only; use --engine vllm")
    print(f"PORT {args.port}", flush=True)
    web.run_app(
        build_app(args.engine, args.itl_ms / 1000, args.log, args.extra_llm_api_options, args.multimodal),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
