"""A request body's Content-Encoding undone here rather than by aiohttp, so that a body that is not what its
header says gets a 400 naming the header (aiohttp's own decoding gave a 500 and a traceback, issue 37).

The servers run with `auto_decompress=False` and call decoded_body on what they read.
"""

from __future__ import annotations

import zlib

SUPPORTED = ("identity", "gzip", "x-gzip", "deflate")


class ContentEncodingError(ValueError):
    """Why a body cannot be decoded: the message, the request part to name, and the HTTP status."""

    def __init__(self, message: str, param: str = "Content-Encoding", status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def decoded_body(raw: bytes, content_encoding: str, max_bytes: int) -> bytes:
    """The body with its Content-Encoding undone (the codings are listed in the order applied), never past
    max_bytes decoded (a small gzip can hold gigabytes: status 413)."""
    for coding in reversed([c.strip().lower() for c in content_encoding.split(",") if c.strip()]):
        if coding not in SUPPORTED:
            raise ContentEncodingError(
                f"Content-Encoding {coding!r} is not supported here; send the body uncompressed (no "
                "Content-Encoding header) or as gzip or deflate"
            )
        if coding != "identity":
            raw = undo_zlib_coding(raw, coding, max_bytes)
    return raw


def undo_zlib_coding(raw: bytes, coding: str, max_bytes: int) -> bytes:
    # "deflate" is zlib-wrapped by the HTTP spec, raw deflate from some clients (low nibble 8: zlib's header)
    wbits = 16 + zlib.MAX_WBITS if "gzip" in coding else zlib.MAX_WBITS if raw[:1] and raw[0] & 0xF == 8 else -15
    decompressor = zlib.decompressobj(wbits)
    fix = f"send it uncompressed with no Content-Encoding header, or compressed as {coding} as the header says"
    try:
        decoded = decompressor.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise ContentEncodingError(
            f"request body is not {coding} data though Content-Encoding says so ({exc}); {fix}"
        ) from None
    if len(decoded) > max_bytes:
        raise ContentEncodingError(
            f"request body decompresses to over this server's limit of {max_bytes} bytes; send a shorter prompt",
            "body",
            413,
        )
    if not decompressor.eof or decompressor.unused_data:
        where = "ends inside" if not decompressor.eof else "has bytes after"
        raise ContentEncodingError(f"request body {where} its {coding} stream (Content-Encoding); {fix}")
    return decoded
