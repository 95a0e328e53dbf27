"""The engine's own Prometheus page, scraped during the run into server_metrics.csv.

Columns `t_s,name,value,labels`: t_s in seconds from the run's t0 (the clock of requests.jsonl),
stamped when the page arrived. Each scrape writes the engine's samples under their own names
(process_/python_/http_ noise and `_created` left out), then the same state in one schema
under `bench:` names, whatever the engine calls it:
  running, waiting                 requests in the batch / queued (vLLM also waiting_capacity, waiting_deferred;
                                   SGLang's waiting adds its grammar queue and the disaggregation queues)
  kv_usage_fraction                0-1 of the KV cache in use
  prefix_cache_hits, prefix_cache_queries
                                   prompt tokens served from the prefix cache / looked up in it (counters); the
                                   same pair on every engine (PREFIX_CACHE), so a window's hit rate is
                                   delta(hits) / delta(queries) everywhere (window_hit_rate)
  prefix_cache_hit_rate            0-1, hits / queries since the engine started (never a last-batch gauge)
  prompt_tokens                    every prompt token, cached ones included (counter)
  preemptions, cached_prompt_tokens, generation_tokens, spec_draft_tokens,
  spec_accepted_tokens, spec_drafts (counters); spec_accept_rate, spec_accept_length (SGLang gauges)
  read_bytes, write_bytes, flops   the engine's estimates (counters) where it offers them; per GPU for vLLM and SGLang
  jump_forward_tokens              output tokens a grammar forced, appended without sampling (counter)
  prefix_cache_blocks, prefix_cache_evictions
                                   KV blocks only the prefix cache holds (gauge) and cached blocks evicted
                                   (counter): the cache's memory cost (native)
  ttft_s_*, itl_s_*, tpot_s_*, e2e_s_*, queue_s_*, prefill_s_*, decode_s_*
                                   engine-side histograms (_bucket with le, _sum, _count)
Label sets (one per model, engine or GPU rank) combine by one rule, combine_label_sets(), which
harness/engine/telemetry/engine_bytes.py uses too: totals add up; fractions and what the engine already gives
per GPU (`*_per_gpu_total`) are averaged, so they stay a fraction and a per-GPU figure.
Behind a router, each replica's page is scraped too and its rows, raw and `bench:`, carry a
`replica="<id>"` label (the router's own rows are its `native_router:` ones). The replicas are
backend.replica_metrics where the scenario names them (any engine behind any router), else those the
router lists (the backend's replicas_path: native's `serve --data-parallel`). A router without a page of
its own (404) leaves only the replicas' rows.
The scraper runs in its own thread with its own HTTP client, so it never delays request timing.
"""

from __future__ import annotations

import csv
import json
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from prometheus_client.parser import text_string_to_metric_families

from backends.http import request
from harness.results.schema import PrefixCache, ServerMetricsStatus, Speculative

