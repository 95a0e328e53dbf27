"""Each diagnosis rule on fixture runs on both sides of its threshold."""

import pytest

from harness.metrics.diagnosis import Run, diagnose
from harness.metrics.latencies import summarize
from harness.metrics.roofline import line, place, roofline
from harness.results.folder import RequestRecord
from harness.results.schema import Summary, Telemetry


def rec(i, send, ttft_s, gaps_s=(0.05, 0.05), prompt=16, timings=None, mismatch=False):
    times = [send + ttft_s]
    for g in gaps_s:
        times.append(times[-1] + g)
    return RequestRecord(
        index=i,
        intended_send_s=send,
        actual_send_s=send,
        request_written_s=send + 0.001,
        token_times_s=times,
        tokens_per_chunk=[1] * len(times),
        end_s=times[-1],
        prompt_tokens=prompt,
        output_tokens=len(times),
        server_timings=timings or {},
        token_count_mismatch=mismatch,
    )


UNFLAGGED = {"client_bound": False, "client_bound_reasons": [], "interrupted": False}
UNFLAGGED |= {"incomplete": False, "incomplete_reasons": [], "lost_workers": []}


def run(summary=None, records=(), series=None, steps=(), scenario=None):
    """A run of `records` whose summary has the given sections (summary.json's, by name) over its own."""
    base = summarize(list(records)).model_dump() | UNFLAGGED
    typed = Summary.model_validate(base | (summary or {}))
    return Run(typed, list(records), series or {}, list(steps), scenario or {})


def rules(r):
    return {f.rule: f for f in diagnose(r)}


def phases_summary(queue_share, ttft_ms=1000.0):
    return {
        "phases_ms": {
            "queue": {"mean": queue_share * ttft_ms},
            "ttft": {"mean": ttft_ms},
            "ttft_share": {"queue": queue_share, "prefill": 0.1, "other": 0.9 - queue_share},
            "main_ttft_part": "queue" if queue_share > 0.45 else "other",
        }
    }


RECORDS = [rec(i, i * 0.5, 0.2) for i in range(4)]


def test_saturation_names_queueing_as_the_main_share_with_its_percentage():
    found = rules(run(phases_summary(0.83), RECORDS, {"bench:waiting": [(0.5, 7), (1.0, 9)]}))["saturation"]
    assert found.severity == "critical" and "queueing is 83% of TTFT (its main share)" in found.message
    assert "up to 9 requests waited" in found.message
    assert "saturation" not in rules(run(phases_summary(0.1), RECORDS, {"bench:waiting": [(0.5, 0), (1.0, 0)]}))


def test_queue_time_with_an_empty_waiting_gauge_is_a_step_boundary_wait_not_saturation():
    found = rules(run(phases_summary(0.32), RECORDS, {"bench:waiting": [(0.5, 0), (1.0, 0)]}))["saturation"]
    assert found.severity == "info" and found.message.startswith("step-boundary wait, not saturation")
    assert "queueing is 32% of TTFT" in found.message and "saturated" not in found.message
    one_waited = rules(run(phases_summary(0.32), RECORDS, {"bench:waiting": [(0.5, 1), (1.0, 0)]}))["saturation"]
    assert one_waited.message.startswith("saturated: queueing is 32% of TTFT")


def test_batch_limit_when_running_is_stuck_and_kv_is_free():
    series = {
        "bench:running": [(t, 4) for t in (0.2, 0.6, 1.0, 1.4)],
        "bench:waiting": [(t, 6) for t in (0.2, 0.6, 1.0, 1.4)],
        "bench:kv_usage_fraction": [(t, 0.1) for t in (0.2, 0.6, 1.0, 1.4)],
    }
    found = rules(run({}, RECORDS, series))["batch_limit"]
    assert "4 running while up to 6 waited" in found.message and "10%" in found.message
    series["bench:kv_usage_fraction"] = [(t, 0.95) for t in (0.2, 0.6, 1.0, 1.4)]  # memory is what is full
    assert "batch_limit" not in rules(run({}, RECORDS, series))


def test_kv_pressure_from_usage_and_preemptions():
    series = {"bench:kv_usage_fraction": [(0.2, 0.5), (1.0, 0.97)], "bench:preemptions": [(0.2, 0), (1.4, 3)]}
    found = rules(run({}, RECORDS, series))["kv_pressure"]
    assert found.severity == "critical" and "97%" in found.message and "3 preemptions" in found.message
    series = {"bench:kv_usage_fraction": [(0.2, 0.5), (1.0, 0.6)], "bench:preemptions": [(0.2, 0), (1.4, 0)]}
    assert "kv_pressure" not in rules(run({}, RECORDS, series))


