"""Why a file is no peer result: the tool and shape it comes closest to, and the keys it lacks.

A file that parses is compared with every format's signature keys (reports/peers/common.py `PeerFormat`); one that
does not (cut short while being written, or not JSON/YAML at all) has its keys taken from the text itself
(`"name":` or `name:` at a line's start), so a truncated vLLM file still names vLLM.
"""

from __future__ import annotations

import re
from pathlib import Path

from reports.peers.common import PeerFormat, document

KEY_IN_TEXT = re.compile(r'"([A-Za-z_][\w.]*)"\s*:|^\s*([A-Za-z_][\w.]*):', re.MULTILINE)
HEAD_BYTES = 2_000_000  # a truncated file's keys are read from its first 2 MB: result files here are < 300 KB


def text_keys(path: Path) -> set[str]:
    try:
        with path.open("rb") as f:
            text = f.read(HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return set()
    return {a or b for a, b in KEY_IN_TEXT.findall(text)}


def nested_keys(value, depth: int = 3) -> set[str]:
    """Every key of a parsed file down to `depth` levels (signatures name top-level keys; wrappers nest them)."""
    if depth == 0:
        return set()
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in nested_keys(v, depth - 1)}
    if isinstance(value, list) and value:
        return nested_keys(value[-1], depth)
    return set()


def header_cells(rows: list, header_rows: int = 3) -> set[str]:
    """The cells of a CSV's header rows (GuideLLM writes three: group, field, unit): its keys, as a CSV has them."""
    return {cell for row in rows[:header_rows] if isinstance(row, list) for cell in row if cell}


def not_a_peer_file(path: Path, formats: tuple[PeerFormat, ...]) -> str:
    """The refusal of a path no format takes: what it is not, what it comes closest to, and what that lacks."""
    known = ", ".join(sorted({f.tool for f in formats}))
    if path.is_dir():
        return f"{path}: a folder with no result file of a known tool ({known}) and no run of ours; see docs/peers.md"
    if not path.is_file():
        return f"{path}: no such file or folder"
    parsed = document(path)
    keys = nested_keys(parsed) if parsed is not None else text_keys(path)
    if path.suffix == ".csv" and isinstance(parsed, list):
        keys = header_cells(parsed)
    how = "" if parsed is not None else " (it does not parse: cut short or not JSON/YAML; its keys read from its text)"
    # the formats that write this suffix (a .json is no SGLang JSON-lines file), all of them for an odd suffix
    fitting = [f for f in formats if path.suffix in f.suffixes and f.signature] or [f for f in formats if f.signature]
    scored = [(len(set(f.signature + f.hints) & keys) / len(f.signature + f.hints), f) for f in fitting]
    share, best = max(scored, key=lambda s: s[0]) if scored else (0.0, None)
    if best is None or share < 0.5:  # one shared key of five (a bare "duration") says nothing of the tool
        return f"{path}: not a result file of a known tool ({known}){how}; see docs/peers.md"
    missing = [k for k in best.signature if k not in keys]
    lacks = f"lacks {', '.join(missing)}" if missing else "has its keys, but not in the shape it writes them"
    return (
        f"{path}: closest to {best.tool}, {best.shape}, but {lacks}{how}; pass the file the tool saved, "
        f"or see docs/peers.md for the versions read"
    )
