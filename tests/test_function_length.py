"""No function longer than 60 lines (issues 27 and 36): from its `def` line to its last line, nested ones and methods
included, in harness/, native_engine/, backends/ and reports/. `python tests/test_function_length.py` lists the
longest of each."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = ("harness", "native_engine", "backends", "reports")
MAX_LINES = 60


def long_functions(folder: Path, max_lines: int = MAX_LINES) -> list[str]:
    """'path:line name (N lines)' for every function in folder's .py files longer than max_lines."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > max_lines:
                    found.append(f"{path.relative_to(folder.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_60_lines():
    too_long = [where for root in ROOTS for where in long_functions(ROOT / root)]
    assert not too_long, "split these into named helpers:\n" + "\n".join(too_long)


def test_the_check_finds_a_long_function(tmp_path):
    # the rule itself: 60 lines from def to the end pass, 61 fail, a method inside a class is found
    lines = [f"x{i} = {i}" for i in range(59)]
    (tmp_path / "ok.py").write_text("def fits():\n" + "".join(f"    {line}\n" for line in lines))
    method = "".join(f"        {line}\n" for line in [*lines, "y = 1"])
    (tmp_path / "long.py").write_text(f"class C:\n    def too_long(self):\n{method}")
    found = long_functions(tmp_path)
    assert len(found) == 1 and "long.py:2 too_long (61 lines)" in found[0]


if __name__ == "__main__":  # the longest functions of each folder: python tests/test_function_length.py [N]
    import sys

    for root in ROOTS:
        found = long_functions(ROOT / root, int(sys.argv[1]) if len(sys.argv) > 1 else 45)
        print(*sorted(found, key=lambda w: -int(w.rsplit("(", 1)[1].split()[0]))[:5], sep="\n")