# Names as each engine's current source defines them (checked 2026-12):
#   vLLM          vllm/v1/metrics/loggers.py (PrometheusStatLogger), vllm/v1/metrics/perf.py (PerfMetricsProm:
#                 estimated_*_per_gpu_total, one label set per engine), prefix `vllm:`
#   SGLang        python/sglang/srt/observability/metrics_collector.py (SchedulerMetricsCollector,
#                 TokenizerMetricsCollector; stage names in observability/req_time_stats.py), prefix `sglang:`
#   TensorRT-LLM  tensorrt_llm/metrics/collector.py (MetricsCollector), prefix `trtllm_` only
#   llama.cpp     tools/server/server-context.cpp (handle_metrics), prefix `llamacpp:`
#   native        native_engine/metrics.py: vLLM's names under `native:`; its router (native_engine/router.py)
#                 `native_router:`
ENGINE_PREFIXES = ("vllm:", "sglang:", "native:", "native_router:", "llamacpp:", "trtllm_")
SCHEMA = {  # engine's name without its prefix -> schema name
    # vLLM, TensorRT-LLM, native: num_requests_{running,waiting}; SGLang: num_{running,queue}_reqs;
    # llama.cpp: requests_{processing,deferred}
    "num_requests_running": "running",
    "num_running_reqs": "running",
    "requests_processing": "running",
    "num_requests_waiting": "waiting",
    "num_queue_reqs": "waiting",
    "requests_deferred": "waiting",
    # SGLang keeps requests out of num_queue_reqs while their grammar compiles (num_grammar_queue_reqs) and, with
    # prefill/decode disaggregation, while they wait for a bootstrap (prefill prealloc), for decode memory (decode
    # prealloc) or for their KV cache to arrive (decode transfer): all of them wait. The prefill side's inflight
    # queue is not: its prefill is done and the decode side's transfer queue counts it again.
    "num_grammar_queue_reqs": "waiting",
    "num_prefill_prealloc_queue_reqs": "waiting",
    "num_decode_prealloc_queue_reqs": "waiting",
    "num_decode_transfer_queue_reqs": "waiting",
    # vLLM v1: kv_cache_usage_perc (gpu_cache_usage_perc is gone); SGLang: token_usage;
    # TensorRT-LLM: kv_cache_utilization (needs enable_iter_perf_stats); llama.cpp: none any more
    "kv_cache_usage_perc": "kv_usage_fraction",
    "token_usage": "kv_usage_fraction",
    "kv_cache_utilization": "kv_usage_fraction",
    # vLLM: num_preemptions_total; SGLang: num_retracted_requests_total (a counter; the old gauge
    # num_retracted_reqs is a per-interval value, not a total)
    "num_preemptions_total": "preemptions",
    "num_retracted_requests_total": "preemptions",
    "prompt_tokens_total": "prompt_tokens",
    "generation_tokens_total": "generation_tokens",
    "tokens_predicted_total": "generation_tokens",
    # prompt tokens served from the prefix cache: vLLM and llama.cpp prompt_tokens_cached_total,
    # SGLang cached_tokens_total (one label set per cache_source: device, host, storage_<backend>),
    # TensorRT-LLM prompt_cached_tokens_total
    "prompt_tokens_cached_total": "cached_prompt_tokens",
    "cached_tokens_total": "cached_prompt_tokens",
    "prompt_cached_tokens_total": "cached_prompt_tokens",
    # speculative decoding: vLLM and llama.cpp spec_decode_num_{draft,accepted}_tokens_total,
    # TensorRT-LLM the same names (iteration stats); SGLang gauges of the current rate and length
    "spec_decode_num_draft_tokens_total": "spec_draft_tokens",
    "spec_decode_num_accepted_tokens_total": "spec_accepted_tokens",
    "spec_decode_num_drafts_total": "spec_drafts",
    "spec_accept_rate": "spec_accept_rate",
    "spec_accept_length": "spec_accept_length",
    # vLLM and SGLang (--enable-mfu-metrics): estimated_{read,write}_bytes_per_gpu_total, estimated_flops_per_gpu_total;
    # native: weight_bytes_read_total + kv_bytes_read_total, flops_total
    "estimated_read_bytes_per_gpu_total": "read_bytes",
    "weight_bytes_read_total": "read_bytes",
    "kv_bytes_read_total": "read_bytes",
    "estimated_write_bytes_per_gpu_total": "write_bytes",
    "estimated_flops_per_gpu_total": "flops",
    "flops_total": "flops",
    "jump_forward_tokens_total": "jump_forward_tokens",
    # native: the prefix cache's memory (blocks only it holds, a gauge) and its evictions (blocks, a counter)
    "prefix_cache_blocks": "prefix_cache_blocks",
    "prefix_cache_evictions_total": "prefix_cache_evictions",
}
# vLLM's num_requests_waiting_by_reason{reason=capacity|deferred}: one schema row per reason
BY_REASON = {"num_requests_waiting_by_reason": "waiting"}
# The prefix cache in tokens, (hit counters, query counters) by engine prefix, each counted since the engine
# started. SGLang's cache_hit_rate and TensorRT-LLM's kv_cache_hit_rate gauges describe the last batch only
# (SchedulerStats.cache_hit_rate is set per prefill batch), so they stay raw rows and the rate comes from these.
PREFIX_CACHE = {
    "vllm:": (("prefix_cache_hits_total",), ("prefix_cache_queries_total",)),
    "native:": (("prefix_cache_hits_total",), ("prefix_cache_queries_total",)),
    # SGLang and TensorRT-LLM count every prompt token in prompt_tokens_total, the cached ones included
    "sglang:": (("cached_tokens_total",), ("prompt_tokens_total",)),
    "trtllm_": (("prompt_cached_tokens_total",), ("prompt_tokens_total",)),
    # llama.cpp's prompt_tokens_total excludes the cached tokens ("excluding cached tokens")
    "llamacpp:": (("prompt_tokens_cached_total",), ("prompt_tokens_cached_total", "prompt_tokens_total")),
}
# bench:prompt_tokens is every prompt token, the cached ones included, as vLLM, SGLang and TensorRT-LLM count
# them; llama.cpp's prompt_tokens_total leaves the cached ones out, so they are added from this counter
PROMPT_TOKENS_WITHOUT_CACHED = {"llamacpp:prompt_tokens_total": "llamacpp:prompt_tokens_cached_total"}
HISTOGRAMS = {
    "time_to_first_token_seconds": "ttft_s",
    "inter_token_latency_seconds": "itl_s",
    # vLLM v1: request_time_per_output_token_seconds; TensorRT-LLM still time_per_output_token_seconds
    "time_per_output_token_seconds": "tpot_s",
    "request_time_per_output_token_seconds": "tpot_s",
    "e2e_request_latency_seconds": "e2e_s",
    # the phases (docs/metrics.md): vLLM, TensorRT-LLM and native request_{queue,prefill,decode}_time_seconds;
    # SGLang queue_time_seconds, and its prefill in per_stage_req_latency_seconds (STAGES)
    "request_queue_time_seconds": "queue_s",
    "queue_time_seconds": "queue_s",
    "request_prefill_time_seconds": "prefill_s",
    "request_decode_time_seconds": "decode_s",
}
# SGLang's per_stage_req_latency_seconds{stage}: prefill_forward is observed once per request, from its
# first forward to the end of its prefill (SchedulerReqTimeStats.set_prefill_finished_time)
STAGE_HISTOGRAM = "per_stage_req_latency_seconds"
STAGES = {"prefill_forward": "prefill_s"}
FRACTIONS = {"kv_usage_fraction", "prefix_cache_hit_rate", "spec_accept_rate", "spec_accept_length"}
COLUMNS = ("t_s", "name", "value", "labels")


