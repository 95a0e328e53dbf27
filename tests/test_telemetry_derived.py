"""Summary figures from a timeline written by hand: which ceiling, which GPU source, window edges."""

import pytest

from harness.engine.telemetry.derived import summarize
from harness.engine.telemetry.timeline import Timeline, read_telemetry_csv

H200_PEAK = 4.9e12


@pytest.fixture
def timeline(tmp_path):
    tl = Timeline(tmp_path / "telemetry.csv")
    for i in range(11):  # 0.0 .. 5.0 s, every 0.5 s
        t = i * 0.5
        tl.append(
            t,
            [
                ("engine_metrics", "read_bytes_total", 2.0e12 * t),  # 2 TB/s, steady
                ("gpu:0", "DCGM_FI_PROF_DRAM_ACTIVE", 0.4),
                ("gpu:0", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0 + 600.0 * t),  # 600 W
                ("dcgm:0", "DCGM_FI_PROF_DRAM_ACTIVE", 0.9),  # the same GPU seen by dcgm-exporter
                ("dcgm:0", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0 + 600.0 * t),
            ],
        )
    tl.append(0.0, [("gpu:0", "memory_bandwidth_peak_bytes_per_s", H200_PEAK)])
    yield tl
    tl.close()


def test_vllm_on_a_gpu_is_measured_against_the_gpu_peak(timeline):
    figures = summarize(timeline, 1.0, 3.0, output_tokens=400, engine_family="vllm", host_ceiling_bytes_per_s=2e10)
    assert figures.engine_read_bytes_per_s == pytest.approx(2.0e12)
    assert figures.mbu == pytest.approx(2.0e12 / H200_PEAK)
    assert figures.memory_bandwidth_ceiling_source.startswith("gpu:0")
    # NVML's reading wins over dcgm-exporter's view of the same GPU; neither is added to the other.
    assert figures.dram_bandwidth_util_mean == pytest.approx(0.4)
    assert figures.gpu_energy_j == pytest.approx(1200.0)
    assert figures.energy_per_output_token_j == pytest.approx(3.0)


def test_a_cpu_engine_is_measured_against_the_host_ceiling(timeline):
    figures = summarize(timeline, 1.0, 3.0, output_tokens=0, engine_family="native", host_ceiling_bytes_per_s=4e12)
    assert figures.mbu == pytest.approx(0.5)
    # The machine's GPU is sampled, but the native engine does not use it.
    assert figures.dram_bandwidth_util_mean == pytest.approx(0.5) and figures.gpu_dram_active_mean == 0.4
    assert figures.energy_per_output_token_j is None  # no tokens, no per-token figure


def test_window_edges_between_samples_interpolate_counters(timeline):
    figures = summarize(timeline, 1.2, 1.45, output_tokens=10, engine_family="native", host_ceiling_bytes_per_s=4e12)
    assert figures.gpu_energy_j == pytest.approx(600.0 * 0.25)
    assert figures.engine_read_bytes_per_s == pytest.approx(2.0e12)
    assert figures.gpu_dram_active_mean is None  # no sample inside a quarter-second window
    with pytest.raises(ValueError, match="window_end_s"):
        summarize(timeline, 2.0, 1.0, 10, None, None)


def test_csv_round_trip_and_a_wrong_file_is_named(tmp_path, timeline):
    rows = read_telemetry_csv(timeline.path)
    assert len(rows) == 11 * 5 + 1 and rows[0][0] == 0.0 and rows[-1][0] == 5.0
    other = tmp_path / "requests.csv"
    other.write_text("index,ttft_s\n0,0.1\n")
    with pytest.raises(ValueError, match="is this a telemetry.csv"):
        read_telemetry_csv(other)
