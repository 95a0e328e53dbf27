"""`bench import FILE --output RUN_DIR`: another tool's result file written as a results folder of ours.

The folder holds what `bench run` writes (run.json, summary.json, requests.jsonl: the tool's figures under our keys,
its requests rebuilt where the file has them; docs/peers.md) and `peer.json`: the tool, its version, the source file
with its SHA-256, and every place the tool's definitions differ from ours, so the folder says where it came from.
Exit codes as reports/cli.py: 0 written, 2 a file no reader takes (naming the closest tool and what it lacks).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import typer

from reports.console import console
from reports.console import fail as _fail

PEER_FILE = "peer.json"  # beside our run files: which tool's file this folder was imported from


def import_peer(source: Path, output: Path, overwrite: bool = False) -> Path:
    """Writes `source` (a peer file, or a folder holding one) as a results folder at `output`; returns the file
    read. ResultsError for a file no reader takes, or an output folder that holds a run already."""
    from harness.results.folder import ResultWriter
    from reports.load import load_peer_run
    from reports.peers import find_peer_file, load_peer

    run = load_peer_run(source)
    peer = load_peer(source)  # the tool's own account: version, differences, warnings
    file = find_peer_file(source)
    writer = ResultWriter(output, overwrite)
    try:
        writer.write_run_info(run.run_info)
        for record in run.records:
            writer.append(record)
        writer.write_summary(run.summary)
    finally:
        writer.close()
    note = {
        "tool": peer.tool,
        "version": peer.version,
        "source": str(file),
        "source_sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
        "differences": peer.differences,
        "warnings": peer.warnings,
    }
    (Path(output) / PEER_FILE).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")
    return file


def import_command(
    source: Path = typer.Argument(..., help="another tool's result file (docs/peers.md lists the ones read)"),
    output: Path = typer.Option(..., "--output", "-o", help="results folder to write (as `bench run --output`)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a results folder already there"),
) -> None:
    """Write another tool's result file as a results folder of ours, with its definition differences recorded."""
    from harness.results.folder import ResultsError

    try:
        file = import_peer(source, output, overwrite)
    except ResultsError as e:
        raise _fail(str(e))
    console.print(f"{output}: imported {file} ({json.loads((output / PEER_FILE).read_text())['tool']})")
