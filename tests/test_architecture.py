"""The import graph of harness/, backends/, reports/ and native_engine/, read from the source (every
import, also those inside functions): no module cycle, no package cycle, and no module of harness (its
CLI included) imports reports. The commands of reports and native_engine reach `bench` through the
`bench.commands` entry-point group instead (tested here too).

harness may import native_engine in two places, both lazily: its GGUF tokenizer (exact prompt lengths
from a local GGUF file) and its BLAS read-bandwidth probe (host telemetry). native_engine imports nothing
of the harness, so that edge stays one way.
Run `python tests/test_architecture.py` to print the package graph.
"""

import ast
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "backends", "reports", "native_engine")
# the only modules of harness that import native_engine, and what they take from it
HARNESS_USES_NATIVE_ENGINE = {
    "harness.scenario.tokenizer_source": {"native_engine.model_files", "native_engine.tokenizer"},
    "harness.engine.telemetry.host": {"native_engine.blas"},
    # bench plan runs the engine's own scheduler, block manager, router policy and argument parsing (no copy of
    # them), and reads a GGUF's architecture with the engine's reader
    "harness.plan.architectures": {"native_engine.gguf_model"},
    # bench inspect-model: the same GGUF reader, and `smollm2` found where the engine finds it
    "harness.plan.model_inspect": {"native_engine.gguf_model", "native_engine.model_files"},
    "harness.plan.deployment": {"native_engine.cli", "native_engine.config", "native_engine.disaggregation"},
    "harness.plan.disaggregation": {"native_engine.disaggregation"},
    "harness.plan.replica": {"native_engine.block_manager", "native_engine.scheduler", "native_engine.sequence"},
    "harness.plan.decode_run": {"native_engine.scheduler", "native_engine.sequence"},
    "harness.plan.simulator": {
        "native_engine.llm_engine",
        "native_engine.routing_policy",
        "native_engine.scheduler",
        "native_engine.sequence",
        "native_engine.server",
    },
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports (a package import counts as its __init__)."""
    files = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            else:
                continue
            for n in names:
                while n and n not in files:  # `from pkg import mod` names a module; `from mod import f` does not
                    n = n.rpartition(".")[0]
                if n and n != name:
                    targets.add(n)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def package_of(module: str) -> str:
    return module.split(".")[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        out.setdefault(package_of(src), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(src)
        )
    return out


def test_no_module_cycle():
    assert find_cycle(import_graph()) is None, f"import cycle: {' -> '.join(find_cycle(import_graph()))}"


def test_packages_depend_one_way_and_harness_never_imports_reports():
    graph = import_graph()
    packages = package_graph(graph)
    assert find_cycle(packages) is None, f"package cycle: {find_cycle(packages)}"
    harness_imports = {
        m: {t for t in ts if package_of(t) in ("reports", "native_engine")}
        for m, ts in graph.items()
        if package_of(m) == "harness"
    }
    assert {m: ts for m, ts in harness_imports.items() if ts} == HARNESS_USES_NATIVE_ENGINE
    assert packages["reports"] == {"harness"}
    assert packages["backends"] == set() and packages["native_engine"] == set()


def test_other_packages_commands_come_from_the_entry_point_group():
    """report/gate/select/serve are in `bench` without harness importing them (an install older than the
    `bench.commands` group lacks them: reinstall with `pip install -e .`)."""
    from harness.cli.app import app

    assert {"report", "gate", "select", "serve"} <= {info.name for info in app.registered_commands}
    assert "history" in {info.name for info in app.registered_groups}


def _declared(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group="bench.commands")


def test_a_declared_command_is_added_or_stops_bench_naming_it():
    from harness.cli.app import add_declared_commands

    cli = typer.Typer()
    cli.command()(lambda: None)  # a first command, named "<lambda>"
    add_declared_commands(cli, [_declared("tidy", "shutil:rmtree")])
    assert [info.name for info in cli.registered_commands][-1] == "tidy"
    for bad, why in (
        (_declared("ghost", "no_such_module_here:ghost"), "ModuleNotFoundError"),
        (_declared("gone", "shutil:no_such_function"), "AttributeError"),
        (_declared("plain", "shutil:__name__"), "not a function"),
        (_declared("tidy", "os:getcwd"), "already exists"),
    ):
        with pytest.raises(RuntimeError) as error:
            add_declared_commands(cli, [bad])
        assert f"bench command {bad.name!r}" in str(error.value) and bad.value in str(error.value)
        assert why in str(error.value)


if __name__ == "__main__":
    pkgs = package_graph(import_graph())
    for pkg in sorted(pkgs):
        print(f"{pkg} -> {', '.join(sorted(pkgs[pkg])) or '(nothing)'}")
    cycle = find_cycle(import_graph())
    print("module cycle:", " -> ".join(cycle) if cycle else "none")
    sys.exit(1 if cycle or find_cycle(pkgs) or "reports" in pkgs["harness"] else 0)
