"""Emptying the prefix cache between benchmark points: the block manager's reset, the native server's
POST /reset_prefix_cache (vLLM's route) and harness.engine.prefix_reset, which `bench tune` calls before each trial."""

import asyncio

import aiohttp

from backends import load_backend
from harness.engine.prefix_reset import reset_prefix_cache
from harness.engine.session import EngineSession
from native_engine.llm_engine import EngineConfig, LLMEngine
from native_engine.server import start_server

PROMPT = "the same long system prompt, sent again and again " * 6


async def _cached_tokens(http, url: str) -> int:
    """The prompt tokens the engine took from its cache for one more request of PROMPT (its timings' cache_n)."""
    body = {"prompt": PROMPT, "max_tokens": 2, "stream": True}
    async with http.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        text = await resp.text()
    return next(
        int(line.split('"cache_n":')[1].split(",")[0].split("}")[0])
        for line in text.splitlines()
        if '"cache_n"' in line
    )


async def test_reset_route_empties_the_prefix_cache(tiny):
    engine = LLMEngine(EngineConfig(kv_cache_tokens=4096), tiny)
    runner, port = await start_server(engine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            assert await _cached_tokens(http, url) == 0
            warm = await _cached_tokens(http, url)
            assert warm >= 16  # the second time its full blocks come from the cache
            assert await _cached_tokens(http, url) == warm
            session = EngineSession(load_backend("native"), url, None)
            # a blocking POST, as bench makes it: off this loop, which serves the engine
            assert await asyncio.to_thread(reset_prefix_cache, session, {}) == "reset"
            assert await _cached_tokens(http, url) == 0  # computed again: nothing was cached
            assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    finally:
        await runner.cleanup()


def test_backends_without_the_route_say_so():
    session = EngineSession(load_backend("openai"), "http://127.0.0.1:9", None)
    assert reset_prefix_cache(session, {}).startswith("not reset: the openai backend has no prefix-cache reset")
    assert load_backend("vllm").prefix_cache_reset_path == "/reset_prefix_cache"
    assert load_backend("sglang").prefix_cache_reset_path == "/flush_cache"
