"""The scenario file: what engine to hit, with which requests, at what pace, against which SLOs.

`load_scenario(path, overrides)` reads YAML, applies `dotted.path=value` overrides and
validates. Every problem becomes one `ScenarioError` naming the YAML path, the bad value
and what is accepted.
Relative file paths (`load.trace`, `workload.path`) are resolved against the scenario's folder.

Request count: give `load.num_requests` (measured requests; warm-ups come on top) or
`load.duration_s`, not both; with neither, 100 requests, except that a trace replays all its rows.

Sweep: `load.sweep` lists offered loads, in increasing order, run one after another (harness.runs.sweep):
requests/s for open arrivals, requests in flight for `arrival: closed`. Each value replaces
`load.rate` (or `load.concurrency`) for its point; the request count applies to every point.
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from backends import available, load_backend
from harness.limits import (
    DEFAULT_MAX_RESPONSE_BYTES,
    MAX_CONCURRENCY,
    MAX_RATE_PER_S,
    MAX_REQUESTS,
    MAX_SCHEDULE_S,
    MAX_TOKENS_PER_REQUEST,
)
from harness.scenario.arrivals import Arrival, ArrivalError, arrival_process
from harness.scenario.distributions import Dist, dist_from_yaml
from harness.scenario.paths import scenario_path
from harness.scenario.planning import PlanSpec
from harness.scenario.sampling import SamplingConfig
from harness.scenario.telemetry_settings import TelemetryConfig
from harness.scenario.tuning import TuneConfig
from harness.scenario.workload_kinds import WORKLOADS, WorkloadKind, WorkloadKindError, workload_kind

DEFAULT_NUM_REQUESTS = 100  # used when neither load.num_requests nor load.duration_s is given


class ScenarioError(Exception):
    """A scenario (or a file it points to) is not valid; the message says where and how to fix it."""


def _bounded(limit: float, unit: str):
    """After-validator: every parameter of a distribution finite and at most `limit`."""

    def check(dist: Dist) -> Dist:
        for name in ("mean", "std", "min", "max"):
            value = getattr(dist, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} {value} must be a finite number")
            if value is not None and value > limit:
                raise ValueError(f"{name} {value:g} is more than the limit of {limit:g} {unit}")
        return dist

    return AfterValidator(check)


TokenLength = Annotated[
    Dist, BeforeValidator(lambda v: dist_from_yaml(v, whole_numbers=True)), _bounded(MAX_TOKENS_PER_REQUEST, "tokens")
]
Seconds = Annotated[
    Dist, BeforeValidator(lambda v: dist_from_yaml(v, whole_numbers=False)), _bounded(MAX_SCHEDULE_S, "seconds")
]


def _resolve_existing_file(value: str | None, info: ValidationInfo, field_path: str) -> str | None:
    """Resolve a path against the scenario's folder (or the cwd) and require the file to exist."""
    if value is None:
        return None
    path = scenario_path(value, info)
    if not path.is_file():
        raise ScenarioError(f"{field_path}: file {value!r} not found (looked in {path.parent.resolve()})")
    return str(path.resolve())


class Strict(BaseModel):
    # strict: `rate: true` or `num_requests: "8"` are mistakes to report, not values to coerce;
    # `.inf` and `.nan` are never a rate, a timeout or an SLO.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


LAUNCH_PLACEHOLDERS = "{port}, {host}, {model}"
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token: what a header name may hold


def numbers_as_text(value: Any) -> Any:
    """YAML reads `--port, 8000` or `OMP_NUM_THREADS: 2` as ints; command lines and environments are text."""

    def as_text(v: Any) -> Any:
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    if isinstance(value, dict):
        return {k: as_text(v) for k, v in value.items()}
    return [as_text(v) for v in value] if isinstance(value, list) else value


class LaunchConfig(Strict):
    """How the harness starts the engine itself; empty means the backend's default command.
    `command` replaces the whole command line (it must place {port}); `program` replaces only the
    default command's program (another binary, another venv's python) and keeps its arguments."""

    command: str | None = None
    program: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    ready_timeout_s: float = Field(default=300.0, gt=0, le=MAX_SCHEDULE_S, description="seconds")

    @field_validator("args", "env", mode="before")
    @classmethod
    def _numbers_as_text(cls, value: Any) -> Any:
        return numbers_as_text(value)


# request fields the harness owns, and what sets them: extra_body may not override them
OWNED_BODY_KEYS = {
    **{k: "its stream is what is measured" for k in ("stream", "stream_options")},
    # the prompt under each API's name: completions, chat, SGLang's /generate, responses and embeddings, messages
    **{
        k: "from the workload's prompts"
        for k in ("prompt", "messages", "text", "input", "system", "query", "documents")
    },
    **{
        k: "from workload.output_tokens"
        for k in ("max_tokens", "max_completion_tokens", "min_tokens", "max_output_tokens")
    },
    "ignore_eos": "from workload.ignore_eos",
    **{k: "from workload.sampling, which run.json records" for k in SamplingConfig.model_fields},
}


