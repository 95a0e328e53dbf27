"""What the harness needs to know about one serving engine: its request dialect, stream format,
readiness and version endpoints, Prometheus path, profiler hooks and default launch command.

`Backend` itself is the plain OpenAI-compatible server; each engine module subclasses it and
overrides only where the engine differs. Backends are found by name through the
`bench.backends` entry-point group (see backends/__init__.py), so a third-party package can
add one without touching this repository.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from backends.api_dialects import DIALECTS
from backends.http import http_get, http_post  # noqa: F401  (re-exported: backends use them from here)
from backends.openai import CHAT, COMPLETIONS, ParsedStream, StreamError, build_request_body, json_object, parse_sse

NATIVE = "native"  # backend.api for an engine's own (non-OpenAI) generate endpoint
# workload.sampling's fields (harness/scenario/sampling.py), each under the name the OpenAI-compatible servers read
# (vLLM, SGLang and trtllm-serve take top_k, min_p and repetition_penalty at the top level beside OpenAI's own)
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


@dataclass
class Backend:
    """The OpenAI-compatible dialect. `eos_token_ids`: only for engines that need them to force
    the output length (llama-cpp-python's logit_bias). `profile`, `step_trace`: what the run asks
    of an engine it launches (backend.profile, backend.trace); see launch_args()."""

    eos_token_ids: tuple[int, ...] = ()
    profile: bool = False
    step_trace: bool = False

    name = "openai"
    description = "any OpenAI-compatible server (/v1/completions, /v1/chat/completions)"
    # completions and chat, then the other APIs such a server may serve (backends/api_dialects.py): vLLM serves all
    # three (vllm/entrypoints/pooling/embed with a pooling model, openai/responses, anthropic), and so does the
    # built-in engine; a server without one answers 404, which fails the request with http_4xx
    paths = {
        COMPLETIONS: "/v1/completions",
        CHAT: "/v1/chat/completions",
        **{api: dialect.path for api, dialect in DIALECTS.items()},
    }
    # class constants, not fields: subclasses override them by plain assignment
    ready_paths = ("/health", "/v1/models")  # the first that answers < 400 means ready
    metrics_path = "/metrics"  # Prometheus text page; None: the engine has none
    replicas_path = None  # a router's list of its replicas ({"replicas": [{"id", "url"}]}), each scraped too
    metrics_hint = "set backend.metrics_url"  # what to do when the page is missing (404)
    version_path = None
    old_version_path = None  # asked when version_path does not answer (an older server)
    profile_paths = None  # (start, stop), POSTed around the measured window
    profile_hint = ""  # how to start the engine so those routes exist, for the warning when they are missing
    step_trace_path = None  # GET after the load: the engine's per-step trace (native engine only)
    prefix_cache_reset_path = None  # POST empties the engine's prefix cache (bench tune, between points)
    keep_alive = True  # False: the engine closes a connection after each stream, so never reuse one
    forces_length = True  # honours workload.ignore_eos: every answer has exactly the planned length
    # workload.sampling's field -> the request field this engine reads it from; a field left out is not read
    sampling_names = {name: name for name in SAMPLING_FIELDS}

    # --- requests -------------------------------------------------------------------------
    def endpoint_path(self, api: str) -> str:
        if api not in self.paths:
            raise ValueError(f"backend.api: {self.name} supports {sorted(self.paths)}, got {api!r}")
        return self.paths[api]

    def request_body(
        self,
        api: str,
        model: str,
        max_tokens: int,
        prompt: str | None = None,
        messages: list[dict] | None = None,
        ignore_eos: bool = False,
    ) -> dict:
        """One streaming request; `ignore_eos` asks for exactly max_tokens output tokens."""
        self.endpoint_path(api)
        if api in DIALECTS:
            return DIALECTS[api].build(model, max_tokens, prompt, messages, ignore_eos)
        return build_request_body(api, model, max_tokens, prompt, messages, ignore_eos)

    def sampling_fields(self, api: str, fields: dict) -> dict:
        """workload.sampling's fields under this engine's names; ValueError naming a field it does not read."""
        if api in DIALECTS and not DIALECTS[api].generates:
            return {}  # nothing is sampled (embeddings, rerank): workload.sampling (greedy by default) is not sent
        unread = [name for name in fields if name not in self.sampling_names]
        if unread:
            raise ValueError(
                f"workload.sampling.{unread[0]}: {self.name} does not read it (it reads "
                f"{', '.join(self.sampling_names)}); leave it out"
            )
        return {self.sampling_names[name]: value for name, value in fields.items()}

    def add_sampling(self, body: dict, api: str, fields: dict) -> None:
        """Puts the sampling fields into a request body where the engine reads them: the top level here."""
        body.update(self.sampling_fields(api, fields))

    def parse_stream(self, api: str, reads: list[bytes], read_times_ns: list[int]) -> ParsedStream:
        """Called after the stream ended, with each network read and its arrival time."""
        if api in DIALECTS:
            return DIALECTS[api].parse(reads, read_times_ns)
        return parse_sse(reads, read_times_ns)

    # --- launching ------------------------------------------------------------------------
    def launch_command(self, port: int, model: str) -> list[str]:
        """The engine's command line when backend.launch gives no command."""
        raise ValueError(f"backend.launch.command: missing; bench has no default command for kind {self.name!r}")

    def launch_env(self, port: int) -> dict[str, str]:
        return {}

    def sizing_args(self, sizing) -> list[tuple[tuple[str, ...], str]]:
        """Arguments for the default command so the engine fits the benchmark (harness.engine.launcher.EngineSizing):
        (the flag's spellings, value) pairs; a flag the user gives in launch.args wins."""
        return []

    def launch_args(self, out_dir: Path, args: list[str]) -> list[str]:
        """Flags added to the launch command line (default or launch.command + launch.args, given
        as `args`) for what the run asks: a profiler directory, the step trace, metrics options."""
        return []

    def after_ready(self, url: str, model: str, log) -> None:
        """Work once the server answers and before any load (Ollama pulls its model here)."""

    def engine_build_s(self, log_text: str) -> float | None:
        """Seconds the engine spent building an engine at start-up, as its log reports them; None when it builds
        none (run.json's startup block, harness/engine/startup.py)."""
        return None

    # --- probes ---------------------------------------------------------------------------
    def version(self, url: str, headers: dict | None = None) -> str | None:
        """The engine's version as it reports it, or None."""
        text = None
        for path in (self.version_path, self.old_version_path):
            if path and text is None:
                try:
                    text = http_get(url + path, headers, timeout_s=2.0)
                except OSError:
                    pass
        if text is None:
            return None
        try:
            obj = json.loads(text)
        except ValueError:
            return text.strip()[:100] or None
        if isinstance(obj, dict):
            for key in ("version", "build_info", "server_version"):
                if obj.get(key):
                    return str(obj[key])
        return json.dumps(obj)[:100]

    def metrics_url(self, url: str) -> str | None:
        return url + self.metrics_path if self.metrics_path else None


def python_module(module: str) -> list[str]:
    """`python -m module` with the interpreter running the harness (engines installed beside it)."""
    return [sys.executable, "-m", module]


def json_lines(reads: list[bytes], read_times_ns: list[int]) -> list[tuple[dict, int]]:
    """NDJSON: each line's object with the arrival time of the read that completed the line."""
    out, pending, cut = [], b"", None
    for data, t_ns in zip(reads, read_times_ns):
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                out.append((json_object(line), t_ns))
    if pending.strip():
        cut = pending
    if cut is not None:
        try:
            out.append((json_object(cut), read_times_ns[-1]))  # a last line without its newline
        except StreamError:
            raise StreamError("stream_cut", f"stream ended inside a line: {cut[:120]!r}") from None
    return out