def engine_key(name: str) -> str | None:
    """The sample's name without its engine prefix; None for a name no engine prefix starts."""
    for prefix in ENGINE_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return None


def counter_deltas(csv_path: str | Path, names: tuple[str, ...] = ("jump_forward_tokens",)) -> dict[str, float]:
    """How much each `bench:` counter grew between the first and the last scrape of the run
    (warm-up requests included); counters the engine does not report are left out."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    try:
        with open(csv_path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                key = row["name"].removeprefix("bench:")
                if row["name"].startswith("bench:") and key in names:
                    first.setdefault(key, float(row["value"]))
                    last[key] = float(row["value"])
    except FileNotFoundError:
        return {}
    return {key: last[key] - first[key] for key in last}


RESTART_COUNTERS = ("prompt_tokens", "generation_tokens", "prefix_cache_queries")


def counter_resets(csv_path: str | Path) -> list[str]:
    """The `bench:` counters (with their labels) that went down between two scrapes: counters only grow while
    an engine lives, so one that fell means the engine (or a replica) restarted during the run."""
    last: dict[tuple[str, str], float] = {}
    fell: list[str] = []
    try:
        with open(csv_path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                key = row["name"].removeprefix("bench:")
                if not row["name"].startswith("bench:") or key not in RESTART_COUNTERS:
                    continue
                # every row has COLUMNS' labels; a torn last line leaves it None
                series, value = (key, row["labels"] or ""), float(row["value"])
                if value < last.get(series, value):
                    fell.append(key + (f"{{{series[1]}}}" if series[1] else ""))
                last[series] = value
    except FileNotFoundError:
        return []
    return sorted(set(fell))


def format_labels(labels: dict) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


Rows = list[tuple[str, float, str]]


def combine_label_sets(name: str, values: list[float]) -> float:
    """One value from the label sets (models, engines, GPU ranks, cache sources) of one engine metric: what the
    engine gives per GPU (`*_per_gpu_total`) or as a fraction is averaged, so it stays per GPU or a fraction;
    counts and totals add up. harness/engine/telemetry/engine_bytes.py combines its counters by this rule too."""
    key = engine_key(name) or name
    averaged = "_per_gpu" in key or SCHEMA.get(key) in FRACTIONS
    return sum(values) / len(values) if averaged else sum(values)


def _histogram_row(key: str, labels: dict) -> tuple[str, str] | None:
    """(schema histogram name with its _bucket/_sum/_count suffix, engine metric name) for a histogram sample."""
    if key.startswith(STAGE_HISTOGRAM):  # SGLang's per-stage latencies: only the stages that are a phase
        stage = STAGES.get(labels.get("stage", ""))
        return (stage + key[len(STAGE_HISTOGRAM) :], key + "/" + labels["stage"]) if stage else None
    for engine_name, schema_name in HISTOGRAMS.items():
        suffix = key[len(engine_name) :] if key.startswith(engine_name) else None
        if suffix in ("_bucket", "_sum", "_count"):
            return schema_name + suffix, key
    return None


def prefix_cache_counters(values_by_name: dict[str, list[float]]) -> dict[str, float]:
    """{prefix_cache_hits, prefix_cache_queries[, prefix_cache_hit_rate]} in tokens since the engine started,
    from the PREFIX_CACHE counters of whichever engine wrote the page; {} when it has none."""

    def total(names: list[str]) -> float:
        return sum(combine_label_sets(n, values_by_name[n]) for n in names if n in values_by_name)

    for prefix, (hit_names, query_names) in PREFIX_CACHE.items():
        hits, queries = [prefix + n for n in hit_names], [prefix + n for n in query_names]
        if any(n in values_by_name for n in queries):
            # SGLang creates cached_tokens_total's label set at the first cached token: absent means none yet
            out = {"prefix_cache_hits": total(hits), "prefix_cache_queries": total(queries)}
            if out["prefix_cache_queries"] > 0:
                out["prefix_cache_hit_rate"] = out["prefix_cache_hits"] / out["prefix_cache_queries"]
            return out
    return {}


def parse_page(text: str, extra: dict | None = None) -> tuple[Rows, Rows]:
    """(raw rows, schema rows), each (name, value, labels) from one Prometheus text page; `extra`
    labels (a replica's id) are added to every row."""
    extra = extra or {}
    own = format_labels(extra)  # the labels of a schema row ("" but for a replica's page)
    raw: list[tuple[str, float, str]] = []
    per_metric: dict[tuple[str, str, str], list[float]] = {}  # (schema name, labels, engine metric) -> label sets
    values_by_name: dict[str, list[float]] = {}
    # the parser calls a counter's sample <family>_total even where the page writes it without (llama.cpp's
    # llamacpp:n_tokens_max): the raw rows keep the name the engine wrote
    written = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line[:1] not in ("", "#")}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = family.name if sample.name not in written and family.name in written else sample.name
            key = engine_key(name)
            if key is None or name.endswith("_created"):
                continue
            raw.append((name, sample.value, format_labels({**sample.labels, **extra})))
            values_by_name.setdefault(name, []).append(sample.value)
            if key in SCHEMA:
                per_metric.setdefault((SCHEMA[key], own, name), []).append(sample.value)
            elif key in BY_REASON and "reason" in sample.labels:
                per_metric.setdefault((f"{BY_REASON[key]}_{sample.labels['reason']}", own, name), []).append(
                    sample.value
                )
            histogram = _histogram_row(key, sample.labels)
            if histogram:
                row_name, metric = histogram
                labels = format_labels({"le": sample.labels["le"], **extra} if row_name.endswith("_bucket") else extra)
                per_metric.setdefault((row_name, labels, metric), []).append(sample.value)
    combined: dict[tuple[str, str], list[float]] = {}
    for (schema_name, labels, metric), values in per_metric.items():
        combined.setdefault((schema_name, labels), []).append(combine_label_sets(metric, values))
        cached = PROMPT_TOKENS_WITHOUT_CACHED.get(metric)
        if cached in values_by_name:  # llama.cpp: its cached prompt tokens, counted apart
            combined[(schema_name, labels)].append(combine_label_sets(cached, values_by_name[cached]))
    for schema_name, value in prefix_cache_counters(values_by_name).items():
        combined[(schema_name, own)] = [value]
    schema = []
    for (schema_name, labels), values in combined.items():  # several engine metrics of one schema name add up
        fraction = schema_name in FRACTIONS
        schema.append((f"bench:{schema_name}", sum(values) / len(values) if fraction else sum(values), labels))
    return raw, schema


