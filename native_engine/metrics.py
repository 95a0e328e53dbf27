"""Prometheus metrics with vLLM's names under a `native:` prefix, in a registry of their own
(so two engines in one process, as in tests, never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from native_engine.sequence import Sequence

# Bucket edges as vLLM uses them, so dashboards for one read the other.
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_KV_TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class EngineMetrics:
    def __init__(self, model_name: str, num_speculative_tokens: int = 0, kv_transfer: bool = False):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        # registered in /metrics' order: the step's gauges and counters, the latency histograms, then the optional
        self._add_step_metrics()
        self._add_latency_histograms()
        if kv_transfer:  # a worker of a disaggregated deployment: the KV handoff's cost, by direction
            self._add_kv_transfer_metrics()
        self._seen_queries = self._seen_hits = self._seen_preemptions = 0
        self._seen_cached = self._seen_recomputed = self._seen_evictions = 0
        if num_speculative_tokens:  # as vLLM: the spec_decode family only when speculation is on
            self._add_spec_decode_metrics(num_speculative_tokens)

    def _gauge(self, name: str, doc: str):
        return Gauge(f"native:{name}", doc, ["model_name"], registry=self.registry).labels(self.model_name)

    def _counter(self, name: str, doc: str):
        return Counter(f"native:{name}", doc, ["model_name"], registry=self.registry).labels(self.model_name)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]):
        family = Histogram(f"native:{name}", doc, ["model_name"], buckets=buckets, registry=self.registry)
        return family.labels(self.model_name)

    def _add_step_metrics(self) -> None:
        gauge, counter = self._gauge, self._counter
        self.num_requests_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage_perc = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = counter("prefix_cache_queries", "Prefix cache queries, in tokens.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.prompt_tokens_cached = counter("prompt_tokens_cached", "Number of cached prompt tokens.")
        self.recomputed_prefill_tokens = counter(
            "recomputed_prefill_tokens",
            "Prefill tokens computed again: their prefix was computed before but "
            "evicted, or the request was preempted (whole blocks).",
        )
        self.prefix_cache_blocks = gauge(
            "prefix_cache_blocks", "KV blocks only the prefix cache holds (cached prefixes no running request uses)."
        )
        self.prefix_cache_evictions = counter(
            "prefix_cache_evictions", "Cached KV blocks evicted to make room for new ones."
        )
        self.num_preemptions = counter("num_preemptions", "Cumulative number of preemptions.")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        self.weight_bytes_read = counter("weight_bytes_read", "Bytes of model weights read by forward passes.")
        self.kv_bytes_read = counter("kv_bytes_read", "Bytes of KV cache read by attention.")
        self.flops = counter("flops", "Floating-point operations done by forward passes.")
        self.jump_forward_tokens = counter(
            "jump_forward_tokens", "Output tokens a grammar forced, appended without sampling (jump-forward)."
        )

    def _add_latency_histograms(self) -> None:
        histogram = self._histogram
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS
        )
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _REQUEST_BUCKETS
        )
        self.request_queue_time = histogram(
            "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _REQUEST_BUCKETS
        )
        self.request_prefill_time = histogram(
            "request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _REQUEST_BUCKETS
        )
        self.request_decode_time = histogram(
            "request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _REQUEST_BUCKETS
        )

    def _add_kv_transfer_metrics(self) -> None:
        r, labels = self.registry, ["model_name", "direction"]
        self.kv_transfer = (
            Counter(
                "native:kv_transfer_bytes",
                "KV-cache bytes handed between prefill and decode workers.",
                labels,
                registry=r,
            ),
            Counter(
                "native:kv_transfer_blocks",
                "KV-cache blocks handed between prefill and decode workers.",
                labels,
                registry=r,
            ),
            Histogram(
                "native:kv_transfer_seconds",
                "Time to copy one prompt's KV blocks from the cache into "
                "the transfer file (send) or from it into the cache (receive).",
                labels,
                buckets=_KV_TRANSFER_BUCKETS,
                registry=r,
            ),
        )
        for family in self.kv_transfer:
            for direction in ("send", "receive"):
                family.labels(self.model_name, direction)

    def _add_spec_decode_metrics(self, num_speculative_tokens: int) -> None:
        counter = self._counter
        self.spec_decode_num_drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.spec_decode_num_draft_tokens = counter("spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_decode_num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        per_pos = Counter(
            "native:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            ["model_name", "position"],
            registry=self.registry,
        )
        self.spec_decode_num_accepted_tokens_per_pos = [
            per_pos.labels(self.model_name, str(pos)) for pos in range(num_speculative_tokens)
        ]

    def record_kv_transfer(self, direction: str, num_bytes: int, num_blocks: int, seconds: float) -> None:
        """One prompt's KV handed off (kv_transfer.py): "send" on a prefill worker, "receive" on a decode worker."""
        counted_bytes, counted_blocks, seconds_histogram = (
            m.labels(self.model_name, direction) for m in self.kv_transfer
        )
        counted_bytes.inc(num_bytes)
        counted_blocks.inc(num_blocks)
        seconds_histogram.observe(seconds)

    def record_step(
        self,
        *,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        queries_tokens: int,
        hits_tokens: int,
        num_preemptions: int,
        prompt_tokens: int,
        generation_tokens: int,
        weight_bytes: int,
        kv_bytes: int,
        flops: int = 0,
    ) -> None:
        self.num_requests_running.set(num_running)
        self.num_requests_waiting.set(num_waiting)
        self.kv_cache_usage_perc.set(kv_usage)
        # The block manager and scheduler keep running totals; the counters take the differences.
        self.prefix_cache_queries.inc(queries_tokens - self._seen_queries)
        self.prefix_cache_hits.inc(hits_tokens - self._seen_hits)
        self.num_preemptions.inc(num_preemptions - self._seen_preemptions)
        self._seen_queries, self._seen_hits = queries_tokens, hits_tokens
        self._seen_preemptions = num_preemptions
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        self.weight_bytes_read.inc(weight_bytes)
        self.kv_bytes_read.inc(kv_bytes)
        self.flops.inc(flops)

    def record_prefix_cache(
        self, cached_prompt_tokens: int, recomputed_tokens: int, cached_blocks: int = 0, evictions: int = 0
    ) -> None:
        """Running totals from the scheduler and block manager; the counters take the differences."""
        self.prompt_tokens_cached.inc(cached_prompt_tokens - self._seen_cached)
        self.recomputed_prefill_tokens.inc(recomputed_tokens - self._seen_recomputed)
        self.prefix_cache_evictions.inc(evictions - self._seen_evictions)
        self.prefix_cache_blocks.set(cached_blocks)
        self._seen_cached, self._seen_recomputed = cached_prompt_tokens, recomputed_tokens
        self._seen_evictions = evictions

    def record_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One verified draft: num_accepted_tokens of its num_draft_tokens were kept (bonus token not counted)."""
        self.spec_decode_num_drafts.inc()
        self.spec_decode_num_draft_tokens.inc(num_draft_tokens)
        self.spec_decode_num_accepted_tokens.inc(num_accepted_tokens)
        for pos in range(num_accepted_tokens):
            self.spec_decode_num_accepted_tokens_per_pos[pos].inc()

    def record_finished(self, seq: Sequence, now_s: float) -> None:
        self.e2e_request_latency.observe(now_s - seq.arrival_s)
        if seq.scheduled_s is not None:
            self.request_queue_time.observe(seq.scheduled_s - seq.arrival_s)
            if seq.first_token_s is not None:
                self.request_prefill_time.observe(seq.first_token_s - seq.scheduled_s)
                self.request_decode_time.observe(now_s - seq.first_token_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
