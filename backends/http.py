"""The one small blocking HTTP client of the project (probes, /tokenize, profiler hooks, /metrics pages).

The load itself goes through aiohttp in harness/client/runner.py; everything else is a handful of
requests made before or after it, and they all go through `request` here.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def request(
    url: str, body: dict | None = None, headers: dict | None = None, timeout_s: float = 5.0
) -> tuple[int, bytes]:
    """GET `url`, or POST `body` as JSON. Returns (HTTP status, response bytes) for any answer, errors
    included; raises OSError (URLError, timeout, refused) when no HTTP answer came."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method="GET" if body is None else "POST",
        headers={**({"Content-Type": "application/json"} if data else {}), **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def http_get(url: str, headers: dict | None = None, timeout_s: float = 5.0) -> str:
    """The text of a page; an HTTP error status raises urllib.error.HTTPError (an OSError)."""
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", errors="replace")


def http_post(url: str, body: dict, headers: dict | None = None, timeout_s: float = 30.0) -> int:
    """POSTs a JSON body; returns the HTTP status."""
    return request(url, body, headers, timeout_s)[0]
