"""Can this machine start the engine a tune launches? Checked once before the search, so a missing engine is one
clear line rather than a launch failure per configuration (issue 39: six launches, then "no configuration met the
SLOs"). Looks only: the command's program on PATH, or, for `python -m MODULE`, the module's package importable by
the interpreter that would run it. Nothing is started."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.engine.launcher import BackendUnreachable, engine_command
from harness.engine.session import engine_for
from harness.scenario.scenario import Scenario, ScenarioError


@dataclass(frozen=True)
class EngineCheck:
    startable: bool
    line: str  # what the console says, either way


def check_engine(scenario: Scenario) -> EngineCheck | None:
    """Whether the engine the scenario launches can start here; None when it launches none (backend.url)."""
    launch = scenario.backend.launch
    if launch is None:
        return None
    try:
        command = engine_command(engine_for(scenario), launch, 0, scenario.backend.model)
    except (BackendUnreachable, ScenarioError, ValueError) as e:  # the backend refuses its own command: say so
        return EngineCheck(False, f"engine: {scenario.backend.kind} cannot build its launch command: {e}")
    if len(command) >= 3 and command[0] == sys.executable and command[1] == "-m":
        package = command[2].split(".")[0]
        found = importlib.util.find_spec(package)  # the top-level package only: nothing of it is imported
        if found is None:
            return EngineCheck(
                False,
                f"engine: `python -m {command[2]}` cannot start: {package!r} is not importable by {sys.executable}; "
                f"install it there (pip install {package}), or point backend.launch.program at an engine that is",
            )
        return EngineCheck(True, f"engine: {package} importable ({found.origin}); each configuration launches it")
    program = command[0]
    where = shutil.which(program) or (program if Path(program).is_file() else None)
    if where is None:
        return EngineCheck(
            False,
            f"engine: {program!r} is not on PATH; install it, or give its full path in backend.launch.program",
        )
    return EngineCheck(True, f"engine: {where} found; each configuration launches it")
