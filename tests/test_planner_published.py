"""benchmarks/planner_published.py: every published GPU row becomes a scenario `bench plan` loads, or is listed as not
expressible with its reason; a planned row's errors are (planned - published) / published; the summaries (MAPE, error
bands, knees, orderings) add up as derived by hand."""

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import planner_published as published  # noqa: E402

ROWS = yaml.safe_load(published.ROWS_PATH.read_text(encoding="utf-8"))
BY_ID = {row["id"]: row for row in ROWS}
DATASETS = published.load_lengths()


@pytest.fixture(scope="module")
def converted():
    return {row["id"]: published.convert_row(row, DATASETS) for row in ROWS}


def test_every_row_converts_or_says_why_not(converted):
    assert len(converted) == 133
    refused = {rid: c.reason for rid, c in converted.items() if isinstance(c, published.NotExpressible)}
    # the NeuralMagic vLLM rows publish no tensor parallelism; every other row loads as a scenario
    assert refused == {
        "mlperf41-neuralmagic-vllm-l40s-x8-llama2-70b-offline": "tensor parallelism not published",
        "mlperf41-neuralmagic-vllm-l40s-x8-llama2-70b-server": "tensor parallelism not published",
    }
    for rid, c in converted.items():
        if rid in refused:
            continue
        row, scenario = BY_ID[rid], c.scenario
        assert scenario.plan.step_model.kind == "roofline" and scenario.plan.tensor_parallel == row["tensor_parallel"]
        assert scenario.backend.kind == {"nim": "trtllm"}.get(row["engine"], row["engine"])
        assert scenario.plan.kv_cache_dtype in ("auto", "bf16", "fp16", "fp8")


def test_an_mlperf_row_as_its_submitter_configured_it(converted):
    c = converted["mlperf41-nvidia-dgx-h100x8-llama2-70b-offline"]
    plan, load, workload = c.scenario.plan, c.scenario.load, c.scenario.workload
    assert (plan.hardware, plan.model, plan.replicas) == ("H100-SXM", "llama-2-70b", 4)
    assert (plan.weight_dtype, plan.kv_cache_dtype) == ("fp8", "fp8")
    # configs/llama2-70b/Offline/__init__.py H100_SXM_80GB_TP2x4: gpu_batch_size 896, max_num_tokens 4096, 0.90
    assert c.data["backend"]["launch"]["args"] == [
        "--tp_size", "2", "--max_batch_size", "896", "--max_num_tokens", "4096",
        "--kv_cache_free_gpu_memory_fraction", "0.9",
    ]  # fmt: skip
    # 200,640 published samples > 5,000: 3,000 a replica x 4 replicas
    assert load.arrival == "offline" and load.num_requests == 12_000
    # OpenOrca: input lognormal 222.3 +- 171.5; output the row's accuracy-run mean 290.3, std 0.66 x 290.3 = 191.6
    assert (workload.input_tokens.mean, workload.input_tokens.std) == (222.3, 171.5)
    assert (workload.output_tokens.mean, workload.output_tokens.std, workload.output_tokens.max) == (290.3, 191.6, 1024)


def test_loads_lengths_and_choices_for_unstated_fields(converted):
    server = converted["mlperf41-nvidia-dgx-h100x8-llama2-70b-server"].scenario.load
    assert (server.arrival, server.rate, server.num_requests) == ("poisson", 75.0, 40_000)  # 600 s x 75/s, capped
    gh200 = converted["mlperf41-nvidia-gh200x1-llama2-70b-server"].scenario.load
    assert gh200.num_requests == 8_040  # LoadGen's 600 s x 13.4/s
    b200_8b = converted["mlperf51-nvidia-b200x8-llama3.1-8b-server"].scenario.load
    assert b200_8b.num_requests == 40_000  # 600 s x 1,000/s = 600,000, capped at 40,000
    nim = converted["nim180-llama33-70b-h100x2-tp2-fp8-5000-500-c250"]
    assert (nim.scenario.load.arrival, nim.scenario.load.concurrency, nim.scenario.load.num_requests) == (
        "closed",
        250,
        2_500,  # 10 a slot
    )
    assert nim.scenario.plan.kv_cache_dtype == "fp8" and nim.data["backend"]["launch"]["args"] == []
    assert converted["trt017-llama-3.1-8b-gh200-tp1-1000-1000"].scenario.plan.hardware == "GH200-96GB"
    assert converted["trt10-llama-3.1-8b-instruct-h100-tp1-1000-1000"].scenario.plan.kv_cache_dtype == "auto"
    # vllm bench serve --random-range-ratio 0.15 around 20,000 / 2,000 tokens
    blog = converted["vllmblog-fp8kv-llama31-8b-h100-c8-kvfp8"]
    assert (blog.scenario.workload.input_tokens.min, blog.scenario.workload.input_tokens.max) == (17_000, 23_000)
    assert (blog.scenario.workload.output_tokens.min, blog.scenario.workload.output_tokens.max) == (1_700, 2_300)
    assert blog.data["backend"]["launch"]["args"] == ["--tensor-parallel-size", "1", "--kv-cache-dtype", "fp8"]
    assert blog.left_out == {"duration_s": published.NOT_COMPARED["duration_s"]}
    vllm060 = converted["sglang030-vllm060-llama31-8b-a100-online-vllm-rps4"]
    assert vllm060.left_out == {"itl_p50_ms": published.MULTI_STEP_ITL}


