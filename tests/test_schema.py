"""The results schema (harness/results/schema.py): docs/schema/ is what the models generate, a writer's unknown field is
refused with the fix named, and folders written before the schema (tests/fixtures/results_v0/) still validate
and load."""

import json
from pathlib import Path

import pytest

from harness.results.folder import ResultWriter, read_records, validate_record
from harness.results.schema import PRE_SCHEMA_VERSION, SCHEMA_VERSION, SchemaError, validate
from harness.results.schema_files import SCHEMA_DIR, rendered, validate_folder
from reports.load import load_run

OLD = Path(__file__).parent / "fixtures" / "results_v0"
BASELINE_RUN = Path(__file__).parent.parent / "ci" / "baselines" / "nightly" / "run-1"


def test_the_committed_json_schemas_are_what_the_models_generate():
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in SCHEMA_DIR.glob("*.schema.json")}
    assert on_disk == rendered(), "docs/schema/ drifted from harness/results/schema.py: run `bench schema --write`"


@pytest.mark.parametrize("kind", ["run", "sweep", "candidates", "repeats", "plan", "tune"])
def test_a_folder_from_before_the_schema_validates_and_loads(kind):
    folder = OLD / kind
    files = validate_folder(folder)
    names = {Path(f).name for f in files}
    assert {"run.json", "summary.json", "requests.jsonl"} <= names
    manifest = {"sweep": "sweep.json", "candidates": "candidates.json", "repeats": "repeats.json", "tune": "tune.json"}
    assert kind not in manifest or manifest[kind] in names
    for summary in folder.rglob("summary.json"):
        assert "schema_version" not in json.loads(summary.read_text())  # written before the schema
        assert validate("summary.json", json.loads(summary.read_text())).schema_version == PRE_SCHEMA_VERSION
        run = load_run(summary.parent)
        assert run.summary.requests.measured == len([r for r in read_records(summary.parent) if not r.is_warmup])


def test_a_writer_field_without_its_model_is_refused_naming_the_fix(tmp_path):
    summary = json.loads((BASELINE_RUN / "summary.json").read_text())
    writer = ResultWriter(tmp_path / "run")
    typed = validate("summary.json", summary)
    writer.write_summary(typed)
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert list(on_disk.items()) == [("schema_version", SCHEMA_VERSION), *summary.items()]  # as it was, stamped
    fix = r"summary.json: ttft_new_ms: Extra inputs .*harness/results/schema.py.*--write"
    with pytest.raises(SchemaError, match=fix):
        validate("summary.json", summary | {"ttft_new_ms": 1.0})
    typed.requests.completed = "all"  # assigned unchecked: written, then refused
    with pytest.raises(SchemaError, match=r"summary.json: requests.completed: .*integer"), pytest.warns(UserWarning):
        writer.write_summary(typed)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["requests"]["completed"] == "all"  # kept
    run_info = json.loads((BASELINE_RUN / "run.json").read_text())
    with pytest.raises(SchemaError, match="run.json: backend: Field required"):
        validate("run.json", {k: v for k, v in run_info.items() if k != "backend"})
    writer.close()


def test_a_record_line_is_exactly_the_record_dataclass():
    line = json.loads((BASELINE_RUN / "requests.jsonl").read_text().splitlines()[0])
    validate_record(line)
    with pytest.raises(SchemaError, match="keys not in RequestRecord: ttft_s"):
        validate_record(line | {"ttft_s": 0.1})
    with pytest.raises(SchemaError, match="token_times_s"):
        validate_record(line | {"token_times_s": "soon"})