# the backend.api values whose requests carry chat messages (a file's messages rows, a session's history)
MESSAGE_APIS = ("chat", "responses", "anthropic_messages")


class BackendConfig(Strict):
    kind: str  # an installed backend: backends.available() (`bench backends` lists them)
    url: str | None = None
    model: str = "smollm2"
    # native: the engine's own API (SGLang /generate); embeddings, responses, anthropic_messages: OpenAI's
    # /v1/embeddings and /v1/responses, Anthropic's /v1/messages; rerank: vLLM's /v1/rerank (backends/api_dialects.py)
    api: Literal["completions", "chat", "native", "embeddings", "rerank", "responses", "anthropic_messages"] = (
        "completions"
    )
    launch: LaunchConfig | None = None
    request_timeout_s: float = Field(default=600.0, gt=0, le=MAX_SCHEDULE_S, description="seconds")
    headers: dict[str, str] = {}
    # one answer is buffered whole until its stream ends: an endless one must fail, not eat the memory
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1024, le=1 << 40, description="bytes")
    # token arrival times: the kernel's receive time of each read (Linux, http://), or when the event loop got
    # round to it (aiohttp; TLS, other systems); auto takes kernel where it can (harness/client/stamped_http.py)
    stamps: Literal["auto", "kernel", "loop"] = "auto"
    metrics_url: str | None = None  # the Prometheus page; default: url + the engine's metrics path
    # each replica's own Prometheus page behind a router (replica name -> URL), scraped with a replica label;
    # given, it replaces the router's own list (native's GET /replicas)
    replica_metrics: dict[str, str] = {}
    profile: bool = False  # POST the engine's /start_profile and /stop_profile around the load (vLLM, SGLang)
    trace: bool = False  # the engine's per-step trace into engine_trace.json (native engine: --step-trace)
    eos_token_ids: list[int] = []  # llama-cpp-python only: EOS ids to bias away when workload.ignore_eos
    tokenizer: str | None = None  # local tokenizer for prompt lengths: a GGUF, a HF folder/tokenizer.json or name
    # merged into every request body, as vLLM's bench --extra-body (top-level keys replace the harness's)
    extra_body: dict[str, Any] = {}

    @field_validator("kind")
    @classmethod
    def _installed(cls, kind: str) -> str:
        known = list(available())
        if kind not in known:
            raise ValueError("must be " + ", ".join(repr(k) for k in known) + " (the installed backends)")
        return kind

    @field_validator("headers")
    @classmethod
    def _one_line_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        # a CR or LF would end the header early and let the rest of the value forge others
        for name, value in headers.items():
            for what, text in (("name", name), ("value", value)):
                if any(c in text for c in "\r\n\0"):
                    raise ScenarioError(
                        f"backend.headers.{name.strip()}: the header {what} {text!r} contains a "
                        "line break or NUL, which would split the HTTP request; write it on one line"
                    )
            if not HEADER_NAME.fullmatch(name):  # a server answers 400 to every request, /health first
                raise ScenarioError(
                    f"backend.headers: {name!r} is not a valid HTTP header name: use letters, digits "
                    f"and !#$%&'*+-.^_`|~ only, no spaces or ':' (e.g. X-Api-Key)"
                )
        return headers

    @field_validator("extra_body")
    @classmethod
    def _not_what_the_harness_owns(cls, body: dict[str, Any]) -> dict[str, Any]:
        for key in body:
            if key in OWNED_BODY_KEYS:
                raise ScenarioError(
                    f"backend.extra_body.{key}: the harness sets it for every request ({OWNED_BODY_KEYS[key]}); "
                    "leave it out of extra_body"
                )
        return body

    @field_validator("metrics_url")
    @classmethod
    def _metrics_http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https:// (e.g. http://127.0.0.1:8000/metrics)")
        return url

    @field_validator("replica_metrics", mode="before")
    @classmethod
    def _names_as_text(cls, pages: Any) -> Any:
        if not isinstance(pages, dict):
            raise ScenarioError(
                f"backend.replica_metrics: {pages!r} is not valid: give a mapping of replica name "
                f"to its Prometheus page, e.g. {{replica-0: http://127.0.0.1:8001/metrics}}"
            )
        return {str(k): v for k, v in pages.items()}  # YAML reads `0: http://...` with an int key

    @field_validator("replica_metrics")
    @classmethod
    def _replica_pages(cls, pages: dict[str, str]) -> dict[str, str]:
        for name, url in pages.items():
            # the name becomes a Prometheus label value (replica="<name>") in server_metrics.csv
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
                raise ScenarioError(
                    f"backend.replica_metrics: replica name {name!r} is not valid; use letters, "
                    f"digits, '.', '_' and '-' (e.g. replica-0: http://127.0.0.1:8001/metrics)"
                )
            if not url.startswith(("http://", "https://")):
                raise ScenarioError(
                    f"backend.replica_metrics.{name}: {url!r} is not valid: give the replica's "
                    f"Prometheus page as an http(s) URL (e.g. http://127.0.0.1:8001/metrics)"
                )
        return pages

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https:// (e.g. http://127.0.0.1:8000)")
        return None if url is None else url.rstrip("/")

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_source(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A path (GGUF, tokenizer.json, a folder with one) must exist; other text is a Hugging Face hub name."""
        if value is None or value == "smollm2":
            return value
        path = scenario_path(value, info)
        if path.exists():
            return str(path.resolve())
        if value.startswith(("/", ".", "~")) or value.endswith((".gguf", ".json")):
            raise ScenarioError(
                f"backend.tokenizer: {value!r} not found (looked in {path.parent.resolve()}); give "
                f"a GGUF file, a folder with tokenizer.json, or a Hugging Face name"
            )
        return value

    @model_validator(mode="after")
    def _url_or_launch(self) -> BackendConfig:
        if self.url is None and self.launch is None:
            raise ScenarioError("backend.url: missing; give the engine's URL, or `launch: {}` to start it")
        launch = self.launch
        if launch is not None and launch.command and launch.program:
            raise ScenarioError(
                "backend.launch.program: give either launch.command (the whole command line) or "
                "launch.program (the default command with another program), not both"
            )
        if (
            launch is not None
            and launch.command
            and not any("{port}" in part for part in [launch.command, *launch.args])
        ):
            if not load_backend(self.kind).launch_env(1):  # engines told their port by environment need no {port}
                raise ScenarioError(
                    f"backend.launch.command: {launch.command!r} has no {{port}}; bench picks a free port and "
                    f"fills it in, so write it where the engine takes its port (e.g. --port {{port}}); "
                    f"placeholders: {LAUNCH_PLACEHOLDERS}"
                )
        return self


class ModelShare(Strict):
    """One side of workload.mix: the `model` its requests ask for (an engine's model name, or a LoRA adapter's as
    vLLM serves them) and its share of the traffic."""

    model: str = Field(min_length=1)
    weight: float = Field(gt=0, le=1e6)


class AgenticConfig(Strict):
    """workload.kind agentic (harness/scenario/agentic.py): the shape of an agent's session. `turns` are the parent's
    turns in order: `user` (a task), `tool_result` (the tool call the previous answer made, answered after
    tool_delay_s), `subagent` (its answer starts fan_out child sessions of subagent_turns turns each, run in
    parallel) and `merge` (the turn after them, carrying the children's answers). Every session opens with the same
    system prompt of system_prompt_tokens, so the engine's prefix cache can serve it."""

    system_prompt_tokens: int = Field(default=256, ge=0, le=MAX_TOKENS_PER_REQUEST, description="tokens")
    turns: list[Literal["user", "tool_result", "subagent", "merge"]] = Field(
        default=["user", "tool_result", "subagent", "merge", "tool_result"], min_length=1, max_length=1000
    )
    tool_result_tokens: TokenLength = Dist(dist="fixed", mean=64)
    tool_delay_s: Seconds = Dist(dist="fixed", mean=0.0)
    think_time_s: Seconds = Dist(dist="fixed", mean=0.0)
    fan_out: int = Field(default=4, ge=1, le=64)
    subagent_turns: int = Field(default=2, ge=1, le=1000)


IMAGE_KINDS = ("random", "shared_prefix", "repeat", "structured")  # one prompt per request, no messages of their own


class ImagesConfig(Strict):
    """workload.images (harness/scenario/images.py): image content parts added to each chat request's user message,
    synthetic (`count` images of `width` x `height`, `format` png or jpeg) or read from a `folder` of real ones;
    `share` is the fraction of requests that carry them (the others stay text, so one run compares both)."""

    count: int = Field(default=1, ge=1, le=64, description="images per request")
    width: int | None = Field(default=None, ge=16, le=8192, description="pixels")
    height: int | None = Field(default=None, ge=16, le=8192, description="pixels")
    format: Literal["png", "jpeg"] = "png"
    folder: str | None = None
    share: float = Field(default=1.0, gt=0, le=1, description="of the requests")

    @field_validator("folder")
    @classmethod
    def _folder_exists(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        path = scenario_path(value, info)
        if not path.is_dir():
            raise ScenarioError(f"workload.images.folder: folder {value!r} not found (looked in {path.resolve()})")
        return str(path.resolve())

    @model_validator(mode="after")
    def _synthetic_or_folder(self) -> ImagesConfig:
        sized = self.width is not None or self.height is not None
        # format compared with its default, not "was it written", so a resolved_dict() validates again
        if self.folder is not None and (sized or self.format != "png"):
            raise ScenarioError(
                "workload.images.folder: real images keep their own size and format; "
                "give either folder or width/height (and format), not both"
            )
        if self.folder is None and (self.width is None or self.height is None):
            missing = "width" if self.width is None else "height"
            raise ScenarioError(
                f"workload.images.{missing}: missing; synthetic images need width and height "
                "(e.g. {count: 1, width: 512, height: 512}), or give folder: PATH of real images"
            )
        return self


class WorkloadConfig(Strict):
    kind: str = "random"  # a name in harness.scenario.workload_kinds.WORKLOADS
    input_tokens: TokenLength = Dist(dist="fixed", mean=256)  # shared_prefix: the unique suffix; repeat: the passage
    output_tokens: TokenLength = Dist(dist="fixed", mean=128)
    ignore_eos: bool = True
    num_groups: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    prefix_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_PER_REQUEST, description="tokens")
    group_assignment: Literal["round_robin", "random"] = "round_robin"
    turns: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    think_time_s: Seconds = Dist(dist="fixed", mean=0.0)
    path: str | None = None
    format: Literal["auto", "jsonl", "sharegpt"] = "auto"
    schemas: str | None = None  # structured: JSONL of {"schema", "prompt"?, "name"?}, one per request in turn
    sampling: SamplingConfig = SamplingConfig()  # greedy unless set (harness/scenario/sampling.py)
    # what each record keeps of the answer: its text, a SHA-256 of it (exact-match comparisons), or nothing
    record_outputs: Literal["text", "hash", "none"] = "hash"
    # traffic split over models or adapters by weight (a session stays on one); the summary reports each apart
    mix: list[ModelShare] | None = None
    agentic: AgenticConfig | None = None  # workload.kind agentic: the sessions' turns, tools and sub-agents
    images: ImagesConfig | None = None  # image parts in each chat request (harness/scenario/images.py)

    @field_validator("mix")
    @classmethod
    def _mix_names_two_or_more(cls, value: list[ModelShare] | None) -> list[ModelShare] | None:
        if value is not None:
            names = [share.model for share in value]
            if len(names) < 2 or len(set(names)) < len(names):
                raise ValueError(
                    f"workload.mix: give two or more distinct models with weights, e.g. [{{model: a, weight: 0.7}}, "
                    f"{{model: b, weight: 0.3}}]; got {names}"
                )
        return value

    @field_validator("path")
    @classmethod
    def _path_exists(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _resolve_existing_file(value, info, "workload.path")

    @field_validator("schemas")
    @classmethod
    def _schemas_exist(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _resolve_existing_file(value, info, "workload.schemas")

    @model_validator(mode="after")
    def _fields_match_kind(self) -> WorkloadConfig:
        try:
            kind = workload_kind(self.kind)
            self._check_kind_fields(kind)
            kind.check(self)
        except WorkloadKindError as error:
            raise ScenarioError(str(error)) from None
        return self

    def _check_kind_fields(self, kind: WorkloadKind) -> None:
        """Fields another kind owns left at their defaults; those this kind needs given."""
        others = [(name, owner) for owner in WORKLOADS if owner != self.kind for name in workload_kind(owner).fields]
        for name, owner in others:
            # Compared with the default, not "was it written", so a resolved_dict() validates again.
            if getattr(self, name) != type(self).model_fields[name].default:
                raise ScenarioError(f"workload.{name}: only used when workload.kind is {owner} (kind is {self.kind})")
        for name in kind.required:
            if getattr(self, name) is None:
                raise ScenarioError(f"workload.{name}: missing; workload.kind {self.kind} needs it")


class LoadConfig(Strict):
    arrival: str = "poisson"  # a name in harness.scenario.arrivals.ARRIVALS (or the bench.arrivals entry points)
    arrival_options: dict[str, Any] | None = None  # what the arrival process takes beyond rate (square_wave)
    rate: float | None = Field(default=None, gt=0, le=MAX_RATE_PER_S, description="requests/s")
    burstiness: float = Field(default=1.0, gt=0, le=1e6)  # gamma shape: 1 = Poisson, < 1 burstier
    concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY, description="requests in flight")
    trace: str | None = None
    trace_format: Literal["auto", "mooncake", "azure", "burstgpt", "weka"] = "auto"
    trace_block_size: int = Field(
        default=512, ge=1, le=MAX_TOKENS_PER_REQUEST, description="tokens per Mooncake hash_id block"
    )
    time_scale: float = Field(default=1.0, gt=0, le=1000)  # multiplies trace gaps: 0.5 replays twice as fast
    num_requests: int | None = Field(
        default=None, ge=1, le=MAX_REQUESTS, description="measured requests (warm-ups come on top)"
    )
    duration_s: float | None = Field(default=None, gt=0, le=MAX_SCHEDULE_S, description="seconds of measured load")
    max_requests: int = Field(default=2000, ge=1, le=MAX_REQUESTS, description="requests")  # plan cap with duration_s
    warmup_requests: int = Field(default=0, ge=0, le=MAX_REQUESTS)
    workers: Literal["auto"] | int = "auto"  # client processes sending the load; auto sizes by token rate
    # a Ray cluster to send the load from, one client actor per node (harness.client.ray.shards): auto or its address
    ray: str | None = None
    # unset: harness.client.ray.shards.DEFAULT_MAX_CLOCK_UNCERTAINTY_MS (None, so runs from before the option compare
    # equal)
    ray_max_clock_uncertainty_ms: float | None = Field(default=None, gt=0, le=1000, description="ms")
    sweep: list[float] | None = None  # requests/s (open arrivals) or requests in flight (closed), one point each
    # measure over the steady-state window, ramp-up and drain cut (harness/metrics/steady_window.py); false keeps the
    # whole
    # run. Unset means true (None, so runs from before the option compare equal in the gate)
    trim: bool | None = None

    @field_validator("arrival")
    @classmethod
    def _known_arrival(cls, value: str) -> str:
        try:
            arrival_process(value)
        except ArrivalError as error:
            raise ScenarioError(str(error)) from None
        return value

    @property
    def process(self) -> Arrival:
        """The arrival process load.arrival names (harness/scenario/arrivals.py)."""
        return arrival_process(self.arrival)

    @field_validator("workers", mode="before")
    @classmethod
    def _auto_or_count(cls, value: Any) -> Any:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError("must be auto or a whole number of client processes >= 1")
        return value

    @field_validator("trace")
    @classmethod
    def _trace_exists(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _resolve_existing_file(value, info, "load.trace")

    @field_validator("sweep", mode="before")
    @classmethod
    def _a_list(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, list):
            raise ValueError("must be a list of loads in increasing order, e.g. [1, 2, 4]")
        return value

    @field_validator("sweep")
    @classmethod
    def _increasing_loads(cls, sweep: list[float] | None) -> list[float] | None:
        if sweep is None:
            return None
        if not sweep:
            raise ValueError("give at least one load, e.g. sweep: [1, 2, 4], or leave load.sweep out")
        if any(v <= 0 for v in sweep):
            raise ValueError("every load must be > 0 (requests/s, or requests in flight for arrival closed)")
        # increasing, not sorted for the user: the folder numbers follow the order written
        if any(b <= a for a, b in zip(sweep, sweep[1:])):
            raise ValueError("list the loads in increasing order, each once, e.g. [1, 2, 4]")
        return sweep

    @model_validator(mode="after")
    def _cross_field_checks(self) -> LoadConfig:
        if self.sweep is not None:
            self._check_sweep()
        try:
            self.process.check(self)
        except ArrivalError as error:
            raise ScenarioError(str(error)) from None
        if self.num_requests is not None and self.duration_s is not None:
            raise ScenarioError("load.duration_s: give either load.num_requests or load.duration_s, not both")
        # A trace without a count replays all its rows; everything else defaults to a fixed count.
        if self.num_requests is None and self.duration_s is None and self.process.paced_by != "trace":
            self.num_requests = DEFAULT_NUM_REQUESTS
        self._check_schedule_span()
        return self

    def _check_schedule_span(self) -> None:
        """A typo like rate: 0.00001 would hold a run open for years: the expected span is bounded."""
        if self.process.paced_by != "rate" or self.num_requests is None:
            return
        rate = self.process.mean_rate_per_s(self, self.rate if self.sweep is None else self.sweep[0])
        span_s = (self.num_requests + self.warmup_requests) / rate
        if span_s > MAX_SCHEDULE_S:
            field = "load.rate" if self.sweep is None else "load.sweep"
            raise ScenarioError(
                f"{field}: {rate:g} requests/s for {self.num_requests + self.warmup_requests} "
                f"requests spans {span_s:.3g} s, more than the limit of {MAX_SCHEDULE_S:g} s "
                "(7 days); raise the rate or send fewer requests"
            )

    def _check_sweep(self) -> None:
        """A sweep supplies each point's rate (open arrivals) or concurrency (closed), so neither is required."""
        if self.process.paced_by == "trace":
            raise ScenarioError(
                "load.sweep: a trace sets its own pace; leave load.sweep out, or scale the "
                "trace with load.time_scale in separate runs"
            )
        if self.process.paced_by == "concurrency":
            if any(v > MAX_CONCURRENCY for v in self.sweep):
                raise ScenarioError(
                    f"load.sweep: {self.sweep} is not valid: arrival closed sweeps requests in "
                    f"flight, at most the limit of {MAX_CONCURRENCY}"
                )
            if any(not v.is_integer() for v in self.sweep):
                raise ScenarioError(
                    f"load.sweep: {self.sweep} is not valid: arrival closed sweeps requests in "
                    f"flight, so each value must be a whole number, e.g. [1, 4, 16]"
                )
        elif any(v > MAX_RATE_PER_S for v in self.sweep):
            raise ScenarioError(
                f"load.sweep: {self.sweep} is not valid: each rate must be at most the limit of "
                f"{MAX_RATE_PER_S:g} requests/s"
            )


class SloConfig(Strict):
    ttft_ms: float | None = Field(default=None, gt=0, description="milliseconds")
    itl_ms: float | None = Field(default=None, gt=0, description="milliseconds")
    tpot_ms: float | None = Field(default=None, gt=0, description="milliseconds")
    e2e_ms: float | None = Field(default=None, gt=0, description="milliseconds")
    # judge the SLOs on the bound, not the point: a load meets them only when the share of requests within them
    # is at least the attainment with this confidence (harness/metrics/confidence.py; docs/confidence.md)
    confidence: float | None = Field(default=None, gt=0.5, lt=1, description="(a probability, e.g. 0.95)")


FOLDER_SAFE = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Candidate(Strict):
    """One deployment `bench run` compares with the others on the same workload, load and SLOs
    (harness/runs/candidates.py): the scenario with `launch_args` added to backend.launch.args."""

    name: str  # names its folder, OUT/<name>/, and its row in `bench select`
    launch_args: list[str] = []  # e.g. [--data-parallel, 2, --router-policy, cache_aware]
    # accelerators the deployment occupies, for `bench select`'s per-accelerator figures (2 for 2 x DP on GPUs)
    accelerators: int = Field(default=1, ge=1, le=4096)

    @field_validator("launch_args", mode="before")
    @classmethod
    def _numbers_as_text(cls, value: Any) -> Any:
        return numbers_as_text(value)

    @field_validator("name")
    @classmethod
    def _folder_safe(cls, name: str) -> str:
        if not re.match(FOLDER_SAFE, name):
            raise ValueError(
                "must start with a letter or digit and hold only letters, digits, '.', '_' and '-' "
                "(it names the candidate's results folder), e.g. 2xDP-cache_aware"
            )
        return name


class Scenario(Strict):
    name: str
    backend: BackendConfig
    # a factory: validating a WorkloadConfig loads harness.scenario.workload's kinds, which import this module
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    load: LoadConfig
    slo: SloConfig = SloConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    seed: int = Field(default=0, ge=0)  # numpy's seed sequences take no negative numbers
    candidates: list[Candidate] = []  # deployments to compare, each run in turn (`bench select` ranks them)
    tune: TuneConfig | None = None  # what `bench tune` searches (harness/scenario/tuning.py)
    plan: PlanSpec | None = None  # the deployment `bench plan` simulates (harness/scenario/planning.py)

    @field_validator("name")
    @classmethod
    def _folder_safe_name(cls, name: str) -> str:
        # the name becomes results/<name>-<time>/: a '/' or a leading '.' could put it anywhere
        if not re.match(FOLDER_SAFE, name):
            raise ValueError(
                "must start with a letter or digit and hold only letters, digits, '.', '_' and '-' "
                "(it names the results folder)"
            )
        return name

    @model_validator(mode="before")
    @classmethod
    def _tune_sets_the_load(cls, data: Any) -> Any:
        """With tune:, each point's rate (or concurrency) is the search's, so load.rate may be left out: the
        lower bound stands in for it (it is what a plain `bench run` of this scenario would use)."""
        if not isinstance(data, dict) or not isinstance(data.get("tune"), dict):
            return data
        load, tune_load = data.get("load"), data["tune"].get("load")
        if isinstance(tune_load, dict) and {"rate", "concurrency"} <= set(tune_load):
            raise ScenarioError("tune.load: give exactly one of rate or concurrency, e.g. {rate: {min: 0.25, max: 16}}")
        if isinstance(load, dict) and isinstance(tune_load, dict):
            arrival = load.get("arrival", "poisson")
            paced_by = _paced_by(arrival)
            if "concurrency" in tune_load and paced_by not in ("concurrency", None):
                raise ScenarioError(
                    "tune.load.concurrency: searches requests in flight, so set load.arrival: "
                    "closed (or search tune.load.rate)"
                )
            if "rate" in tune_load and paced_by in ("concurrency", "trace"):
                raise ScenarioError(
                    f"tune.load.rate: load.arrival {arrival} has no rate; use "
                    f"tune.load.concurrency for closed, or an open-loop arrival (e.g. poisson)"
                )
            for field in ("rate", "concurrency"):
                bounds = tune_load.get(field)
                if isinstance(bounds, dict) and load.get(field) is None and "min" in bounds:
                    value = bounds["min"]
                    load = {
                        **load,
                        field: int(value)
                        if field == "concurrency" and isinstance(value, float) and value.is_integer()
                        else value,
                    }
            data = {**data, "load": load}
        return data

    @model_validator(mode="after")
    def _workload_fits_load(self) -> Scenario:
        if self.workload.kind == "agentic" or self.load.trace_format == "weka":
            self._check_agentic()
        if self.workload.kind == "multi_turn" and self.load.process.paced_by == "trace":
            raise ScenarioError(
                f"load.arrival: {self.load.arrival} does not combine with workload.kind multi_turn; "
                "use an open-loop arrival (e.g. poisson) or closed"
            )
        if self.candidates:
            if self.backend.launch is None:
                raise ScenarioError(
                    "candidates: each candidate is a deployment bench starts with its launch_args, "
                    "so the backend needs backend.launch (e.g. `launch: {}`), not only backend.url"
                )
            names = [c.name for c in self.candidates]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ScenarioError(
                    f"candidates: the name {twice[0]!r} is given twice; each candidate needs its own "
                    f"name (it names its results folder)"
                )
        if self.tune is not None:
            self._check_tune()
        self._check_api()
        if self.workload.images is not None:
            self._check_images()
        try:
            load_backend(self.backend.kind).sampling_fields(self.backend.api, self.workload.sampling.fields())
        except ValueError as e:
            raise ScenarioError(str(e)) from None
        return self

    def _check_agentic(self) -> None:
        """An agentic session sends chat messages (a system prompt, tool calls and results); a WEKA trace holds
        agentic sessions, which only workload.kind agentic replays."""
        if self.load.trace_format == "weka" and self.workload.kind != "agentic":
            raise ScenarioError(
                f"load.trace_format: weka holds agentic sessions (tool turns, sub-agents); set workload.kind to "
                f"agentic to replay them (kind is {self.workload.kind})"
            )
        if self.backend.api != "chat":
            raise ScenarioError(
                f"backend.api: workload.kind agentic sends chat messages (a system prompt, tool calls and tool "
                f"results); set backend.api to chat (it is {self.backend.api})"
            )

    def _check_api(self) -> None:
        """An embeddings or rerank answer holds no text, so no session can go on from it."""
        api = self.backend.api
        if api in ("embeddings", "rerank") and (self.workload.kind == "multi_turn" or (self.workload.turns or 1) > 1):
            raise ScenarioError(
                f"backend.api: {api} answers carry no text for a next turn; use a single-turn workload "
                f"(workload.kind {self.workload.kind} with turns {self.workload.turns})"
            )

    def _check_images(self) -> None:
        """Images go in a chat message's content parts, on kinds that build one prompt per request."""
        if self.backend.api != "chat":
            raise ScenarioError(
                f"backend.api: workload.images sends image content parts in chat messages; set backend.api to chat "
                f"(it is {self.backend.api})"
            )
        if self.workload.kind not in IMAGE_KINDS:
            raise ScenarioError(
                f"workload.images: only with a workload.kind of one prompt per request ({', '.join(IMAGE_KINDS)}); "
                f"kind is {self.workload.kind}"
            )

    def _check_tune(self) -> None:
        tune, load = self.tune, self.load
        if tune.space and self.backend.launch is None:
            raise ScenarioError(
                "tune.space: each configuration is an engine bench starts with those flags, so the "
                "backend needs backend.launch (e.g. `launch: {}`), not only backend.url"
            )
        if not any(v is not None for k, v in self.slo.model_dump().items() if k != "confidence") and not (
            tune.percentile_slo
        ):
            raise ScenarioError(
                "slo: tune finds the highest load that meets the SLOs, so give at least one "
                "(e.g. slo: {ttft_ms: 2000, tpot_ms: 200}, or tune.percentile_slo: {ttft_ms: {p90: 2000}})"
            )
        if self.candidates or load.sweep is not None:
            field = "candidates" if self.candidates else "load.sweep"
            raise ScenarioError(f"{field}: tune chooses the configurations and loads itself; leave {field} out")
        if load.num_requests is None:
            raise ScenarioError(
                "load.num_requests: tune runs each point for a number of requests; give "
                "load.num_requests instead of load.duration_s"
            )

    def candidate_scenarios(self) -> list[tuple[Candidate, Scenario]]:
        """Each candidate with the scenario it runs: its launch_args after backend.launch.args."""
        out = []
        for c in self.candidates:
            launch = self.backend.launch.model_copy(update={"args": [*self.backend.launch.args, *c.launch_args]})
            backend = self.backend.model_copy(update={"launch": launch})
            out.append((c, self.model_copy(update={"backend": backend, "candidates": []})))
        return out

    def sweep_points(self) -> list[Scenario]:
        """One scenario per load.sweep value, that value as its load.rate (load.concurrency when closed)."""
        load = self.load
        field, cast = ("concurrency", int) if load.process.paced_by == "concurrency" else ("rate", float)
        return [
            self.model_copy(update={"load": load.model_copy(update={"sweep": None, field: cast(v)})})
            for v in load.sweep or ()
        ]

    def resolved_dict(self) -> dict[str, Any]:
        """Every field with defaults filled in and paths made absolute: what run.json records.

        Header values and secret-looking launch env values are redacted: results get shared.
        """
        resolved = self.model_dump(mode="json")
        backend = resolved["backend"]
        backend["headers"] = {name: "<redacted>" for name in backend["headers"]}
        if backend["launch"]:
            env = backend["launch"]["env"]
            for name in env:
                if any(word in name.upper() for word in ("TOKEN", "KEY", "SECRET", "PASSWORD")):
                    env[name] = "<redacted>"
        return resolved


def _paced_by(arrival: Any) -> str | None:
    """What paces the arrival process called `arrival`; None for an unknown one (its field check names it)."""
    try:
        return arrival_process(arrival).paced_by
    except (ArrivalError, TypeError):
        return None


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(f"scenario file {str(path)!r} not found (looked in {path.parent.resolve()})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        line = error.object.count(b"\n", 0, error.start) + 1
        raise ScenarioError(
            f"{path} line {line}: not UTF-8 text (byte {error.object[error.start]:#04x}); save the scenario as UTF-8"
        ) from None
    except yaml.YAMLError as error:
        raise ScenarioError(f"{path}: not valid YAML: {error}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{path}: the top level must be a mapping (name:, backend:, workload:, load:), got {type(data).__name__}"
        )
    data.setdefault("name", path.stem)
    for override in overrides:
        apply_override(data, override)
    try:
        return Scenario.model_validate(data, context={"base_dir": str(path.parent.resolve())})
    except ValidationError as error:
        raise ScenarioError(_describe(error)) from None


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `dotted.path=value` override in place; the value is parsed as YAML (`8`, `true`, `[a, b]`)."""
    key, sep, raw_value = override.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ScenarioError(f"override {override!r}: expected dotted.path=value, e.g. load.rate=8 or slo.ttft_ms=300")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else None
    except yaml.YAMLError as error:
        raise ScenarioError(f"override {override!r}: the value is not valid YAML: {error}") from None
    parts = key.split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        if node.get(part) is None:  # absent, or an empty `slo:` in the YAML
            node[part] = {}
        child = node[part]
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ScenarioError(f"override {override!r}: {where} is {child!r}, not a mapping, so it has no keys")
        node = child
    node[parts[-1]] = value


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the key at `loc` (None past a list); a dict of models (plan.gpus) is looked
    through: `plan.gpus.my-gpu` is a CustomGpu whatever its name."""
    model: Any = Scenario
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        if typing.get_origin(field.annotation) is dict:
            if not parts:
                return None  # the dict itself: its keys are names, not fields
            parts.pop(0)  # the user's own key (a GPU's name): the value's model holds what follows
        candidates = [a for a in (field.annotation, *typing.get_args(field.annotation)) if isinstance(a, type)]
        model = next((a for a in candidates if issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model


def _describe(error: ValidationError) -> str:
    """One line per problem: `path: value is not valid: what is accepted` or `path: unknown key; did you mean`."""
    lines = []
    for item in error.errors():
        loc = tuple(item["loc"])
        path = ".".join(str(part) for part in loc)
        kind = item["type"]
        if kind == "extra_forbidden":
            model = _model_at(loc[:-1])
            known = sorted(model.model_fields) if model else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
            lines.append(f"{path}: unknown key; {hint}")
            continue
        if kind == "missing":
            lines.append(f"{path}: missing; this key is required")
            continue
        message = item["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            message = message.replace("greater than or equal to", ">=").replace("greater than", ">")
            message = message.replace("less than or equal to", "<=").replace("less than", "<")
            model = _model_at(loc[:-1])
            field = model.model_fields.get(loc[-1]) if model else None
            message += f" {field.description}" if field is not None and field.description else ""
        lines.append(f"{path}: {item['input']!r} is not valid: {message}")
    return "\n".join(lines)
