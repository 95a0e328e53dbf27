"""The import graph of harness/, backends/, reports/ and native_engine/, read from the source (every
import, also those inside functions): no module cycle, and the harness library never imports reports.

`harness.cli` (and `harness.__main__`, which runs it) is the program's entry: the one module that wires
every package's commands into `bench`, so it sits above all packages and nothing imports it.
Run `python tests/test_architecture.py` to print the package graph.
"""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "backends", "reports", "native_engine")
ENTRY = {"harness.cli", "harness.__main__"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a package import counts as its __init__)."""
    files = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
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
                return stack[stack.index(nxt):] + [nxt]
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
    return "bench (entry)" if module in ENTRY else module.split(".")[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        out.setdefault(package_of(src), set()).update(package_of(t) for t in targets if package_of(t) != package_of(src))
    return out


def test_no_module_cycle():
    assert find_cycle(import_graph()) is None, f"import cycle: {' -> '.join(find_cycle(import_graph()))}"


def test_packages_depend_one_way_and_harness_never_imports_reports():
    graph = import_graph()
    packages = package_graph(graph)
    assert find_cycle(packages) is None, f"package cycle: {find_cycle(packages)}"
    assert "reports" not in packages["harness"]
    assert not [m for m, ts in graph.items() if ENTRY & ts and m not in ENTRY], "nothing imports the entry"
    assert packages["backends"] <= set() and packages["native_engine"] <= set()


if __name__ == "__main__":
    pkgs = package_graph(import_graph())
    for pkg in sorted(pkgs):
        print(f"{pkg} -> {', '.join(sorted(pkgs[pkg])) or '(nothing)'}")
    cycle = find_cycle(import_graph())
    print("module cycle:", " -> ".join(cycle) if cycle else "none")
    sys.exit(1 if cycle or "reports" in pkgs["harness"] else 0)
