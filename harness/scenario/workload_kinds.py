"""Workload kinds, registered like backends and arrival processes: `workload.kind` names one in WORKLOADS,
each one class (harness/scenario/workload.py holds the built-ins; docs/extending.md). What a kind says of its
settings (the fields only it uses, those it needs, its own checks) is read when a scenario is validated;
its `schedule` builds the requests. Found by "module:Class" name (backends/registry.py), as backends are, so this
module stays below harness/scenario/scenario.py, which validates with it, and harness/scenario/workload.py, which
builds on both.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar

from backends.registry import registered_class

WORKLOADS = {
    "random": "harness.scenario.workload:RandomWorkload",
    "shared_prefix": "harness.scenario.workload:SharedPrefixWorkload",
    "multi_turn": "harness.scenario.workload:MultiTurnWorkload",
    "file": "harness.scenario.workload:FileWorkload",
    "repeat": "harness.scenario.workload:RepeatWorkload",
    "structured": "harness.scenario.workload:StructuredWorkload",
    "agentic": "harness.scenario.agentic:AgenticWorkload",
}


class WorkloadKindError(ValueError):
    """A workload that does not suit its kind; the message names the field and the fix."""


class WorkloadKind:
    """One workload kind, named by workload.kind: the WorkloadConfig fields only it uses (`fields`), those of them
    it needs (`required`), its own checks, and the schedule of its requests."""

    name: ClassVar[str]
    fields: ClassVar[tuple[str, ...]] = ()
    required: ClassVar[tuple[str, ...]] = ()

    def check(self, workload: Any) -> None:
        """WorkloadKindError naming the field when `workload` (a WorkloadConfig) does not suit this kind."""

    def schedule(self, scenario: Any, tokenizer: Any) -> Any:
        """The scenario's harness.scenario.workload.RequestSchedule."""
        raise NotImplementedError


@cache
def workload_kind(name: str) -> WorkloadKind:
    """The workload kind called `name`; WorkloadKindError naming workload.kind and the known ones if none is."""
    kind = registered_class(
        name,
        WORKLOADS,
        lambda: WorkloadKindError(f"workload.kind: {name!r} is not a workload kind; known: {', '.join(WORKLOADS)}"),
    )
    return kind()
