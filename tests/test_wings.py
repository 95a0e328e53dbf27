"""harness/ in wings along the run's data flow (issue 36): each wing a sub-package, ordered from the results folder
up to the command line, and a lower wing never imports a higher one (every import read from the source, those inside
functions too). Beside the wings harness/ keeps at most four modules, and no group of modules is spelled as a file-name
prefix. `python tests/test_wings.py` prints which wings each wing imports, with the number of imports.

    results  the results folder, its typed models and JSON Schema files
    scenario the scenario file and the requests drawn from it (arrivals, workloads, prompts, traces), its blocks
    engine   the engine a run talks to: launch, readiness, observers, server metrics, telemetry, step trace
    client   the load generator: runner, stamped HTTP, worker processes, Ray actors
    metrics  what the records say: latencies, confidence, phases, diagnosis, validity, capacity under SLOs
    runs     one run as named steps, sweeps, candidates, repeats, early stops
    plan     `bench plan`: the simulated deployment
    tune     `bench tune`: the search of launch settings
    cli      `bench`'s command wiring and printing
"""

import sys
from collections import Counter

from test_architecture import ROOT, import_graph

WINGS = ("results", "scenario", "engine", "client", "metrics", "runs", "plan", "tune", "cli")  # lowest first
# modules beside the wings: the package itself, `python -m harness`, and the input limits every wing may read
TOP_LEVEL = {"harness.__init__", "harness.__main__", "harness.limits"}
MAX_TOP_LEVEL = 4
GROUP_PREFIXES = ("tune_", "probe", "ray_")  # the groups that were file-name prefixes, now folders


def wing_of(module: str) -> str | None:
    """The wing a harness module belongs to, None for a top-level module or another package's."""
    parts = module.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 and parts[1] in WINGS else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'module -> module' for every import from a lower wing (or harness.limits) to a higher one."""
    found = []
    for source, targets in sorted(graph.items()):
        source_rank = WINGS.index(wing_of(source)) if wing_of(source) else -1
        if source.split(".")[0] != "harness" or source == "harness.__main__":
            continue  # reports/ may read any wing; `python -m harness` is the command line itself
        for target in sorted(targets):
            if wing_of(target) and WINGS.index(wing_of(target)) > source_rank:
                found.append(f"{source} -> {target}")
    return found


def wing_graph(graph: dict[str, set[str]]) -> dict[str, Counter]:
    """wing -> Counter of the wings it imports (imports inside one wing not counted)."""
    out: dict[str, Counter] = {wing: Counter() for wing in WINGS}
    for source, targets in graph.items():
        if wing_of(source):
            out[wing_of(source)].update(wing_of(t) for t in targets if wing_of(t) and wing_of(t) != wing_of(source))
    return out


def test_a_lower_wing_never_imports_a_higher_one():
    assert not upward_imports(import_graph()), "imports against the wings' order:\n" + "\n".join(
        upward_imports(import_graph())
    )


def test_the_rule_finds_a_planted_upward_import(tmp_path):
    files = {
        "harness/__init__.py": "",
        "harness/limits.py": "",
        "harness/results/__init__.py": "",
        "harness/results/folder.py": "from harness.limits import X\n",
        "harness/metrics/__init__.py": "",
        "harness/metrics/latencies.py": "from harness.results.folder import read_records\n",
        "harness/cli/__init__.py": "",
        "harness/cli/app.py": "from harness.metrics.latencies import summarize\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert upward_imports(import_graph(tmp_path, ("harness",))) == []
    # a function-local import from the results folder up to the command line
    (tmp_path / "harness/results/folder.py").write_text("def f():\n    from harness.cli.app import app\n")
    (tmp_path / "harness/limits.py").write_text("import harness.metrics.latencies\n")
    assert upward_imports(import_graph(tmp_path, ("harness",))) == [
        "harness.limits -> harness.metrics.latencies",
        "harness.results.folder -> harness.cli.app",
    ]


def test_harness_is_its_wings_and_a_few_modules_beside_them():
    harness = ROOT / "harness"
    modules = {f"harness.{p.stem}" for p in harness.glob("*.py")}
    folders = {p.name for p in harness.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(WINGS), f"wings on disk {sorted(folders)}, in WINGS {list(WINGS)}: keep them one list"
    assert modules <= TOP_LEVEL and len(modules) <= MAX_TOP_LEVEL, f"modules beside the wings: {sorted(modules)}"
    prefixed = sorted(str(p.relative_to(ROOT)) for p in harness.rglob("*.py") if p.name.startswith(GROUP_PREFIXES))
    assert not prefixed, f"a group spelled as a file-name prefix (make it a folder): {prefixed}"


if __name__ == "__main__":
    imports = wing_graph(import_graph())
    for wing in WINGS:
        below = ", ".join(f"{w} ({imports[wing][w]})" for w in WINGS if imports[wing][w])
        print(f"{wing:9} -> {below or '(nothing)'}")
    upward = upward_imports(import_graph())
    print("upward imports:", "\n  ".join(["", *upward]) if upward else "none")
    sys.exit(1 if upward else 0)
