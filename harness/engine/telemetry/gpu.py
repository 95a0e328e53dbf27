"""NVIDIA GPU counters through NVML, named like DCGM fields, with GPM profiling metrics on Hopper+.

GPM (GPU Performance Monitoring, `nvmlGpm*`) gives what DCGM's profiling fields give (DRAM
bandwidth, SM activity, tensor pipes) without a DCGM daemon: two snapshots of the GPU's
counters, and nvmlGpmMetricsGet turns the pair into rates over the time between them. This
sampler keeps the previous snapshot, so each tick's figures cover the interval since the last one.

Units (the DCGM field's own unit, except energy):
  DCGM_FI_PROF_*_ACTIVE, DCGM_FI_PROF_SM_OCCUPANCY   fraction 0..1 (GPM gives percent)
  DCGM_FI_PROF_PCIE_{TX,RX}_BYTES, _NVLINK_{TX,RX}_  bytes/s (GPM gives MiB/s)
  DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_TOTAL          MiB
  DCGM_FI_DEV_POWER_USAGE                            W (NVML gives mW)
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION               J since driver load (NVML and DCGM give mJ)
  DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK        MHz
  DCGM_FI_DEV_GPU_TEMP                               degrees C
  DCGM_FI_DEV_CLOCK_THROTTLE_REASONS                 bitmask (nvmlClocksEventReasons)
  DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_MEM_COPY_UTIL    percent 0..100 (NVML's coarse "busy" figures)
  memory_bandwidth_peak_bytes_per_s                  bytes/s, bus width x max memory clock x 2 (DDR)

The nvml module is a parameter: pynvml in real runs, a replaying stand-in in tests.
"""

from __future__ import annotations

from harness.engine.telemetry.timeline import Unavailable

MIB = 1024 * 1024

# The nearest DCGM profiling field -> (pynvml GPM metric id constant, factor from the GPM unit to ours)
GPM_FIELDS = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("NVML_GPM_METRIC_GRAPHICS_UTIL", 0.01),
    "DCGM_FI_PROF_SM_ACTIVE": ("NVML_GPM_METRIC_SM_UTIL", 0.01),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("NVML_GPM_METRIC_SM_OCCUPANCY", 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": ("NVML_GPM_METRIC_HMMA_TENSOR_UTIL", 0.01),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("NVML_GPM_METRIC_FP64_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("NVML_GPM_METRIC_FP32_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("NVML_GPM_METRIC_FP16_UTIL", 0.01),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", MIB),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", MIB),
}


class GpuSampler:
    """Every GPU NVML sees. Lives in one sampler thread: NVML handles are used from that thread only."""

    def __init__(self, nvml=None):
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                raise Unavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
        self.nvml = nvml
        self.not_sampled: dict[str, str] = {}
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise Unavailable(f"NVML did not start: {exc} (is an NVIDIA driver installed and loaded?)") from None
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            nvml.nvmlShutdown()
            raise Unavailable("NVML started but sees no GPU")
        self.devices = [_Device(nvml, index, self.not_sampled) for index in range(count)]

    def sample(self, now_ns: int) -> list[tuple[str, str, float]]:
        return [row for device in self.devices for row in device.sample()]

    def close(self) -> None:
        for device in self.devices:
            device.close()
        self.nvml.nvmlShutdown()


