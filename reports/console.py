"""What the reports commands (`report`, `gate`, `select`, `history`) print on stderr, and their exit codes."""

from __future__ import annotations

import typer
from rich.console import Console

console = Console(stderr=True)
EXIT_REGRESSION, EXIT_BAD_INPUT = 1, 2


def fail(message: str) -> typer.Exit:
    """Prints the error; the caller raises what it returns (exit 2)."""
    console.print(f"[bold red]error[/]: {message}", highlight=False, soft_wrap=True)  # paths stay whole
    return typer.Exit(EXIT_BAD_INPUT)


def warn(runs) -> None:
    for run in runs:
        for warning in run.warnings:
            console.print(f"[yellow]warning[/]: {warning}", highlight=False, soft_wrap=True)
