"""No function longer than 60 lines (the developers' guide), in the packages that meet it so far:
`python tests/test_function_length.py` lists the longest ones of every package."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 60
CHECKED = ("native_engine",)  # harness/ joins when its last long function is split (issue 27)


def function_lengths(package: str) -> list[tuple[int, str]]:
    """(lines, "path:line name") of every function and method in the package, decorators excluded."""
    rows = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
                rows.append((node.end_lineno - node.lineno + 1, where))
    return sorted(rows, reverse=True)


def test_no_function_is_longer_than_60_lines():
    too_long = [row for package in CHECKED for row in function_lengths(package) if row[0] > MAX_LINES]
    assert not too_long, f"functions over {MAX_LINES} lines (split them): {too_long}"


if __name__ == "__main__":
    for package in sys.argv[1:] or ("harness", "backends", "reports", "native_engine"):
        for lines, where in function_lengths(package)[:5]:
            print(lines, where)
