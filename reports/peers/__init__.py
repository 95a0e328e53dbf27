"""Result files of other benchmarking tools ("peers"), read as runs of ours for bench report, select and gate.

One module per tool, each with TOOL, matches(path) and load(path) -> PeerRun (reports/peers/common.py); FORMATS
lists them. A path is a peer result when it is such a file, or a folder holding exactly one (AIPerf's artifact
folder). How each tool's figures map onto ours and where the definitions differ: docs/peers.md.
"""

from __future__ import annotations

from pathlib import Path

from harness.results.folder import CANDIDATES_MANIFEST, MANIFEST, RUN_FILES, ResultsError
from reports.peers import aiperf, guidellm, sglang, vllm
from reports.peers.common import PeerRun

FORMATS = (vllm, sglang, aiperf, guidellm)
OUR_FILES = {*RUN_FILES, MANIFEST, CANDIDATES_MANIFEST}
__all__ = ["FORMATS", "PeerRun", "find_peer_file", "load_peer"]


def _format_of(path: Path):
    return next((fmt for fmt in FORMATS if fmt.matches(path)), None)


def find_peer_file(path: str | Path) -> Path | None:
    """The peer result file a path names: the file itself, or the one peer file in a folder that holds no run of
    ours; None otherwise."""
    path = Path(path)
    if path.is_file():
        return path if _format_of(path) else None
    if not path.is_dir() or (path / "requests.jsonl").exists():
        return None
    # the folder's own files only, never ours: a sweep or tune folder is not searched (its requests.jsonl can be large)
    candidates = [p for p in sorted(path.iterdir()) if p.is_file() and p.name not in OUR_FILES]
    found = [p for p in candidates if p.suffix in (".json", ".jsonl") and _format_of(p)]
    if len(found) > 1:
        names = ", ".join(str(p) for p in found)
        raise ResultsError(f"{path}: holds several peer result files ({names}); pass one file")
    return found[0] if found else None


def load_peer(path: str | Path) -> PeerRun:
    file = find_peer_file(path)
    if file is None:
        raise ResultsError(
            f"{path}: not a result file of a known tool ({', '.join(f.TOOL for f in FORMATS)}); see docs/peers.md"
        )
    return _format_of(file).load(file)