def read_schema(path: str | Path) -> dict[str, list[tuple[float, float]]]:
    """{bench: name: [(t_s, value), ...]} from a server_metrics.csv (rows without labels)."""
    series: dict[str, list[tuple[float, float]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["name"].startswith("bench:") and not row["labels"]:
                series.setdefault(row["name"], []).append((float(row["t_s"]), float(row["value"])))
    return series


def window_delta(points: list[tuple[float, float]] | None, start_s: float, end_s: float) -> float | None:
    """How much a counter grew over [start_s, end_s]: from the last scrape at or before the start (else the
    first) to the first at or after the end (else the last). None when it was never scraped."""
    if not points:
        return None
    before = [v for t, v in points if t <= start_s]
    after = [v for t, v in points if t >= end_s]
    first = before[-1] if before else points[0][1]
    last = after[0] if after else points[-1][1]
    return last - first


def window_hit_rate(series: dict, start_s: float, end_s: float) -> PrefixCache | None:
    """The prefix cache over the measured window, from read_schema() series: delta(hits) / delta(queries) of
    the bench:prefix_cache_* counters, the same on every engine. None without counters or lookups."""
    hits = window_delta(series.get("bench:prefix_cache_hits"), start_s, end_s)
    queries = window_delta(series.get("bench:prefix_cache_queries"), start_s, end_s)
    if hits is None or not queries:
        return None
    return PrefixCache(
        hit_rate=hits / queries,
        hit_tokens=hits,
        queried_tokens=queries,
        source="engine counters, delta over the measured window",
    )


def window_speculative(series: dict, start_s: float, end_s: float) -> Speculative:
    """Speculative decoding over the measured window, from read_schema() series: drafted and accepted tokens
    and their ratio from counter deltas (vLLM, llama.cpp, native); SGLang exposes only gauges of its recent
    batches, so there the mean of spec_accept_rate over the window's scrapes, marked as such. Empty (no field
    set, `{}` in summary.json) without speculation."""

    def delta(name: str) -> float:
        return window_delta(series.get(f"bench:{name}"), start_s, end_s) or 0.0

    drafted, accepted, drafts = delta("spec_draft_tokens"), delta("spec_accepted_tokens"), delta("spec_drafts")
    if drafted > 0:
        out = Speculative(draft_tokens=int(drafted), accepted_tokens=int(accepted), acceptance_rate=accepted / drafted)
        if drafts > 0:  # conventionally counting the target's own token, as vLLM logs it
            out.drafts, out.mean_acceptance_length = int(drafts), 1 + accepted / drafts
        return out
    rates = [v for t, v in series.get("bench:spec_accept_rate", []) if start_s <= t <= end_s]
    if any(rates):
        return Speculative(
            acceptance_rate=sum(rates) / len(rates), source="mean of the engine's spec_accept_rate gauge"
        )
    return Speculative()


class ServerMetricsScraper(threading.Thread):
    """scraper.start() ... scraper.stop() -> status for run.json. `url` None: nothing to scrape."""

    def __init__(
        self,
        url: str | None,
        t0_ns: int,
        out_path: str | Path,
        interval_s: float = 0.5,
        timeout_s: float = 2.0,
        headers: dict | None = None,
        why_none: str = "",
        missing_page_hint: str = "set backend.metrics_url",
        replicas_url: str | None = None,
        replica_pages: list[tuple[str, str]] | None = None,
    ):
        super().__init__(name="server-metrics", daemon=True)
        self.url, self.t0_ns, self.interval_s, self.timeout_s = url, t0_ns, interval_s, timeout_s
        self.out_path, self.headers, self.why_none = Path(out_path), headers or {}, why_none
        self.missing_page_hint = missing_page_hint
        self.stop_event = threading.Event()
        self.scrapes = self.failures = self.rows = 0
        self.last_error: str | None = None
        self.gave_up: str | None = None
        self.page_listeners: list = []  # f(t_ns, text) per page that arrived, on this thread
        self.replicas_url = replicas_url
        # (id, its metrics URL); None: not known yet (asked of the router at replicas_url)
        self.replica_pages: list[tuple[str, str]] | None = replica_pages or None
        self.replica_failures = 0

    def run(self) -> None:
        try:
            self._scrape_into_file()
        except OSError as e:  # a full disk: the run goes on, run.json's server_metrics says why the file stops short
            self.gave_up = f"writing {self.out_path} failed: {e.strerror or e}"

    def _scrape_into_file(self) -> None:
        with open(self.out_path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            while not self.stop_event.is_set():
                started = time.monotonic()
                self._scrape_once(writer)
                self._scrape_replicas(writer)
                f.flush()
                if self.gave_up and not self.replica_pages:
                    return
                self.stop_event.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
            self._scrape_once(writer)  # the state right after the load
            self._scrape_replicas(writer)

    def _scrape_once(self, writer) -> None:
        if self.url is None or self.gave_up:  # only the replicas' pages (backend.replica_metrics)
            return
        self.scrapes += 1
        try:
            status, body = request(self.url, headers=self.headers, timeout_s=self.timeout_s)
            arrived_ns = time.perf_counter_ns()
            if status >= 400:
                self.failures += 1
                self.last_error = f"HTTP {status}"
                if status == 404 and self.rows == 0:
                    self.gave_up = f"{self.url} answers 404: no Prometheus page there ({self.missing_page_hint})"
                return
            t_s = (arrived_ns - self.t0_ns) / 1e9
            text = body.decode("utf-8", errors="replace")
            raw, schema = parse_page(text)
        except Exception as e:  # a slow or dropped scrape costs one sample, never the run
            self.failures += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return
        rows = [(round(t_s, 6), name, value, labels) for name, value, labels in raw + schema]
        writer.writerows(rows)
        self.rows += len(rows)
        for listener in self.page_listeners:
            listener(arrived_ns, text)

    def _discover_replicas(self) -> list[tuple[str, str]]:
        """The router's replicas, asked until it answers once; [] where there is no router (404)."""
        if self.replica_pages is None and self.replicas_url:
            try:
                status, body = request(self.replicas_url, headers=self.headers, timeout_s=self.timeout_s)
                if status == 404:
                    self.replica_pages = []
                elif status < 400:
                    path = urlparse(self.url).path
                    self.replica_pages = [
                        (str(r["id"]), r["url"].rstrip("/") + path) for r in json.loads(body)["replicas"]
                    ]
            except Exception as e:  # not answering yet: ask again at the next scrape
                self.last_error = f"{self.replicas_url}: {type(e).__name__}: {e}"
        return self.replica_pages or []

    def _scrape_replicas(self, writer) -> None:
        """All replicas' rows get one time stamp (the last page's), so that summing a counter over
        the rows of one t_s gives the deployment's total."""
        rows = []
        for replica, page_url in self._discover_replicas():
            try:
                status, body = request(page_url, headers=self.headers, timeout_s=self.timeout_s)
                if status >= 400:
                    raise OSError(f"HTTP {status}")
                raw, schema = parse_page(body.decode("utf-8", errors="replace"), {"replica": replica})
            except Exception as e:  # a replica that died costs its rows, never the run
                self.replica_failures += 1
                self.last_error = f"replica {replica} ({page_url}): {type(e).__name__}: {e}"
                continue
            rows += raw + schema
        t_s = round((time.perf_counter_ns() - self.t0_ns) / 1e9, 6)
        writer.writerows((t_s, name, value, labels) for name, value, labels in rows)
        self.rows += len(rows)

    def begin(self) -> None:
        if self.url or self.replica_pages:
            self.start()

    def stop(self) -> ServerMetricsStatus:
        """Stops the thread; run.json's `server_metrics`: whether it sampled, with the reason when it did not."""
        if not self.url and not self.replica_pages:
            return ServerMetricsStatus(sampled=False, reason=self.why_none or "no metrics URL")
        self.stop_event.set()
        self.join(self.timeout_s + 5)
        status = ServerMetricsStatus(sampled=self.rows > 0, url=self.url, scrapes=self.scrapes, failures=self.failures)
        if self.rows == 0:
            status.reason = self.gave_up or f"every scrape failed; last: {self.last_error}"
        elif self.failures or self.replica_failures or self.gave_up:
            status.last_error = self.gave_up or self.last_error
        if self.replica_pages:
            status.replicas, status.replica_failures = len(self.replica_pages), self.replica_failures
        return status
