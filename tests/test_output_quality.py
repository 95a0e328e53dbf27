"""Answer quality beside speed (docs/quality.md): sampling sent as the scenario asks and where each engine reads
it, the answers kept in the records, `bench compare-outputs` on real native-engine runs (speculation on/off,
a broken verifier, torch int4 against numpy fp32), TEST06's checks as failure reasons, known-answer accuracy."""

import json
import os
import subprocess
import sys

import pytest
from helpers import assert_same_tokens_up_to_near_tie
from scipy.stats import binomtest

from backends import load_backend
from harness.client.runner import answer_problem
from harness.metrics.output_agreement import compare_runs
from harness.results.folder import RequestRecord, ResultsError, read_json, read_records
from harness.runs.run import run_scenario
from harness.scenario.answers import accuracy, is_correct, share_interval
from harness.scenario.sampling import request_sampling
from harness.scenario.scenario import Scenario, ScenarioError, load_scenario
from harness.scenario.tokenizer_source import ApproximateTokenizer, local_tokenizer
from harness.scenario.workload import build_schedule
from native_engine.sampler import BROKEN_VERIFIER_ENV
from native_engine.sequence import SamplingParams

SPEC = ["--speculative", "ngram", "--num-speculative-tokens", "4", "--ngram-max", "3", "--ngram-min", "1"]


