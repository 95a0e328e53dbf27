"""The repository as a fresh clone sees it: no file names a path of the machine it was written on."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a home or work folder of one machine ("/" + "root/" etc., spelled so that this file does not match itself)
MACHINE_PATH = re.compile("/" + "(work|root|home)/")


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], check=False, cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.decode().strip()}): the tracked files are unknown")
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


def test_no_tracked_file_names_an_absolute_machine_path():
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue  # deleted in the work tree, not yet committed
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary (the report screenshot)
        found += [
            f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for n, line in enumerate(text.splitlines(), 1)
            if MACHINE_PATH.search(line)
        ]
    assert not found, "absolute machine paths (use a path relative to the repository, or a placeholder):\n" + "\n".join(
        found
    )
