"""Paths written in a scenario: a relative one is taken from the scenario file's folder."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationInfo


def scenario_path(value: str, info: ValidationInfo) -> Path:
    """`value` as a path, `~` expanded; a relative one joined to the folder load_scenario gives the validation
    as its context's base_dir (the working directory for a scenario validated without one)."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    return Path((info.context or {}).get("base_dir", ".")) / path
