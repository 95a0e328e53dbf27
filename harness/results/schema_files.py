"""The JSON Schema files of docs/schema/, generated from harness/results/schema.py's models and RequestRecord (`bench
schema
--write`), and the check of a whole results folder against them (tests; docs/schema/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import TypeAdapter

from harness.results.folder import RequestRecord, validate_record
from harness.results.schema import MODELS, SCHEMA_VERSION, validate

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "schema"


def json_schemas() -> dict[str, dict]:
    """File name in docs/schema/ -> its JSON Schema."""
    out = {name.replace(".json", ".schema.json"): model.model_json_schema() for name, model in MODELS.items()}
    record = TypeAdapter(RequestRecord).json_schema()
    record["title"] = "RequestRecord"
    record["description"] = "One line of requests.jsonl; its schema_version is its folder's run.json's."
    out["request_record.schema.json"] = record
    for schema in out.values():
        schema["$comment"] = (
            f"schema_version {SCHEMA_VERSION}; generated from harness/results/schema.py by bench schema"
        )
    return out


def rendered() -> dict[str, str]:
    return {name: json.dumps(schema, indent=2, sort_keys=True) + "\n" for name, schema in json_schemas().items()}


def write_schemas(out_dir: Path = SCHEMA_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        (out_dir / name).write_text(text, encoding="utf-8")
        written.append(out_dir / name)
    return written


def validate_folder(path: Path) -> list[str]:
    """Every results file under `path` checked against its model; the files checked (SchemaError on the first
    that does not fit). Run folders, sweeps, candidates, repeats, plans and tune folders alike."""
    checked_files = []
    for file in sorted(Path(path).rglob("*.json")):
        if file.name in MODELS:
            validate(file.name, json.loads(file.read_text(encoding="utf-8")))
            checked_files.append(str(file))
    for file in sorted(Path(path).rglob("requests.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                validate_record(json.loads(line))
        checked_files.append(str(file))
    return checked_files