def interference_records(stall_s):
    # two streams decode every 50 ms; a long prompt arrives and its prefill ends at t=2.0+stall
    streams = [rec(i, 0.0, 0.1, gaps_s=[0.05] * 20 + [stall_s] + [0.05] * 10) for i in range(2)]
    t_stall_start = streams[0].token_times_s[20]
    long = rec(2, t_stall_start - 0.5, 0.5 + stall_s * 0.9, gaps_s=[0.05] * 5, prompt=2000)
    return streams + [long]


def test_prefill_interference_when_stalls_line_up_with_long_prefills():
    found = rules(run({}, interference_records(2.5)))["prefill_interference"]
    assert "long prompt (up to 2000 tokens)" in found.message and found.evidence["aligned_fraction"] == 1.0
    # chunked prefill: the gap is a couple of steps, under the stall threshold
    assert "prefill_interference" not in rules(run({}, interference_records(0.15)))


def test_head_of_line_when_short_requests_queue_behind_long_ones():
    def records(queue_ms):
        short = [rec(i, i * 0.1, 1.0, prompt=16, timings={"queue_ms": queue_ms, "prefill_ms": 20.0}) for i in range(4)]
        long = [
            rec(4 + i, i * 0.1, 1.5, prompt=1024, timings={"queue_ms": 10.0, "prefill_ms": 900.0}) for i in range(2)
        ]
        return short + long

    found = rules(run({}, records(900.0)))["head_of_line"]
    assert "90% of their TTFT" in found.message
    assert "head_of_line" not in rules(run({}, records(50.0)))


def test_decode_roofline_memory_and_compute_bound():
    memory = place(bytes_moved=1e9, flops=2e9, seconds=0.1, peak_flops=100e9, peak_bytes_per_s=20e9)
    assert memory.bound == "memory" and memory.bandwidth_fraction == pytest.approx(0.5)
    assert (
        line("decode", memory)
        == "decode is memory-bound: 50% of bandwidth, 20% of compute, intensity 2.0 FLOP/byte (ridge 5.0)"
    )
    compute = place(bytes_moved=1e8, flops=8e9, seconds=0.1, peak_flops=100e9, peak_bytes_per_s=20e9)
    assert compute.bound == "compute"
    for point, expected in ((memory, "memory-bound"), (compute, "compute-bound")):
        found = rules(run({"roofline": {"points": {"decode": point}, "line": line("decode", point)}}, RECORDS))
        assert expected in found["decode_bound"].message
    slow = place(bytes_moved=1e8, flops=2e8, seconds=0.1, peak_flops=100e9, peak_bytes_per_s=20e9)  # 5% of bandwidth
    found = rules(run({"roofline": {"points": {"decode": slow}, "line": line("decode", slow)}}, RECORDS))
    assert found["decode_bound"].severity == "warning" and "per-step overhead" in found["decode_bound"].message


def test_roofline_from_steps_against_given_ceilings():
    steps = [{"prefill_tokens": 0, "decode_seqs": 4, "dur_s": 0.03, "bytes_read": 5.4e8, "flops": 1.1e9}] * 10
    steps += [{"prefill_tokens": 256, "decode_seqs": 0, "dur_s": 0.7, "bytes_read": 5.5e8, "flops": 7e10}]
    roof = roofline(steps, Telemetry(memory_bandwidth_ceiling_bytes_per_s=20e9), "native", compute_ceiling_flops=110e9)
    assert roof.points["decode"].bound == "memory" and roof.points["prefill"].bound == "compute"
    assert roof.line.startswith("decode is memory-bound: 90% of bandwidth")
    assert roofline([], Telemetry(), "llamacpp").reason


def test_roofline_on_a_gpu_against_its_published_peaks():
    telemetry = Telemetry(
        engine_read_bytes_per_s=3.0e12,
        engine_flops_per_s=1.0e14,
        gpu_dram_active_mean=0.71,
        gpu_tensor_active_mean=0.04,
    )
    roof = roofline([], telemetry, "vllm", gpu_name="NVIDIA H200")
    assert roof.ceilings.bytes_per_s == 4.8e12 and roof.ceilings.flops_per_s == 1979e12 / 2  # H200 SXM, dense
    point = roof.points["all steps"]
    assert point.bound == "memory" and point.bandwidth_fraction == pytest.approx(0.625)
    assert "DRAM active 71%, tensor pipes active 4% (memory-bound)" in roof.hardware.line
    # no engine counters (vLLM without --enable-mfu-metrics): the GPU's own counters still answer
    only_hw = roofline(
        [], Telemetry(gpu_dram_active_mean=0.2, gpu_tensor_active_mean=0.6), "sglang", gpu_name="NVIDIA H100 80GB HBM3"
    )
    assert "compute-bound" in rules(run({"roofline": only_hw}, RECORDS))["decode_bound"].message
    assert roofline([], telemetry, "vllm", gpu_name="NVIDIA L4").ceilings.bytes_per_s == 0.3e12  # not L40S


