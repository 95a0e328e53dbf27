"""Engine /metrics bytes counters, dcgm-exporter scraping, and the recorder against the real native engine."""

import asyncio
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import pytest

from harness.engine.launcher import free_port
from harness.engine.telemetry import TelemetryRecorder
from harness.engine.telemetry.dcgm import DcgmScraper, parse_dcgm_exporter
from harness.engine.telemetry.engine_bytes import EngineBytesPoller, engine_counters
from harness.engine.telemetry.timeline import Unavailable, read_telemetry_csv
from harness.scenario.telemetry_settings import TelemetryConfig
from native_engine.tiny_gguf import write_tiny_llama_gguf

NATIVE_PAGE = """# TYPE native:weight_bytes_read_total counter
native:weight_bytes_read_total{{model_name="smollm2"}} {weights}
# TYPE native:kv_bytes_read_total counter
native:kv_bytes_read_total{{model_name="smollm2"}} {kv}
"""
# Two data-parallel engines, as vLLM labels them; the counters are per GPU.
VLLM_PAGE = """# TYPE vllm:estimated_flops_per_gpu_total counter
vllm:estimated_flops_per_gpu_total{engine="0",model_name="m"} 4.0e12
vllm:estimated_flops_per_gpu_total{engine="1",model_name="m"} 6.0e12
# TYPE vllm:estimated_read_bytes_per_gpu_total counter
vllm:estimated_read_bytes_per_gpu_total{engine="0",model_name="m"} 1.0e11
vllm:estimated_read_bytes_per_gpu_total{engine="1",model_name="m"} 3.0e11
# TYPE vllm:estimated_write_bytes_per_gpu_total counter
vllm:estimated_write_bytes_per_gpu_total{engine="0",model_name="m"} 1.0e9
vllm:estimated_write_bytes_per_gpu_total{engine="1",model_name="m"} 1.0e9
"""
LLAMACPP_PAGE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 40
"""
# dcgm-exporter's text (default counters file), two GPUs; energy is in mJ there.
DCGM_PAGE = """# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-5c3f",pci_bus_id="00000000:18:00.0",device="nvidia0",\
modelName="NVIDIA H200",Hostname="node1"} 1980
DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-9a1e",pci_bus_id="00000000:2A:00.0",device="nvidia1",\
modelName="NVIDIA H200",Hostname="node1"} 1755
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-5c3f",device="nvidia0",\
modelName="NVIDIA H200",Hostname="node1"} {energy0}
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-9a1e",device="nvidia1",\
modelName="NVIDIA H200",Hostname="node1"} 9000000
# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is active sending or receiving data.
# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-5c3f",device="nvidia0",modelName="NVIDIA H200",Hostname="node1"} 0.713
DCGM_FI_PROF_DRAM_ACTIVE{gpu="1",UUID="GPU-9a1e",device="nvidia1",modelName="NVIDIA H200",Hostname="node1"} 0.402
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 12
"""


class Page:
    """A loopback HTTP server whose /metrics text the test changes between scrapes."""

    def __init__(self, text: str):
        self.text, self.scrapes = text, 0
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                page.scrapes += 1
                body = page.text.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def page():
    pages = []

    def make(text: str) -> Page:
        pages.append(Page(text))
        return pages[-1]

    yield make
    for p in pages:
        p.close()


def test_native_bytes_become_a_rate(page):
    server = page(NATIVE_PAGE.format(weights=1_000_000, kv=0))
    poller = EngineBytesPoller(server.url)
    first = {name: value for _, name, value in poller.sample(now_ns=10_000_000_000)}
    assert first["read_bytes_total"] == 1_000_000 and "read_bytes_per_s" not in first
    server.text = NATIVE_PAGE.format(weights=801_000_000, kv=200_000_000)  # 1 GB more, 0.5 s later
    second = {name: value for _, name, value in poller.sample(now_ns=10_500_000_000)}
    assert second["read_bytes_per_s"] == pytest.approx(2e9)
    assert second["native:kv_bytes_read_total"] == 200_000_000 and poller.family == "native"


def test_vllm_and_sglang_counters_are_per_gpu_means_with_flops(page):
    poller = EngineBytesPoller(page(VLLM_PAGE).url)
    rows = {name: value for _, name, value in poller.sample(now_ns=0)}
    assert rows["read_bytes_total"] == 2.0e11 and rows["flops_total"] == 5.0e12 and poller.family == "vllm"
    assert rows["write_bytes_total"] == 1.0e9
    sglang = EngineBytesPoller(page(VLLM_PAGE.replace("vllm:", "sglang:")).url)
    assert {n: v for _, n, v in sglang.sample(0)}["read_bytes_total"] == 2.0e11 and sglang.family == "sglang"
    assert engine_counters(VLLM_PAGE, {"vllm:estimated_flops_per_gpu_total"}) == {
        "vllm:estimated_flops_per_gpu_total": 5e12
    }


def test_engines_without_bytes_counters_are_unavailable_with_a_reason(page):
    server = page(LLAMACPP_PAGE)
    with pytest.raises(Unavailable, match="no bytes-read counters"):
        EngineBytesPoller(server.url).sample(0)
    with pytest.raises(Unavailable, match="404"):
        EngineBytesPoller(server.url.replace("/metrics", "/nope")).sample(0)
    with pytest.raises(Unavailable, match="engine_metrics_url"):
        EngineBytesPoller("127.0.0.1:8000/metrics")


def test_vllm_counters_stuck_at_zero_count_as_not_sampled(page, tmp_path):
    # vLLM's CPU backend (and any vLLM without --enable-mfu-metrics) exports these at 0.
    zeros = (
        "\n".join(
            line.rsplit(" ", 1)[0] + " 0.0" if not line.startswith("#") else line
            for line in VLLM_PAGE.strip().splitlines()
        )
        + "\n"
    )
    config = TelemetryConfig(interval_ms=100, gpu=False, engine_metrics_url=page(zeros).url)
    recorder = TelemetryRecorder(config, time.perf_counter_ns(), tmp_path)
    recorder.start()
    time.sleep(0.3)
    status = recorder.stop()
    assert "--enable-mfu-metrics" in status.not_sampled["engine_metrics"]
    assert recorder.host_ceiling_bytes_per_s is None  # nothing to compare with it, so not measured
    figures = recorder.derived(0.0, 0.3, output_tokens=10)
    assert figures.mbu is None and figures.engine_read_bytes_per_s is None


def test_dcgm_exporter_series_keep_gpu_labels_and_energy_in_joules(page):
    rows = parse_dcgm_exporter(DCGM_PAGE.replace("{energy0}", "5000000"))
    by_key = {(source, name): value for source, name, value in rows}
    assert by_key["dcgm:0", "DCGM_FI_DEV_SM_CLOCK"] == 1980 and by_key["dcgm:1", "DCGM_FI_DEV_SM_CLOCK"] == 1755
    assert by_key["dcgm:0", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 5000.0  # 5,000,000 mJ
    assert by_key["dcgm:1", "DCGM_FI_PROF_DRAM_ACTIVE"] == 0.402
    assert len(rows) == 6  # process_open_fds is not a DCGM series
    with pytest.raises(Unavailable, match="no DCGM_FI_"):
        DcgmScraper(page(LLAMACPP_PAGE).url).sample(0)


def test_recorder_with_dcgm_exporter_gives_energy_per_token(page, tmp_path):
    server = page(DCGM_PAGE.replace("{energy0}", "5000000"))
    config = TelemetryConfig(interval_ms=100, gpu=False, host=False, dcgm_exporter_url=server.url)
    recorder = TelemetryRecorder(config, time.perf_counter_ns(), tmp_path)
    recorder.start()
    time.sleep(0.25)
    server.text = DCGM_PAGE.replace("{energy0}", "5600000")  # GPU 0 uses 600 J; GPU 1 is idle
    time.sleep(0.35)
    status = recorder.stop()
    assert status.sampled == ["dcgm:0", "dcgm:1"] and status.not_sampled["gpu"] == "telemetry.gpu is false"
    t_s, energy = recorder.timeline.series("dcgm:0", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    start_s, end_s = t_s[energy == 5000.0][-1], t_s[-1]  # from the last reading before the rise to the end
    derived = recorder.derived(start_s, end_s, output_tokens=1200)
    assert derived.gpu_energy_j == pytest.approx(600.0)
    assert derived.energy_per_output_token_j == pytest.approx(0.5)
    assert derived.dram_bandwidth_util_mean == pytest.approx((0.713 + 0.402) / 2)


async def test_recorder_sees_the_native_engine_work(tmp_path):
    model = write_tiny_llama_gguf(
        tmp_path / "tiny.gguf", seed=0, n_layers=4, hidden=256, n_heads=8, n_kv_heads=4, ffn=1024
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "native_engine",
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            "--kv-cache-tokens",
            "4096",
            "--served-model-name",
            "tiny",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=60)
        assert base in line
        t0_ns = time.perf_counter_ns()
        config = TelemetryConfig(interval_ms=100)
        recorder = TelemetryRecorder(
            config, t0_ns, tmp_path / "run", engine_pid=proc.pid, engine_metrics_url=f"{base}/metrics"
        )
        recorder.start()
        await asyncio.sleep(0.3)  # an idle stretch before the load
        async with aiohttp.ClientSession() as http:

            async def complete(i: int) -> int:
                body = {"model": "tiny", "prompt": f"request {i}", "max_tokens": 64, "ignore_eos": True}
                async with http.post(f"{base}/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    return (await resp.json())["usage"]["completion_tokens"]

            start_s = (time.perf_counter_ns() - t0_ns) / 1e9
            tokens = 0
            # at least 0.6 s of load, several 100 ms samples: on a fast machine one round ended between two
            while tokens == 0 or (time.perf_counter_ns() - t0_ns) / 1e9 - start_s < 0.6:
                tokens += sum(await asyncio.gather(*(complete(i) for i in range(4))))
            end_s = (time.perf_counter_ns() - t0_ns) / 1e9
            await asyncio.sleep(0.25)
            final_page = await (await http.get(f"{base}/metrics")).text()
        status = recorder.stop()
    finally:
        proc.terminate()
        proc.wait(10)

    assert {"host", "engine_process", "engine_metrics"} <= set(status.sampled)
    assert recorder.engine_family == "native"
    rows = read_telemetry_csv(tmp_path / "run" / "telemetry.csv")
    cpu = [(t, v) for t, s, n, v in rows if (s, n) == ("engine_process", "cpu_percent")]
    util = [(t, v) for t, s, n, v in rows if (s, n) == ("engine_metrics", "bandwidth_util")]
    assert max(v for t, v in cpu if start_s <= t <= end_s) > 20  # decoding keeps a core busy
    assert min(v for t, v in cpu if t < start_s) < 20  # and before the load it idled
    assert any(v > 0 for t, v in util if start_s <= t <= end_s) and all(v == 0 for t, v in util if t < start_s)
    # The timeline's last reading of the engine's counters is the engine's final count.
    counted = engine_counters(final_page, {"native:weight_bytes_read_total", "native:kv_bytes_read_total"})
    last_total = [v for t, s, n, v in rows if (s, n) == ("engine_metrics", "read_bytes_total")][-1]
    assert last_total == pytest.approx(sum(counted.values())) and last_total > 0

    derived = recorder.derived(start_s, end_s, tokens)
    assert derived.engine_cpu_percent_mean > 10 and derived.engine_rss_bytes_max > 10_000_000
    assert derived.engine_read_bytes_per_s > 0 and derived.memory_bandwidth_ceiling_bytes_per_s > 1e9
    assert derived.mbu == pytest.approx(derived.engine_read_bytes_per_s / derived.memory_bandwidth_ceiling_bytes_per_s)
    assert derived.dram_bandwidth_util_source == "engine bytes read / memory ceiling"
    assert derived.energy_per_output_token_j is None  # no GPU here


def test_fed_engine_pages_with_a_bad_url_are_not_sampled_with_the_reason(tmp_path):
    config = TelemetryConfig(interval_ms=100, gpu=False, host=False)
    recorder = TelemetryRecorder(
        config, time.perf_counter_ns(), tmp_path, engine_metrics_url="127.0.0.1:8000/metrics", engine_pages_fed=True
    )
    recorder.start()
    recorder.engine_page(time.perf_counter_ns(), NATIVE_PAGE.format(weights=1, kv=0))  # ignored: no counters
    status = recorder.stop()
    assert "is not an http(s) URL" in status.not_sampled["engine_metrics"]
    assert "engine_metrics" not in status.sampled
