"""What is slow to derive from a model file, kept in the user's cache folder: an entry per file, named by the file's
path, size and mtime, so a rewritten file is read again and an entry is never used for another file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CACHE_ENV = "LLM_SERVING_BENCH_CACHE"  # a cache folder other than ~/.cache/llm-serving-bench


def cache_dir(kind: str) -> Path:
    """The folder of one kind of entry (gguf-tokenizers, gguf-weights)."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else Path.home() / ".cache" / "llm-serving-bench") / kind


def file_identity(path: Path, version: int) -> str:
    """What an entry for the file at `path` is valid for: the layout's version, the file's path, size and mtime."""
    resolved = path.resolve()
    stat = resolved.stat()
    return f"{version}|{resolved}|{stat.st_size}|{stat.st_mtime_ns}"


def entry_name(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:32]