def test_prefix_cache_miss_on_a_shared_prefix_workload():
    scenario = {"workload": {"kind": "shared_prefix", "prefix_tokens": 512, "input_tokens": {"mean": 64}}}

    def records(cache_n):  # llama.cpp's timings: prompt_n is the tokens computed, the cached ones not counted
        return [
            rec(
                i,
                i * 0.2,
                0.3,
                timings={"queue_ms": 1.0, "prefill_ms": 5.0, "cache_n": cache_n, "prompt_n": 576 - cache_n},
            )
            for i in range(4)
        ]

    found = rules(run({}, records(0), scenario=scenario))["prefix_cache_miss"]
    assert "0% of prompt tokens came from the cache" in found.message and "89% could" in found.message
    assert "prefix_cache_miss" not in rules(run({}, records(512), scenario=scenario))
    # 200 of 576 cached is 35%, under half the 89% possible: a miss, though cache_n / prompt_n would read 53%
    found = rules(run({}, records(200), scenario=scenario))["prefix_cache_miss"]
    assert found.evidence["hit_fraction"] == pytest.approx(200 / 576) and "35% of prompt tokens" in found.message
    assert "prefix_cache_miss" not in rules(run({}, records(0), scenario={"workload": {"kind": "random"}}))


def test_prefix_cache_miss_from_the_window_counters_where_records_carry_no_cache_count():
    scenario = {"workload": {"kind": "shared_prefix", "prefix_tokens": 512, "input_tokens": {"mean": 64}}}
    plain = [rec(i, i * 0.2, 0.3) for i in range(4)]
    window = {
        "hit_rate": 0.2,
        "hit_tokens": 460,
        "queried_tokens": 2304,
        "source": "engine counters, delta over the measured window",
    }  # harness.engine.server_metrics.window_hit_rate
    found = rules(run({"prefix_cache": window}, plain, scenario=scenario))["prefix_cache_miss"]
    assert found.evidence["hit_fraction"] == 0.2 and "counters over the window" in found.evidence["source"]
    assert "prefix_cache_miss" not in rules(
        run({"prefix_cache": {**window, "hit_rate": 0.8}}, plain, scenario=scenario)
    )
    # the per-scrape rate since the engine started is not read: a low one alone finds nothing
    since_start = {"bench:prefix_cache_hit_rate": [(0.1, 0.0), (0.5, 0.0)]}
    assert "prefix_cache_miss" not in rules(run({}, plain, since_start, scenario=scenario))


def test_prefix_cache_saving_states_the_prefill_saved_and_the_blocks_it_holds():
    window = {"hit_rate": 0.62, "hit_tokens": 1984, "queried_tokens": 3200, "source": "engine counters"}
    series = {
        "bench:prefix_cache_blocks": [(0.1, 8), (0.5, 31), (1.0, 24)],
        "bench:prefix_cache_evictions": [(0.1, 2), (0.5, 9), (1.0, 14)],
    }
    found = rules(run({"prefix_cache": window}, RECORDS, series))["prefix_cache_saving"]
    assert found.message == (
        "prefix cache saved 62% of prefill (1984 of 3200 prompt tokens served from cache); its memory: up to 31 KV "
        "blocks held by cached prefixes no running request used, 12 blocks evicted"
    )
    # no hits (caching off, or nothing shared), or an engine without the blocks gauge: nothing to state
    assert "prefix_cache_saving" not in rules(run({"prefix_cache": {**window, "hit_tokens": 0}}, RECORDS, series))
    assert "prefix_cache_saving" not in rules(run({"prefix_cache": window}, RECORDS))


def test_client_bound_by_its_share_of_ttft():
    summary = {
        "phases_ms": {"ttft_share": {"client_lag": 0.3, "connect_send": 0.05}},
        "client_bound_reasons": ["send lag p99 40.0 ms > 5.0 ms"],
    }
    found = rules(run(summary, RECORDS))["client_bound"]
    assert found.severity == "critical" and "35% of TTFT" in found.message
    summary["phases_ms"]["ttft_share"] = {"client_lag": 0.01, "connect_send": 0.0}
    assert rules(run(summary, RECORDS))["client_bound"].severity == "info"
    summary["client_bound_reasons"] = []
    assert "client_bound" not in rules(run(summary, RECORDS))


def test_token_count_mismatch():
    found = rules(run({"token_count_mismatches": 2}, RECORDS))["token_count_mismatch"]
    assert "2 of 4 requests" in found.message
    assert "token_count_mismatch" not in rules(run({"token_count_mismatches": 0}, RECORDS))


def test_findings_most_severe_first():
    findings = diagnose(run({"token_count_mismatches": 1, **phases_summary(0.9)}, RECORDS))
    assert [f.severity for f in findings] == sorted(
        (f.severity for f in findings), key=["critical", "warning", "info"].index
    )