class _Device:
    def __init__(self, nvml, index: int, not_sampled: dict[str, str]):
        self.nvml, self.source, self.not_sampled = nvml, f"gpu:{index}", not_sampled
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.readers = {
            "memory": self._memory,
            "power": self._power,
            "energy": self._energy,
            "clocks": self._clocks,
            "temperature": self._temperature,
            "throttle reasons": self._throttle,
            "utilization": self._utilization,
        }
        self._throttle_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self.static_rows = self._peak_bandwidth()
        self.gpm_fields: list[tuple[str, int, float]] = []
        self.gpm_samples = self._start_gpm()

    def sample(self) -> list[tuple[str, str, float]]:
        values: dict[str, float] = dict(self.static_rows)
        self.static_rows = {}  # constants go in once
        for what, reader in list(self.readers.items()):
            try:
                values.update(reader())
            except self.nvml.NVMLError as exc:
                # One note per field, then stop asking: a field unsupported now stays unsupported.
                self.not_sampled[f"{self.source} {what}"] = str(exc)
                del self.readers[what]
        if self.gpm_samples is not None:
            try:
                values.update(self._gpm())
            except self.nvml.NVMLError as exc:
                self.not_sampled[f"{self.source} GPM"] = f"GPM sampling failed: {exc}; no DCGM_FI_PROF_* fields"
                self.close()
        return [(self.source, name, value) for name, value in values.items()]

    def close(self) -> None:
        for sample in self.gpm_samples or ():
            self.nvml.nvmlGpmSampleFree(sample)
        self.gpm_samples = None

    # --- always-on NVML fields
    def _memory(self) -> dict[str, float]:
        info = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return {"DCGM_FI_DEV_FB_USED": info.used / MIB, "DCGM_FI_DEV_FB_TOTAL": info.total / MIB}

    def _power(self) -> dict[str, float]:
        return {"DCGM_FI_DEV_POWER_USAGE": self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0}

    def _energy(self) -> dict[str, float]:
        return {
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
        }

    def _clocks(self) -> dict[str, float]:
        nvml = self.nvml
        return {
            "DCGM_FI_DEV_SM_CLOCK": nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM),
            "DCGM_FI_DEV_MEM_CLOCK": nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_MEM),
        }

    def _temperature(self) -> dict[str, float]:
        return {"DCGM_FI_DEV_GPU_TEMP": self.nvml.nvmlDeviceGetTemperature(self.handle, self.nvml.NVML_TEMPERATURE_GPU)}

    def _throttle(self) -> dict[str, float]:
        # "Event reasons" is the newer name; drivers older than 535 only have "throttle reasons".
        if self._throttle_fn is not None:
            try:
                return {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": float(self._throttle_fn(self.handle))}
            except self.nvml.NVMLError as exc:
                if exc.value != self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                self._throttle_fn = None
        return {
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": float(
                self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle)
            )
        }

    def _utilization(self) -> dict[str, float]:
        rates = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        return {"DCGM_FI_DEV_GPU_UTIL": rates.gpu, "DCGM_FI_DEV_MEM_COPY_UTIL": rates.memory}

    def _peak_bandwidth(self) -> dict[str, float]:
        nvml = self.nvml
        try:
            bus_width_bits = nvml.nvmlDeviceGetMemoryBusWidth(self.handle)
            max_mem_clock_mhz = nvml.nvmlDeviceGetMaxClockInfo(self.handle, nvml.NVML_CLOCK_MEM)
        except nvml.NVMLError as exc:
            self.not_sampled[f"{self.source} memory_bandwidth_peak_bytes_per_s"] = str(exc)
            return {}
        return {"memory_bandwidth_peak_bytes_per_s": bus_width_bits / 8 * max_mem_clock_mhz * 1e6 * 2}

    # --- GPM
    def _start_gpm(self):
        nvml = self.nvml
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            self.not_sampled[f"{self.source} GPM"] = "nvidia-ml-py is too old for GPM (pip install -U nvidia-ml-py)"
            return None
        try:
            supported = nvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice
        except nvml.NVMLError as exc:
            self.not_sampled[f"{self.source} GPM"] = f"GPM support query failed: {exc} (driver older than R520?)"
            return None
        if not supported:
            name = nvml.nvmlDeviceGetName(self.handle)
            self.not_sampled[f"{self.source} GPM"] = (
                f"{name} has no GPM (needs Hopper or newer): no DCGM_FI_PROF_* fields"
            )
            return None
        self.gpm_fields = [
            (field, getattr(nvml, metric), factor)
            for field, (metric, factor) in GPM_FIELDS.items()
            if hasattr(nvml, metric)
        ]
        for field, (metric, _) in GPM_FIELDS.items():
            if not hasattr(nvml, metric):
                self.not_sampled[f"{self.source} {field}"] = f"nvidia-ml-py lacks {metric}: pip install -U nvidia-ml-py"
        samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        try:
            nvml.nvmlGpmSampleGet(self.handle, samples[0])
        except nvml.NVMLError as exc:  # e.g. MIG mode, where GPM wants per-instance samples
            self.not_sampled[f"{self.source} GPM"] = f"GPM sampling failed: {exc}; no DCGM_FI_PROF_* fields"
            for sample in samples:
                nvml.nvmlGpmSampleFree(sample)
            return None
        return samples

    def _gpm(self) -> dict[str, float]:
        nvml = self.nvml
        previous, current = self.gpm_samples
        nvml.nvmlGpmSampleGet(self.handle, current)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.gpm_fields)
        request.sample1, request.sample2 = previous, current
        for slot, (_, metric_id, _) in zip(request.metrics, self.gpm_fields):
            slot.metricId = metric_id
        nvml.nvmlGpmMetricsGet(request)
        self.gpm_samples = [current, previous]  # this tick's snapshot starts the next interval
        values, failed = {}, []
        for slot, (field, _metric_id, factor) in zip(request.metrics, self.gpm_fields):
            if slot.nvmlReturn == nvml.NVML_SUCCESS:
                values[field] = slot.value * factor
            else:  # e.g. NVLink figures on a GPU without NVLink
                self.not_sampled[f"{self.source} {field}"] = f"GPM: {nvml.NVMLError(slot.nvmlReturn)}"
                failed.append(field)
        self.gpm_fields = [f for f in self.gpm_fields if f[0] not in failed]
        return values