def test_no_engine_flags_leaves_the_launch_args_empty():
    row = BY_ID["mlperf51-cisco-h200x8-llama2-70b-server"]
    assert published.convert_row(row, DATASETS, with_engine_flags=True).data["backend"]["launch"]["args"][:2] == [
        "--tp_size",
        "1",
    ]
    assert published.convert_row(row, DATASETS, with_engine_flags=False).data["backend"]["launch"]["args"] == []


@pytest.mark.parametrize(
    "row_id", ["trt014-online-llama31-8b-h100-tp1-467-256-qps2", "nim180-llama33-70b-h100x2-tp2-fp8-5000-500-c1"]
)
def test_a_planned_rows_errors_are_planned_over_published(row_id):
    row = BY_ID[row_id]
    result = published.predict_row(row, published.convert_row(row, DATASETS))
    assert result.status == "predicted", result.reason
    # every published metric the plan predicts, none dropped (TRT-LLM v0.14: 5 metrics; NIM: 3)
    assert [e.metric for e in result.errors] == list(row["metrics"])
    for e in result.errors:
        assert e.published == row["metrics"][e.metric] and e.planned > 0
        assert e.error_pct == pytest.approx(100 * (e.planned - e.published) / e.published)
    if row_id.startswith("trt014"):
        # 256 tokens a request: the plan's output tok/s is its req/s x 256, within 1% (its steady window counts tokens
        # as they arrive and requests as they end)
        errors = {e.metric: e for e in result.errors}
        assert errors["output_tokens_per_s"].planned == pytest.approx(errors["requests_per_s"].planned * 256, rel=0.01)


def test_family_mape_and_error_bands_by_hand():
    def row(split, *errors):
        return published.RowResult(
            "r",
            split,
            "predicted",
            errors=[published.MetricError(m, published.FAMILY_OF[m], 1, 1, e) for m, e in errors],
        )

    results = [
        row("heldout", ("output_tokens_per_s", 10.0), ("ttft_p50_ms", -40.0)),
        row("heldout", ("requests_per_s", -20.0)),
        row("heldout", ("total_tokens_per_s", 30.0)),
        row("calibration", ("output_tokens_per_s", 99.0)),
        published.RowResult("x", "heldout", "not_expressible", "tensor parallelism not published"),
    ]
    stats = published.family_stats(results, "heldout")
    # throughput |errors| 10, 20, 30: MAPE 20, p50 20, p90 = 20 + 0.8 x (30 - 20) = 28 (linear interpolation)
    assert stats["throughput"] == {"n": 3, "mape_pct": 20.0, "p50_pct": 20.0, "p90_pct": pytest.approx(28.0)}
    assert stats["ttft_p50"]["mape_pct"] == 40.0 and "ttft_mean" not in stats
    assert published.family_stats(results, "calibration")["throughput"]["mape_pct"] == 99.0
    # mean signed error per metric keeps the sign: -40 for ttft_p50_ms
    assert published.metric_stats(results, "heldout")["ttft_p50_ms"]["mean_signed_pct"] == -40.0


def test_the_knee_of_the_nim_sweep_is_between_50_and_100():
    sweep = published.sweep_groups(ROWS)["nim180-llama33-70b-h100x2-tp2-fp8-5000-500"]
    loads = [published.load_value(r) for r in sweep]
    ttfts = [r["metrics"]["ttft_ms"] for r in sweep]
    assert loads == [1, 5, 25, 50, 100, 150, 200, 250]
    # 546.7 / 406.77 = 1.34, 688.69 / 546.7 = 1.26, 834.51 / 688.69 = 1.21, then 7996.25 / 834.51 = 9.58 >= 3
    assert published.knee(loads, ttfts) == (50, 100)
    assert published.knee([1, 2, 3], [100.0, 250.0, 600.0]) is None  # 2.5x and 2.4x: below 3x


def test_orderings_judge_one_difference_and_skip_ties():
    h100, h200 = BY_ID["trt017-llama-3.1-70b-h100-tp2-5000-500"], BY_ID["trt017-llama-3.1-70b-h200-tp2-5000-500"]
    assert published.differing_dimension(h100, h200) == "gpu"
    assert published.differing_dimension(h100, BY_ID["trt017-llama-3.1-70b-h200-tp4-5000-500"]) is None  # GPU and TP

    def planned(value):
        return published.RowResult(
            "r",
            "heldout",
            "predicted",
            errors=[published.MetricError("output_tokens_per_s", "throughput", 1, value, 0)],
        )

    published_h100, published_h200 = h100["metrics"]["output_tokens_per_s"], h200["metrics"]["output_tokens_per_s"]
    assert published_h200 > published_h100 * 1.02  # not a tie
    right = published._ordering(
        h100, h200, "gpu", "output_tokens_per_s", {h100["id"]: planned(1), h200["id"]: planned(2)}
    )
    wrong = published._ordering(
        h100, h200, "gpu", "output_tokens_per_s", {h100["id"]: planned(2), h200["id"]: planned(1)}
    )
    assert right[0]["right"] and not wrong[0]["right"]
    tie = {**h200, "metrics": {"output_tokens_per_s": published_h100 * 1.01}}  # 1% apart: under TIE_PCT
    assert (
        published._ordering(h100, tie, "gpu", "output_tokens_per_s", {h100["id"]: planned(1), tie["id"]: planned(2)})
        == []
    )
