"""Result files of other benchmarking tools ("peers"), read as runs of ours for bench report, select, gate, history.

One class per tool and shape (reports/peers/common.py `PeerFormat`: its tool, its shape, how its content is known,
how it is read), each registered below, one line each; a file is read by the first format its content matches
(name and suffix decide nothing but the parser). A path is a peer result when it is such a file, or a folder holding
exactly one (AIPerf's artifact folder). A file no format takes is refused naming the closest tool and shape and the
keys it lacks (reports/peers/diagnose.py). How each tool's figures map onto ours: docs/peers.md.
"""

from __future__ import annotations

from pathlib import Path

from harness.results.folder import CANDIDATES_MANIFEST, MANIFEST, RUN_FILES, ResultsError
from reports.peers.aiperf import (
    AiperfCsv,
    AiperfJson,
    AiperfRecordsJsonl,
    AiperfRecordsJsonl2025,
    AiperfRecordsWrapper,
)
from reports.peers.common import PeerFormat, PeerRun
from reports.peers.diagnose import not_a_peer_file
from reports.peers.genai_bench import GenaiBenchRun
from reports.peers.guidellm import GuidellmBenchmarks, GuidellmBenchmarks2025, GuidellmCsv
from reports.peers.inference_perf import InferencePerfLifecycle
from reports.peers.llmd import LlmdReportV01, LlmdReportV02
from reports.peers.llmperf import LlmperfSummary
from reports.peers.sglang import SglangJsonl, SglangJsonlOld
from reports.peers.vllm import VllmBenchServe, VllmSweepSummary

# the more specific shape of a tool first: SGLang's 2025 key set holds every key of its 2024 one
FORMATS: tuple[PeerFormat, ...] = (
    VllmBenchServe(),
    VllmSweepSummary(),
    SglangJsonl(),
    SglangJsonlOld(),
    AiperfJson(),
    AiperfRecordsWrapper(),
    AiperfCsv(),
    AiperfRecordsJsonl(),
    AiperfRecordsJsonl2025(),
    GuidellmBenchmarks(),
    GuidellmBenchmarks2025(),
    GuidellmCsv(),
    GenaiBenchRun(),
    InferencePerfLifecycle(),
    LlmperfSummary(),
    LlmdReportV01(),
    LlmdReportV02(),
)
OUR_FILES = {*RUN_FILES, MANIFEST, CANDIDATES_MANIFEST}
PEER_SUFFIXES = {suffix for fmt in FORMATS for suffix in fmt.suffixes}
__all__ = ["FORMATS", "PeerRun", "find_peer_file", "format_of", "load_peer"]


def format_of(path: Path) -> PeerFormat | None:
    return next((fmt for fmt in FORMATS if fmt.matches(path)), None)


def find_peer_file(path: str | Path) -> Path | None:
    """The peer result file a path names: the file itself, or the one peer file in a folder that holds no run of
    ours; None otherwise."""
    path = Path(path)
    if path.is_file():
        return path if format_of(path) else None
    if not path.is_dir() or (path / "requests.jsonl").exists():
        return None
    # the folder's own files only, never ours: a sweep or tune folder is not searched (its requests.jsonl can be large)
    candidates = [p for p in sorted(path.iterdir()) if p.is_file() and p.name not in OUR_FILES]
    found = [p for p in candidates if p.suffix in PEER_SUFFIXES and format_of(p)]
    found = [p for p in found if format_of(p).part_of(p) not in found]  # AIPerf's records go with its figures
    if len(found) > 1:
        names = ", ".join(str(p) for p in found)
        raise ResultsError(f"{path}: holds several peer result files ({names}); pass one file")
    return found[0] if found else None


def load_peer(path: str | Path) -> PeerRun:
    file = find_peer_file(path)
    if file is None:
        raise ResultsError(not_a_peer_file(Path(path), FORMATS))
    return format_of(file).load(file)
