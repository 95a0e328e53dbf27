"""Emptying an engine's prefix cache between two measured points, so a point does not start with the
previous one's prompts cached (`bench tune`). The route is the backend's `prefix_cache_reset_path`:
vLLM's POST /reset_prefix_cache, SGLang's POST /flush_cache, the native engine's POST /reset_prefix_cache.
"""

from __future__ import annotations

from backends.base import http_post
from harness.engine.session import EngineSession


def reset_prefix_cache(session: EngineSession, headers: dict) -> str:
    """What happened, for the trial's record: reset, not available, or the engine's refusal."""
    engine = session.engine
    path = engine.prefix_cache_reset_path
    if not path:
        return f"not reset: the {engine.name} backend has no prefix-cache reset route"
    try:
        code = http_post(session.url + path, {}, headers)
    except OSError as e:
        return f"not reset: POST {path} failed ({e})"
    return "reset" if code is not None and code < 400 else f"not reset: POST {path} answered HTTP {code}"