def scenario_file(tmp_path, body: str, name="s"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(body)
    return path


# ---- workload.sampling and backend.extra_body ----------------------------------------------------------------
def test_sampling_is_greedy_by_default_and_a_bad_field_is_named(tmp_path):
    base = "name: s\nbackend: {kind: vllm, url: 'http://127.0.0.1:9'}\nload: {rate: 1}\n"
    scn = load_scenario(scenario_file(tmp_path, base))
    assert scn.workload.sampling.greedy and scn.workload.sampling.fields() == {"temperature": 0.0}
    assert scn.resolved_dict()["workload"]["record_outputs"] == "hash"
    for bad, said in (
        ("{temperature: -1}", "workload.sampling.temperature: -1 is not valid: must be >= 0"),
        ("{top_p: 1.5}", "workload.sampling.top_p: 1.5 is not valid: must be <= 1"),
        ("{temprature: 0.5}", "workload.sampling.temprature: unknown key; did you mean 'temperature'?"),
    ):
        with pytest.raises(ScenarioError, match=said):
            load_scenario(scenario_file(tmp_path, base + f"workload: {{sampling: {bad}}}\n"))


def test_an_engine_that_does_not_read_a_field_or_an_extra_body_that_overrides_the_harness_is_refused(tmp_path):
    native = "name: s\nbackend: {kind: native, url: 'http://127.0.0.1:9'}\nload: {rate: 1}\n"
    with pytest.raises(ScenarioError, match=r"workload.sampling.repetition_penalty: native does not read it"):
        load_scenario(scenario_file(tmp_path, native + "workload: {sampling: {repetition_penalty: 1.1}}\n"))
    owned = (
        ("temperature", "from workload.sampling"),
        ("stream", "its stream is what is measured"),
        ("input", "from the workload's prompts"),  # /v1/responses' and /v1/embeddings' prompt
        ("max_output_tokens", "from workload.output_tokens"),  # /v1/responses' length
    )
    for key, said in owned:
        backend = f"{{kind: vllm, url: 'http://127.0.0.1:9', extra_body: {{{key}: 1}}}}"
        body = f"name: s\nbackend: {backend}\nload: {{rate: 1}}\n"
        with pytest.raises(ScenarioError, match=f"backend.extra_body.{key}: .*{said}"):
            load_scenario(scenario_file(tmp_path, body))


def test_each_backend_puts_the_sampling_fields_where_its_engine_reads_them():
    fields = {"temperature": 0.7, "top_k": 40, "seed": 5, "repetition_penalty": 1.1}

    def body(kind, api="completions", sent=fields):
        backend = load_backend(kind)
        out = backend.request_body(api, "m", 8, prompt="hi")
        backend.add_sampling(out, api, sent)
        return out

    for kind in ("vllm", "trtllm", "sglang", "openai"):  # the OpenAI-compatible servers: the top level
        assert {k: body(kind)[k] for k in fields} == fields
    generate = body("sglang", "native")["sampling_params"]  # SGLang's /generate: its seed is sampling_seed
    assert generate["sampling_seed"] == 5 and generate["top_k"] == 40 and generate["max_new_tokens"] == 8
    llama = body("llamacpp")
    assert llama["repeat_penalty"] == 1.1 and "repetition_penalty" not in llama and llama["seed"] == 5
    options = body("ollama", "chat")["options"]
    assert options == {"num_predict": 8, "temperature": 0.7, "top_k": 40, "seed": 5, "repeat_penalty": 1.1}
    native = body("native", sent={"temperature": 0.0, "min_p": 0.1})
    assert native["temperature"] == 0.0 and native["min_p"] == 0.1 and native["max_tokens"] == 8
    assert request_sampling(fields, 3)["seed"] == 8 and request_sampling({"temperature": 0.0}, 3) == {
        "temperature": 0.0
    }


# ---- TEST06's checks -----------------------------------------------------------------------------------------
def record(tokens, finish, usage=True):
    rec = RequestRecord(index=0, intended_send_s=0.0, output_tokens=tokens, finish_reason=finish)
    rec.output_tokens_usage = tokens if usage else None
    return rec


def test_answers_that_pass_the_count_stop_early_without_eos_or_are_empty_fail_with_their_reason():
    assert answer_problem(record(8, "length"), 8, length_forced=False, text="x") is None
    assert answer_problem(record(5, "stop"), 8, length_forced=False, text="x") is None  # EOS ended it: fine
    assert answer_problem(record(9, "length"), 8, False, "x")[0] == "over_length"
    reason, detail = answer_problem(record(5, "length"), 8, False, "x")
    assert reason == "early_length" and "5 of the 8 tokens" in detail
    assert answer_problem(record(5, "length", usage=False), 8, False, "x") is None  # counted chunks: not judged
    assert answer_problem(record(5, "stop"), 8, length_forced=True, text="x")[0] == "short_output"
    assert answer_problem(record(3, "stop"), 8, False, "")[0] == "empty_answer"


# ---- known answers -------------------------------------------------------------------------------------------
def test_known_answers_score_by_copy_exact_or_regex_and_accuracy_has_the_exact_interval():
    assert is_correct("  the cat sat on the mat and more", "the cat sat", "copy")
    assert not is_correct("the cat sat", "the cat sat on the mat", "copy")
    assert is_correct(" Paris \n", "Paris", "exact") and not is_correct("Paris.", "Paris", "exact")
    assert is_correct("The answer is 42.", r"\b42\b", "regex") and not is_correct("420", r"\b42\b", "regex")
    records = []
    for i in range(10):
        rec = RequestRecord(index=i, intended_send_s=0.0, answer_correct=i < 7)
        records.append(rec)
    records.append(RequestRecord(index=10, intended_send_s=0.0, answer_correct=False, is_warmup=True))
    acc = accuracy(records)
    expected = binomtest(7, 10).proportion_ci(0.95, method="exact")
    assert acc.scored == 10 and acc.correct == 7
    assert acc.low == pytest.approx(expected.low) and acc.high == pytest.approx(expected.high)
    assert share_interval(10, 10, 0.95)[1] == 1.0 and share_interval(0, 10, 0.95)[0] == 0.0


def test_a_file_row_with_a_bad_expected_answer_is_named(tmp_path):
    rows = tmp_path / "qa.jsonl"
    rows.write_text(json.dumps({"prompt": "2+2=", "expected": "(", "match": "regex"}) + "\n")
    path = scenario_file(
        tmp_path,
        "name: s\nbackend: {kind: vllm, url: 'http://127.0.0.1:9'}\n"
        f"workload: {{kind: file, path: {rows}}}\nload: {{rate: 1}}\n",
    )
    with pytest.raises(ScenarioError, match=r"qa.jsonl line 1 field 'expected': not a valid regular expression"):
        build_schedule(load_scenario(path), ApproximateTokenizer())
    rows.write_text(json.dumps({"prompt": "2+2=", "expected": "4"}) + "\n")
    spec = build_schedule(load_scenario(path), ApproximateTokenizer()).requests[0]
    assert (spec.expected, spec.expected_match) == ("4", "exact")


# ---- real runs of the native engine, compared --------------------------------------------------------------
PROMPTS = [
    ("Repeat after me: the cat sat on the mat.", "the cat sat on the mat."),
    ("Copy this: one two three four five.", "one two three four five."),
    ("Say it again: red green blue.", "red green blue."),
    ("Echo: a stitch in time saves nine.", "a stitch in time saves nine."),
    ("Repeat: the quick brown fox.", "the quick brown fox."),
    ("Copy: hello world, hello moon.", "hello world, hello moon."),
]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """The tiny random model with its own (untied) output head: tied to the embeddings it would repeat one token
    forever, and every n-gram draft would be right; untied, its answers wander and many drafts are wrong."""
    from native_engine.tiny_gguf import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf", seed=0, tied_embeddings=False)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    from native_engine.llm_engine import LoadedModel

    return LoadedModel.load(str(tiny_path))


@pytest.fixture(scope="module")
def runs(tiny_path, tmp_path_factory):
    """One file workload of prompts with known answers, greedy, answers kept as text, against the tiny model
    served by the native engine: speculation off, on, on with the broken verifier, and the torch int4 runtime."""
    root = tmp_path_factory.mktemp("quality")
    prompts = root / "qa.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "expected": e}) + "\n" for p, e in PROMPTS))
    variants = {"off": ([], {}), "spec": (SPEC, {}), "broken": (SPEC, {BROKEN_VERIFIER_ENV: "1"})}
    try:
        import torch  # noqa: F401

        variants["int4"] = (["--runtime", "torch", "--dtype", "int4"], {})
    except ImportError:
        pass
    out = {}
    for name, (args, env) in variants.items():
        path = scenario_file(
            root,
            f"name: run-{name}\n"
            f"backend: {{kind: native, tokenizer: '{tiny_path}', "
            f"launch: {{args: {json.dumps(['--model', str(tiny_path), *args])}, "
            f"env: {json.dumps(env)}, ready_timeout_s: 120}}}}\n"
            f"workload: {{kind: file, path: '{prompts}', output_tokens: 24, ignore_eos: true, record_outputs: text}}\n"
            "load: {arrival: closed, concurrency: 2, num_requests: 6, workers: 1}\n",
            name,
        )
        out[name] = run_scenario(load_scenario(path), root / name).out_dir
    return out


def test_a_run_sends_greedy_sampling_records_it_and_keeps_each_answer_with_its_prompt_hash(runs):
    info = read_json(runs["off"] / "run.json")
    assert info["sampling"]["fields"] == {"temperature": 0.0} and info["sampling"]["greedy"]
    assert "vLLM's and SGLang's benchmark clients" in info["sampling"]["default"]
    records = read_records(runs["off"])
    assert len(records) == 6 and all(r.ok for r in records)
    assert all(r.output_text and len(r.prompt_sha256) == 64 and len(r.output_sha256) == 64 for r in records)
    assert len({r.prompt_sha256 for r in records}) == 6  # each its own prompt
    for r in records:  # scored as each record completed: exact match, whitespace at the ends dropped
        assert r.answer_correct is (r.output_text.strip() == PROMPTS[r.index][1])
    summary = read_json(runs["off"] / "summary.json")
    assert summary["accuracy"]["scored"] == 6  # the known answers' accuracy, with its interval
    assert summary["accuracy"]["low"] <= summary["accuracy"]["share"] <= summary["accuracy"]["high"]


def test_the_repeat_workload_knows_the_passage_each_answer_should_copy(tmp_path):
    body = "name: s\nbackend: {kind: vllm, url: 'http://127.0.0.1:9'}\nload: {rate: 1, num_requests: 4}\n"
    scn = load_scenario(
        scenario_file(tmp_path, body + "workload: {kind: repeat, input_tokens: 16, output_tokens: 16}\n")
    )
    for spec in build_schedule(scn, local_tokenizer("smollm2")).requests:
        assert spec.expected_match == "copy" and spec.expected and spec.expected in spec.prompt
        assert spec.prompt.index(spec.expected) < spec.prompt.index("Repeated text:")


def test_speculative_decoding_on_and_off_answer_alike_and_a_broken_verifier_is_flagged(runs, tiny, tiny_path):
    same = compare_runs(runs["off"], runs["spec"])
    if same.exact_share < 1.0:  # only a near tie of the BLAS kernels' last bits may part them (helpers.py)
        check_near_ties(runs["off"], runs["spec"], tiny, tiny_path)
    else:
        assert same.token_agreement == 1.0 and same.first_divergence is None and not same.flagged
    spec_summary = read_json(runs["spec"] / "summary.json")
    assert spec_summary["speculative"]["acceptance_rate"] > 0  # drafts were verified, and some kept
    broken = compare_runs(runs["off"], runs["broken"])
    assert broken.greedy and broken.flagged and broken.exact_share < 1.0
    assert broken.token_agreement < 1.0 and broken.first_divergence.count == broken.pairs - broken.exact
    cli = subprocess.run(
        [sys.executable, "-m", "harness", "compare-outputs", str(runs["off"]), str(runs["broken"])],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert cli.returncode == 1 and "FLAGGED: at temperature 0" in cli.stdout, cli.stdout + cli.stderr
    assert "first diverging token" in cli.stdout


def check_near_ties(dir_a, dir_b, tiny, tiny_path):
    """Where greedy answers part, the decision there was a near tie (helpers.py), from the plan's prompts."""
    scenario = Scenario.model_validate(read_json(dir_a / "run.json")["scenario"])
    tokenizer = local_tokenizer(str(tiny_path))
    specs = {spec.index: spec for spec in build_schedule(scenario, tokenizer).requests}
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    skip = tokenizer.added_tokens
    for a, b in zip(read_records(dir_a), read_records(dir_b)):
        if a.output_text != b.output_text:
            got, expected = (tokenizer.encode(r.output_text)[skip:] for r in (b, a))
            assert_same_tokens_up_to_near_tie(tiny, tokenizer.encode(specs[a.index].prompt), greedy, got, expected)


def test_torch_int4_against_the_numpy_fp32_reference_agrees_less_than_fully(runs):
    if "int4" not in runs:
        pytest.skip("torch is not installed")
    result = compare_runs(runs["off"], runs["int4"])
    assert result.pairs == 6 and result.greedy
    assert result.token_agreement < 1.0 and result.flagged  # 4-bit weights change greedy answers


def test_runs_of_other_prompts_or_without_answers_are_refused(runs, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    lines = (runs["off"] / "requests.jsonl").read_text().splitlines()
    first = json.loads(lines[0]) | {"prompt_sha256": "0" * 64}
    (other / "requests.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(
        ResultsError, match=f"not sent the same prompts .*1 requests differ, the first is request {first['index']}"
    ):
        compare_runs(runs["off"], other)
    bare = [json.loads(line) | {"prompt_sha256": None, "output_sha256": None, "output_text": None} for line in lines]
    (other / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in bare) + "\n")
    with pytest.raises(ResultsError, match="kept no answers .*record_outputs: hash or text"):
        compare_runs(runs["off"], other)


def test_bench_report_of_two_runs_compares_their_answers_and_shows_accuracy(runs, tmp_path):
    from reports.report import write_report

    write_report([runs["off"], runs["broken"]], tmp_path / "r.html")
    md = (tmp_path / "r.md").read_text()
    section = md.split("## Answers compared")[1].split("##")[0]
    assert "broken against off" in section and "FLAGGED: at temperature 0" in section
    assert "## Known-answer accuracy" in md
    assert "Answers compared" in (tmp_path / "r.html").read_text()
