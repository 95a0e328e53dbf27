"""The NVML/GPM sampler and the recorder, driven by a stand-in NVML that replays a recorded sequence.

The stand-in takes constants, error classes and ctypes structs from the real pynvml (they need no
driver), so the sampler fills the real c_nvmlGpmMetricsGet_t and a misspelled name fails here too.
"""

import csv
import ctypes
import importlib.util
import io
import json
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pydantic
import pynvml
import pytest
from rich.console import Console

from harness.engine.telemetry import TelemetryRecorder
from harness.engine.telemetry.gpu import GPM_FIELDS, MIB, GpuSampler
from harness.engine.telemetry.timeline import Unavailable, read_telemetry_csv
from harness.metrics.live import GpuState, LiveAggregates
from harness.runs.live import LiveRun, LiveSettings
from harness.scenario.telemetry_settings import TelemetryConfig
from harness.scenario.workload import RequestSpec

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "nvml_h200_replay.json").read_text())
TICKS = FIXTURE["devices"][0]["ticks"]


class ReplayNvml:
    """pynvml's interface over a recorded sequence: the k-th call of a function (per device and
    argument) returns the k-th recorded value; past the end, the last one."""

    def __init__(self, fixture: dict, init_error: int | None = None, gpm_error: int | None = None):
        self.devices, self.init_error, self.gpm_error = fixture["devices"], init_error, gpm_error
        self.step = Counter()
        self.calls = Counter()
        self.gpm_taken: dict[int, tuple[int, int]] = {}  # sample id -> (device, k-th snapshot)
        self.gpm_allocated, self.gpm_freed, self.shutdowns = [], set(), 0

    def __getattr__(self, name):
        if name.startswith(("NVML_", "c_nvml", "NVMLError")):
            return getattr(pynvml, name)
        raise AttributeError(name)  # a function this stand-in does not replay

    def _next(self, fn: str, handle, key=None):
        self.calls[fn] += 1
        ticks = self.devices[handle.index]["ticks"]
        k = self.step[fn, handle.index, key]
        self.step[fn, handle.index, key] += 1
        value = ticks[min(k, len(ticks) - 1)][fn]
        return value if key is None else value[key]

    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(self, handle):
        return self.devices[handle.index]["nvmlDeviceGetName"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(**self._next("nvmlDeviceGetMemoryInfo", handle))

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._next("nvmlDeviceGetPowerUsage", handle)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._next("nvmlDeviceGetTotalEnergyConsumption", handle)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        name = {pynvml.NVML_CLOCK_SM: "NVML_CLOCK_SM", pynvml.NVML_CLOCK_MEM: "NVML_CLOCK_MEM"}[clock]
        return self._next("nvmlDeviceGetClockInfo", handle, name)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._next("nvmlDeviceGetTemperature", handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._next("nvmlDeviceGetCurrentClocksThrottleReasons", handle)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(**self._next("nvmlDeviceGetUtilizationRates", handle))

    def nvmlDeviceGetMemoryBusWidth(self, handle):
        return self.devices[handle.index]["nvmlDeviceGetMemoryBusWidth"]

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        assert clock == pynvml.NVML_CLOCK_MEM
        return self.devices[handle.index]["nvmlDeviceGetMaxClockInfo"]["NVML_CLOCK_MEM"]

    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(version=1, isSupportedDevice=self.devices[handle.index]["nvmlGpmQueryDeviceSupport"])

    def nvmlGpmSampleAlloc(self):
        sample_id = len(self.gpm_allocated) + 1  # the handle's address is its id; it is never dereferenced
        self.gpm_allocated.append(sample_id)
        return ctypes.cast(ctypes.c_void_p(sample_id), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleGet(self, handle, sample):
        self.calls["nvmlGpmSampleGet"] += 1
        taken = self.step["gpm", handle.index]
        self.step["gpm", handle.index] += 1
        self.gpm_taken[_sample_id(sample)] = (handle.index, taken)
        return sample

    def nvmlGpmMetricsGet(self, request):
        assert isinstance(request, pynvml.c_nvmlGpmMetricsGet_t)
        if self.gpm_error is not None:
            raise pynvml.NVMLError(self.gpm_error)
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        (device1, k1), (device2, k2) = (self.gpm_taken[_sample_id(s)] for s in (request.sample1, request.sample2))
        if device1 != device2 or k2 != k1 + 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not two consecutive snapshots
        ticks = self.devices[device2]["ticks"]
        recorded = ticks[min(k2 - 1, len(ticks) - 1)]["nvmlGpmMetricsGet"]  # snapshot 0 is taken at start
        by_id = {getattr(pynvml, name): value for name, value in recorded.items()}
        for slot in request.metrics[: request.numMetrics]:
            value = by_id.get(slot.metricId)
            slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if value is None else pynvml.NVML_SUCCESS
            slot.value = value or 0.0
        return request

    def nvmlGpmSampleFree(self, sample):
        self.gpm_freed.add(_sample_id(sample))


def _sample_id(sample) -> int:
    return ctypes.cast(sample, ctypes.c_void_p).value


def test_stand_in_replays_only_functions_pynvml_has():
    replayed = [name for name in vars(ReplayNvml) if name.startswith("nvml")]
    assert replayed and all(callable(getattr(pynvml, name, None)) for name in replayed)
    assert all(hasattr(pynvml, metric) for metric, _ in GPM_FIELDS.values())


def test_sampler_converts_nvml_units_to_dcgm_units():
    nvml = ReplayNvml(FIXTURE)
    sampler = GpuSampler(nvml)
    samples = [dict((name, value) for _, name, value in sampler.sample(0)) for _ in range(len(TICKS))]
    for tick, values in zip(TICKS, samples):
        assert values["DCGM_FI_DEV_FB_USED"] == tick["nvmlDeviceGetMemoryInfo"]["used"] / MIB
        assert values["DCGM_FI_DEV_FB_TOTAL"] == 143771  # MiB of an H200
        assert values["DCGM_FI_DEV_POWER_USAGE"] == tick["nvmlDeviceGetPowerUsage"] / 1000  # mW -> W
        assert values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == tick["nvmlDeviceGetTotalEnergyConsumption"] / 1000
        assert values["DCGM_FI_DEV_SM_CLOCK"] == tick["nvmlDeviceGetClockInfo"]["NVML_CLOCK_SM"]
        assert values["DCGM_FI_DEV_MEM_CLOCK"] == 3201
        assert values["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] == tick["nvmlDeviceGetCurrentClocksThrottleReasons"]
        assert values["DCGM_FI_DEV_GPU_UTIL"] == tick["nvmlDeviceGetUtilizationRates"]["gpu"]
        gpm = tick["nvmlGpmMetricsGet"]
        assert values["DCGM_FI_PROF_DRAM_ACTIVE"] == pytest.approx(gpm["NVML_GPM_METRIC_DRAM_BW_UTIL"] / 100)
        assert values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == pytest.approx(gpm["NVML_GPM_METRIC_ANY_TENSOR_UTIL"] / 100)
        assert values["DCGM_FI_PROF_PCIE_RX_BYTES"] == pytest.approx(gpm["NVML_GPM_METRIC_PCIE_RX_PER_SEC"] * MIB)
        assert all(0.0 <= v <= 1.0 for n, v in values.items() if n.endswith(("_ACTIVE", "_OCCUPANCY")))
        assert "DCGM_FI_PROF_NVLINK_TX_BYTES" not in values  # NOT_SUPPORTED on this GPU
    # H200: 6144-bit bus at 3201 MHz, double data rate: 4.92 TB/s (spec sheet: 4.8 TB/s)
    assert samples[0]["memory_bandwidth_peak_bytes_per_s"] == pytest.approx(4.917e12, rel=1e-3)
    assert "memory_bandwidth_peak_bytes_per_s" not in samples[1]  # a constant goes in once
    assert set(sampler.not_sampled) == {"gpu:0 DCGM_FI_PROF_NVLINK_TX_BYTES", "gpu:0 DCGM_FI_PROF_NVLINK_RX_BYTES"}
    assert "Not Supported" in sampler.not_sampled["gpu:0 DCGM_FI_PROF_NVLINK_TX_BYTES"]
    sampler.close()
    assert nvml.gpm_freed == set(nvml.gpm_allocated) and len(nvml.gpm_allocated) == 2
    assert nvml.shutdowns == 1


def test_no_gpm_support_keeps_the_basic_fields_and_says_why():
    no_gpm = json.loads(json.dumps(FIXTURE))
    no_gpm["devices"][0]["nvmlGpmQueryDeviceSupport"] = 0
    no_gpm["devices"][0]["nvmlDeviceGetName"] = "NVIDIA A100-SXM4-80GB"
    sampler = GpuSampler(ReplayNvml(no_gpm))
    names = {name for _, name, _ in sampler.sample(0)}
    assert "DCGM_FI_DEV_POWER_USAGE" in names and not any(n.startswith("DCGM_FI_PROF") for n in names)
    assert "A100" in sampler.not_sampled["gpu:0 GPM"] and "Hopper" in sampler.not_sampled["gpu:0 GPM"]


def test_gpm_failing_mid_run_drops_only_the_gpm_fields():
    nvml = ReplayNvml(FIXTURE, gpm_error=pynvml.NVML_ERROR_NOT_SUPPORTED)  # as with MIG enabled
    sampler = GpuSampler(nvml)
    for _ in range(2):
        names = {name for _, name, _ in sampler.sample(0)}
        assert "DCGM_FI_DEV_POWER_USAGE" in names and not any(n.startswith("DCGM_FI_PROF") for n in names)
    assert sampler.not_sampled["gpu:0 GPM"].startswith("GPM sampling failed: Not Supported")
    assert nvml.gpm_freed == set(nvml.gpm_allocated)


def test_no_driver_and_no_gpu_are_unavailable_with_a_reason():
    with pytest.raises(Unavailable, match="NVML did not start.*Library Not Found"):
        GpuSampler(ReplayNvml(FIXTURE, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    with pytest.raises(Unavailable, match="sees no GPU"):
        GpuSampler(ReplayNvml({"devices": []}))


def _wait_for_rows(path: Path, name: str, count: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(1 for line in path.read_text().splitlines() if f",{name}," in line) < count:
        assert time.monotonic() < deadline, f"fewer than {count} {name} rows after {timeout_s} s"
        time.sleep(0.05)


def test_recorder_timeline_alignment_energy_and_clean_shutdown(tmp_path):
    nvml = ReplayNvml(FIXTURE)
    t0_ns = time.perf_counter_ns() - 10_000_000_000  # the run started 10 s ago
    config = TelemetryConfig(interval_ms=100, host=False)
    recorder = TelemetryRecorder(config, t0_ns, tmp_path, nvml=nvml)
    started_s = (time.perf_counter_ns() - t0_ns) / 1e9
    recorder.start()
    assert any(t.name == "telemetry-gpu" for t in threading.enumerate())
    _wait_for_rows(tmp_path / "telemetry.csv", "DCGM_FI_DEV_POWER_USAGE", len(TICKS))
    status = recorder.stop()
    stopped_s = (time.perf_counter_ns() - t0_ns) / 1e9

    assert not any(t.name.startswith("telemetry-") for t in threading.enumerate())
    assert nvml.shutdowns == 1 and nvml.gpm_freed == set(nvml.gpm_allocated)
    assert status.sampled == ["gpu:0"]
    assert status.not_sampled["host"] == "telemetry.host is false"
    assert "engine_metrics" in status.not_sampled and "gpu:0 DCGM_FI_PROF_NVLINK_RX_BYTES" in status.not_sampled

    rows = read_telemetry_csv(tmp_path / "telemetry.csv")
    assert sorted(rows) == sorted((round(t, 6), s, n, v) for t, s, n, v in recorder.timeline.rows)  # all on disk
    # t_s is on the run's clock: seconds since t0, inside the recorder's lifetime
    assert all(started_s <= t <= stopped_s for t, *_ in rows)
    power = [(t, v) for t, s, n, v in rows if n == "DCGM_FI_DEV_POWER_USAGE"]
    assert [v for _, v in power[: len(TICKS)]] == [tick["nvmlDeviceGetPowerUsage"] / 1000 for tick in TICKS]
    assert len(power) <= (stopped_s - started_s) / 0.1 + 2  # one sample per interval, no bursts

    # No sample after stop: the file and the stand-in both stay still.
    size, calls = (tmp_path / "telemetry.csv").stat().st_size, sum(nvml.calls.values())
    time.sleep(0.35)
    assert (tmp_path / "telemetry.csv").stat().st_size == size and sum(nvml.calls.values()) == calls

    # Energy per token: the counter's rise over the window, from mJ to J, over the tokens.
    energy_t_s, _ = recorder.timeline.series("gpu:0", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")  # unrounded t_s
    start_s, end_s = energy_t_s[0], energy_t_s[len(TICKS) - 1]
    rise_j = (TICKS[-1]["nvmlDeviceGetTotalEnergyConsumption"] - TICKS[0]["nvmlDeviceGetTotalEnergyConsumption"]) / 1000
    derived = recorder.derived(start_s, end_s, output_tokens=500)
    assert derived.gpu_energy_j == pytest.approx(rise_j)
    assert derived.energy_per_output_token_j == pytest.approx(rise_j / 500)
    dram = [v for t, s, n, v in recorder.timeline.rows if n == "DCGM_FI_PROF_DRAM_ACTIVE" and start_s <= t <= end_s]
    assert derived.dram_bandwidth_util_mean == pytest.approx(sum(dram) / len(dram))
    assert derived.dram_bandwidth_util_source == "DCGM_FI_PROF_DRAM_ACTIVE"
    assert 0.2 < derived.dram_bandwidth_util_mean < 0.8


def test_recorder_without_nvml_goes_on_and_says_so_once(tmp_path):
    nvml = ReplayNvml(FIXTURE, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    recorder = TelemetryRecorder(
        TelemetryConfig(interval_ms=100, host=False), time.perf_counter_ns(), tmp_path, nvml=nvml
    )
    recorder.start()
    time.sleep(0.15)
    status = recorder.stop()
    assert status.sampled == []
    assert "Driver Not Loaded" in status.not_sampled["gpu"]
    with open(tmp_path / "telemetry.csv") as f:
        assert list(csv.reader(f)) == [["t_s", "source", "name", "value"]]
    assert recorder.derived(0.0, 1.0, 10).energy_per_output_token_j is None


def test_config_rejects_fast_intervals_and_unknown_keys_naming_the_field():
    with pytest.raises(pydantic.ValidationError, match=r"interval_ms[\s\S]*at least 100"):
        TelemetryConfig(interval_ms=50)
    with pytest.raises(pydantic.ValidationError, match="gpu_index"):
        TelemetryConfig.model_validate({"gpu_index": 0})
    assert TelemetryConfig.model_validate({"interval_ms": 250, "dcgm_exporter_url": None}).interval_ms == 250


def test_gpu_check_recording_replays_as_the_same_samples():
    """benchmarks/gpu_check.py saves every NVML answer on a real GPU; replaying that file must give
    the sampler the same values, so a real recording can stand in for the hand-written fixture."""
    path = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    recording = gpu_check.RecordingNvml(ReplayNvml(FIXTURE))
    sampler = GpuSampler(recording)
    live = [sampler.sample(0) for _ in range(5)]
    sampler.close()
    recorded = json.loads(json.dumps(recording.fixture()))
    assert len(recorded["devices"][0]["ticks"]) == 5
    replayed = GpuSampler(ReplayNvml(recorded))
    assert [replayed.sample(0) for _ in range(5)] == live


def test_the_live_view_shows_the_latest_gpu_sample(tmp_path):
    # the recorder's timeline hands each sample to the live view on the sampler's thread; the frame then holds the
    # replayed H200's latest busy figure, SM activity and power (read back here from the rows the recorder kept),
    # and the logged line says them
    config = TelemetryConfig(interval_ms=100, host=False)
    recorder = TelemetryRecorder(config, time.perf_counter_ns(), tmp_path, nvml=ReplayNvml(FIXTURE))
    out = io.StringIO()
    live = LiveRun(
        LiveSettings(display="lines", console=Console(file=out, width=400)),
        LiveAggregates([RequestSpec(0, "p", None, 4, 4, 0.0)], None, None),
        "out",
        "s",
    )
    live.begin(recorder.t0_ns)
    recorder.start()
    recorder.timeline.listeners.append(live.telemetry_sample)
    _wait_for_rows(tmp_path / "telemetry.csv", "DCGM_FI_DEV_POWER_USAGE", 3)
    recorder.stop()
    frame = live.refresh()
    last_t = max(t for t, s, n, v in recorder.timeline.rows if n == "DCGM_FI_DEV_POWER_USAGE")
    last = {n: v for t, s, n, v in recorder.timeline.rows if t == last_t}
    assert frame.gpu == GpuState(
        last_t,
        "NVML",
        1,
        last["DCGM_FI_DEV_GPU_UTIL"],
        last.get("DCGM_FI_PROF_SM_ACTIVE"),
        last["DCGM_FI_DEV_POWER_USAGE"],
    )
    live.view.show(frame)
    assert f"gpu {last['DCGM_FI_DEV_GPU_UTIL']:.0f}%, " in out.getvalue()
    assert f"{last['DCGM_FI_DEV_POWER_USAGE']:,.0f} W (1 GPU)" in out.getvalue()
